package spritestest_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/sprites/spritestest"
)

// SDK is the vendor's client the fake is checked against.
const SDK = "@fly/sprites@0.1.0"

// TestSDK runs sdk/sprites.mjs, written from the SDK's public API only,
// against the fake and asserts every call's result: the fake serves what
// @fly/sprites@0.1.0 sends.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, SDK)
	// The SDK needs Node's global WebSocket: Node 22, or 20.10 and later
	// with the flag; Debian 12's Node 18 has none.
	rt, err := nodesdk.Find()
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(rt.Node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)")
	probe.Env = append(os.Environ(), "NODE_OPTIONS=--experimental-websocket")
	out, err := probe.CombinedOutput()
	testenv.Require(t, err == nil, fmt.Sprintf("@fly/sprites needs a Node with a global WebSocket (22, or 20.10+ with --experimental-websocket): %v %s", err, out))
	srv := spritestest.NewServer(spritestest.Options{})
	defer srv.Close()
	res := sdk.Run(t, "sdk/sprites.mjs", nodesdk.Options{Env: map[string]string{
		"SPRITES_URL": srv.URL, "SPRITES_TOKEN": srv.Token, "SDK_PREFIX": "sdk",
		// The SDK uses Node's global WebSocket: flagged before Node 22.
		"NODE_OPTIONS": "--experimental-websocket",
	}, Timeout: 3 * time.Minute})
	if t.Failed() || res.ExitCode != 0 || !res.Done {
		logCalls(t, res)
		t.Fatalf("script exit %d done %v timed out %v\n%s", res.ExitCode, res.Done, res.TimedOut, tail(res.Stderr))
	}
	defer func() {
		if t.Failed() {
			logCalls(t, res)
		}
	}()
	eq := func(name string, want any) {
		t.Helper()
		c := res.Call(t, name)
		if !c.OK {
			t.Errorf("%s: threw %s", name, c.Err())
			return
		}
		w, _ := json.Marshal(want)
		var a, b any
		_ = json.Unmarshal(c.Raw, &a)
		_ = json.Unmarshal(w, &b)
		if !reflect.DeepEqual(a, b) {
			t.Errorf("%s = %s, want %s", name, c.Raw, w)
		}
	}
	threw := func(name, class, msg string) {
		t.Helper()
		c := res.Call(t, name)
		if c.OK {
			t.Errorf("%s: returned %s, want %s", name, c.Raw, class)
			return
		}
		if c.Error.Name != class || !strings.Contains(c.Error.Message, msg) {
			t.Errorf("%s: threw %s, want %s containing %q", name, c.Err(), class, msg)
		}
	}
	eq("create", map[string]any{"name": "sdk-a", "status": "running", "id": "string"})
	eq("create other", map[string]any{"name": "sdk-b", "status": "running", "id": "string"})
	threw("create duplicate", "APIError", "already exists")
	eq("get", map[string]any{"name": "sdk-a", "status": "running", "id": "string"})
	threw("get missing", "APIError", "sprite not found")
	eq("list", map[string]any{"names": []string{"sdk-a", "sdk-b"}, "hasMore": false})
	eq("list paged", []any{[]string{"sdk-a"}, true, []string{"sdk-b"}, false})
	eq("listAllSprites", []string{"sdk-a", "sdk-b"})

	eq("exec", map[string]any{"stdout": "hello world\n", "stderr": "", "exitCode": 0})
	eq("execFile exit code", map[string]any{"name": "ExecError", "exitCode": 3, "stdout": "out\n", "stderr": "err\n"})
	eq("execFile env cwd", map[string]any{"stdout": "from-env\n/tmp\n", "exitCode": 0})
	var streamed struct {
		Chunks         int
		Stdout, Stderr string
		Code           int
	}
	res.Call(t, "spawn streaming").Value(t, &streamed)
	// Three lines 200 ms apart arrive as they are written, not at the end.
	if streamed.Chunks < 3 || streamed.Stdout != "line1\nline2\nline3\n" || streamed.Stderr != "bad\n" || streamed.Code != 5 {
		t.Errorf("spawn streaming = %+v", streamed)
	}
	eq("spawn stdin", map[string]any{"out": "piped through\n", "code": 0})
	eq("listSessions", map[string]any{"id": "string", "command": true, "tty": false})
	eq("attachSession", map[string]any{"out": "first\nsecond\n", "code": 7})
	eq("spawner exit", 7)
	eq("killSession", 137)

	eq("execFileHTTP", map[string]any{"stdout": "http-out\n", "stderr": "http-err\n", "exitCode": 0})
	eq("execFileHTTP stdin", "from stdin")
	eq("execFileHTTP exit code", map[string]any{"name": "ExecError", "exitCode": 9, "stdout": "partial\n", "stderr": ""})

	eq("writeFile", nil)
	eq("writeFile bytes", nil)
	eq("readFile utf8", "hello sprite\n")
	if b, err := nodesdk.Bytes(res.Call(t, "readFile bytes").Raw); err != nil || string(b) != "\x00\x01\x02\xff" {
		t.Errorf("readFile bytes = %q, %v", b, err)
	}
	eq("readFile missing", map[string]any{"name": "FilesystemError", "code": "ENOENT", "syscall": "read"})
	eq("mkdir", nil)
	eq("readdir", []string{"a.txt", "sub"})
	eq("readdir withFileTypes", []map[string]any{{"name": "a.txt", "dir": false, "file": true}, {"name": "sub", "dir": true, "file": false}})
	eq("stat", map[string]any{"size": 4, "mode": 0o600, "dir": false, "file": true})
	eq("exists", []bool{true, false})
	eq("rename", []any{false, "hello sprite\n"})
	eq("copyFile", "hello sprite\n")
	eq("chmod", 0o640)
	eq("rm", false)
	eq("rm non-empty dir", map[string]any{"name": "FilesystemError", "code": "ENOTEMPTY"})
	eq("rm recursive", []string{"renamed.txt"})

	eq("delete", nil)
	threw("get deleted", "APIError", "sprite not found")
	eq("delete other", nil)
	eq("list after delete", []string{})
}

func logCalls(t *testing.T, res *nodesdk.Result) {
	t.Helper()
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
}

func tail(b []byte) string {
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}
