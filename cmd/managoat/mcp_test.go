package main

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

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

// bearerRT adds an API key to each request.
type bearerRT struct{ key string }

func (b bearerRT) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPServeGoClient: the Go SDK's own client on serve's /mcp over
// Streamable HTTP: tools, create, python3 42, destroy; the session's end
// (the client's DELETE) leaves the account no sandbox.
func TestMCPServeGoClient(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	managoatEnv(t, base, "serve", "admin", "account", "create", "carol")
	out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "carol")
	if code != 0 {
		t.Fatal(e)
	}
	key := strings.TrimSpace(out)
	startServe(t, base, addr)
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+key)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if _, _, code := managoatEnv(t, as, "ls"); code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("serve did not come up")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1"}, nil)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + addr + "/mcp", HTTPClient: &http.Client{Transport: bearerRT{key}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
	if err != nil || res.IsError {
		t.Fatalf("create: %v %+v", err, res)
	}
	name := res.StructuredContent.(map[string]any)["name"].(string)
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"sandbox": name, "argv": []string{"python3", "-c", "print(6*7)"}}})
	if err != nil || res.IsError || res.StructuredContent.(map[string]any)["stdout"] != "42\n" {
		t.Fatalf("run: %v %+v", err, res)
	}
	if out, _, _ := managoatEnv(t, as, "ls", "-q"); !strings.Contains(out, name) {
		t.Fatalf("the account does not list %s: %q", name, out)
	}
	cs.Close()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		out, _, _ := managoatEnv(t, as, "ls", "-q")
		if !strings.Contains(out, name) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there after the session ended", name)
		}
	}
}
