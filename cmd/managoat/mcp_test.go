package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
)

// tsSDK is the official TypeScript MCP client, pinned.
const tsSDK = "@modelcontextprotocol/sdk@1.32.2"

// checkTSClient judges what testdata/mcp/client.mjs reported.
func checkTSClient(t *testing.T, res *nodesdk.Result) {
	t.Helper()
	var tools []string
	res.Call(t, "list tools").Value(t, &tools)
	if len(tools) != 11 || !strings.Contains(strings.Join(tools, ","), "sandbox_create") {
		t.Fatalf("tools %v", tools)
	}
	var py struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
	}
	res.Call(t, "python").Value(t, &py)
	if py.Stdout != "42\n" || py.ExitCode != 0 {
		t.Fatalf("python3: %+v", py)
	}
	var rd struct{ Content string }
	res.Call(t, "read").Value(t, &rd)
	if rd.Content != "from node\n" {
		t.Fatalf("read %+v", rd)
	}
	var st struct {
		Result   struct{ Stdout string }
		Progress []string
	}
	res.Call(t, "stream").Value(t, &st)
	if st.Result.Stdout != "line1\nline2\nline3\n" || !strings.Contains(strings.Join(st.Progress, ""), "line1") || len(st.Progress) < 2 {
		t.Fatalf("stream %+v", st)
	}
	var uf struct {
		IsError bool
		Text    string
	}
	res.Call(t, "unknown field").Value(t, &uf)
	if !uf.IsError || !strings.Contains(uf.Text, `"kind":"invalid"`) {
		t.Fatalf("unknown field: %+v", uf)
	}
	res.Call(t, "destroy").Value(t, nil)
	if !res.Done {
		t.Fatalf("script did not finish: %s", res.Stderr)
	}
}

// TestMCPStdioTypeScriptClient: the official TypeScript client runs
// `managoat mcp` over stdio on the local provider (jail).
func TestMCPStdioTypeScriptClient(t *testing.T) {
	testenv.RequireRoot(t)
	sdk := nodesdk.Setup(t, tsSDK)
	home := t.TempDir()
	res := sdk.Run(t, filepath.Join("testdata", "mcp", "client.mjs"), nodesdk.Options{Timeout: 3 * time.Minute,
		Env: map[string]string{"MODE": "stdio", "MANAGOAT_BIN": binary, "MANAGOAT_HOME": home, "MANAGOAT_CONFIG": "/nonexistent/managoat-test-config"}})
	checkTSClient(t, res)
	// The session ended with the client: nothing is left.
	out, _, _ := runBinary(t, nil, []string{"MANAGOAT_HOME=" + home}, "ls", "-q")
	if strings.TrimSpace(out) != "" {
		t.Fatalf("left after the client closed: %q", out)
	}
}

// TestMCPServeTypeScriptClient: the TypeScript client on serve's /mcp
// over Streamable HTTP with an account's key; another account's key on
// that session is refused, and so is a wrong key.
func TestMCPServeTypeScriptClient(t *testing.T) {
	testenv.RequireRoot(t)
	sdk := nodesdk.Setup(t, tsSDK)
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	keys := map[string]string{}
	for _, who := range []string{"alice", "bob"} {
		if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", who); code != 0 {
			t.Fatalf("account create: %s", e)
		}
		out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", who)
		if code != 0 {
			t.Fatalf("key create: %s", e)
		}
		keys[who] = strings.TrimSpace(out)
	}
	startServe(t, base, addr)
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, _, code := managoatEnv(t, append(base, "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+keys["alice"]), "ls")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("serve did not come up")
		}
		time.Sleep(100 * time.Millisecond)
	}
	res := sdk.Run(t, filepath.Join("testdata", "mcp", "client.mjs"), nodesdk.Options{Timeout: 3 * time.Minute,
		Env: map[string]string{"MODE": "http", "MCP_URL": "http://" + addr + "/mcp", "MCP_KEY": keys["alice"], "OTHER_KEY": keys["bob"]}})
	checkTSClient(t, res)
	if c := res.Call(t, "other account"); c.OK || !strings.Contains(c.Err(), "session user mismatch") {
		t.Fatalf("bob's key on alice's session was not refused as forbidden: %s %s", c.Raw, c.Err())
	}
	if c := res.Call(t, "bad key"); c.OK || !strings.Contains(c.Err(), "unauthorized") {
		t.Fatalf("a wrong key: %s %s", c.Raw, c.Err())
	}
	var l struct{ Sandboxes []json.RawMessage }
	res.Call(t, "list").Value(t, &l)
	if len(l.Sandboxes) != 1 {
		t.Fatalf("list %+v", l)
	}
}
