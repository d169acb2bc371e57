package spritesdoor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/doors/spritesdoor"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// SDK is the vendor's client the door is checked against.
const SDK = "@fly/sprites@0.1.0"

// start runs a platform on the local provider (jail as root, else
// trusted) with the door mounted at /sprites; it returns the door's URL,
// a key, the platform, and the filesystem base a script may use (inside
// the jail; under trusted a scratch directory, for tests whose commands
// touch no file).
func start(t testing.TB) (string, string, *apitest.Platform, string) {
	t.Helper()
	mech, base := "trusted", t.TempDir()
	if os.Geteuid() == 0 {
		mech, base = "jail", "/home/sprite"
	}
	lp, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: mech})
	if err != nil {
		t.Fatal(err)
	}
	p := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": lp}, Env: map[string]string{"SANDBOX_PROVIDER": "local"}})
	d, err := spritesdoor.New(spritesdoor.Options{API: p.API, Prefix: "/sprites"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d)
	t.Cleanup(func() { ts.Close(); _ = d.Close() })
	return ts.URL + "/sprites", p.Account(t, "acme"), p, base
}

// TestSDK runs testdata/door.mjs (the Sprites SDK) against the door over a
// real platform on the local provider and asserts every call.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, SDK)
	rt, err := nodesdk.Find()
	if err != nil {
		t.Fatal(err)
	}
	probe := exec.Command(rt.Node, "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)")
	probe.Env = append(os.Environ(), "NODE_OPTIONS=--experimental-websocket")
	out, err := probe.CombinedOutput()
	testenv.Require(t, err == nil, fmt.Sprintf("@fly/sprites needs a Node with a global WebSocket: %v %s", err, out))
	// The script's filesystem calls are shell commands in the sandbox: on
	// the trusted mechanism they would run on this host, so the jail (root)
	// is required.
	testenv.Require(t, os.Geteuid() == 0, "TestSDK's filesystem calls need the jail (root): on trusted they would act on the host")
	url, key, p, base := start(t)
	res := sdk.Run(t, "testdata/door.mjs", nodesdk.Options{Env: map[string]string{
		"SPRITES_URL": url, "SPRITES_TOKEN": key, "FS_BASE": base, "NODE_OPTIONS": "--experimental-websocket",
	}, Timeout: 3 * time.Minute})
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
	if !res.Done || res.ExitCode != 0 {
		t.Errorf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	eq := func(name string, want any) {
		t.Helper()
		c := res.Call(t, name)
		if !c.OK {
			t.Errorf("%s threw %s", name, c.Err())
			return
		}
		var got, w any
		_ = json.Unmarshal(c.Raw, &got)
		b, _ := json.Marshal(want)
		_ = json.Unmarshal(b, &w)
		if !reflect.DeepEqual(got, w) {
			t.Errorf("%s = %s, want %s", name, c.Raw, b)
		}
	}
	running := map[string]any{"name": "door-a", "status": "running", "id": "string"}
	eq("create", running)
	eq("create other", map[string]any{"name": "door-b", "status": "running", "id": "string"})
	eq("create duplicate", map[string]any{"name": "APIError", "status": 409, "code": "already_exists"})
	eq("get", running)
	eq("get missing", map[string]any{"name": "APIError", "status": 404, "code": "not_found"})
	eq("list", map[string]any{"names": []string{"door-a", "door-b"}, "hasMore": false})
	eq("list paged", []any{[]string{"door-a"}, true, []string{"door-b"}, false})
	eq("listAllSprites", []string{"door-a", "door-b"})
	eq("bad token", map[string]any{"name": "APIError", "status": 401, "code": "unauthorized"})

	eq("exec", map[string]any{"stdout": "hello world\n", "stderr": "", "exitCode": 0})
	eq("execFile exit code", map[string]any{"name": "ExecError", "exitCode": 3, "stdout": "out\n", "stderr": "err\n"})
	eq("execFile env cwd", map[string]any{"stdout": "from-env\n/tmp\n", "exitCode": 0})
	var streamed struct {
		Chunks         int
		Stdout, Stderr string
		Code           int
	}
	res.Call(t, "spawn streaming").Value(t, &streamed)
	if streamed.Chunks < 3 || streamed.Stdout != "line1\nline2\nline3\n" || streamed.Stderr != "bad\n" || streamed.Code != 5 {
		t.Errorf("spawn streaming = %+v", streamed)
	}
	eq("spawn stdin", map[string]any{"out": "piped through\n", "code": 0})
	// The SDK reads a TTY's exit from the socket's close code alone (1000
	// is 0, anything else 1); the exit message carries the code itself.
	eq("tty", map[string]any{"out": "30 100", "code": 1, "exit": 4, "zero": 0})
	eq("listSessions", map[string]any{"id": "string", "command": true, "tty": false})
	eq("attachSession", map[string]any{"out": "first\nsecond\n", "code": 7})
	eq("spawner exit", 7)
	eq("attach unknown", "Error")
	eq("killSession", map[string]any{"events": []string{"signal", "exited", "complete"}, "code": 137})

	eq("execFileHTTP", map[string]any{"stdout": "http-out\n", "stderr": "http-err\n", "exitCode": 0})
	eq("execFileHTTP stdin", "from stdin")
	eq("execFileHTTP exit code", map[string]any{"name": "ExecError", "exitCode": 9, "stdout": "partial\n", "stderr": ""})

	eq("signal", map[string]any{"code": 42, "out": "ready\ngot-term\n"})
	eq("resize", true)
	eq("createSession", map[string]any{"code": 0, "out": true, "tty": true})
	eq("maxRunAfterDisconnect", map[string]any{"before": true, "stillRunning": true, "ended": true, "tookAtLeastGrace": true})
	eq("network policy", map[string]any{"got": []map[string]any{{"domain": "example.com", "action": "allow"}, {"domain": "*", "action": "deny"}}, "refused": true})

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
	eq("readdir recursive", []string{"a.txt", "sub", "sub/deep"})
	eq("stat", map[string]any{"size": 4, "mode": 0o600, "dir": false, "file": true})
	eq("exists", []bool{true, false})
	eq("rename", []any{false, "hello sprite\n"})
	eq("copyFile", "hello sprite\n")
	eq("chmod", 0o640)
	eq("rm", false)
	eq("rm non-empty dir", map[string]any{"name": "FilesystemError", "code": "ENOTEMPTY"})
	eq("rm recursive", []string{"renamed.txt"})
	var svc struct{ Error string }
	res.Call(t, "services").Value(t, &svc)
	if !strings.Contains(svc.Error, "501") || !strings.Contains(svc.Error, "not_supported") {
		t.Errorf("services = %+v", svc)
	}
	eq("writeJSON readJSON appendFile", map[string]any{"json": map[string]any{"a": 1}, "log": "one\ntwo\n"})
	eq("chown", map[string]any{"same": true, "missing": "ENOENT"})
	eq("fs watch", true)
	// Checkpoints are the platform's (the local provider has them).
	eq("createCheckpoint", []string{"info", "complete"})
	eq("listCheckpoints", []string{"string"})
	eq("restoreCheckpoint", map[string]any{"got": true, "events": []string{"info", "complete"}, "kept": "before\n", "later": false})
	eq("restore unknown", []string{"info", "error"})

	eq("updateSprite", map[string]any{"auth": "public", "labels": []string{"team-a"}, "updated": []string{"team-a"}})
	for _, n := range []string{"restart", "check", "upgrade"} {
		eq(n, map[string]any{"name": "APIError", "status": 501, "code": "not_supported"})
	}
	eq("privileges policy", true)

	eq("delete", nil)
	eq("get deleted", map[string]any{"name": "APIError", "status": 404, "code": "not_found"})
	eq("delete other", nil)
	eq("list after delete", []string{})
	// The door's sprites are the platform's rows: the delete went through.
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/door-a", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
		t.Errorf("/v1 get of the deleted sprite: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestRefusals: bad tokens, unknown sprites and sessions, malformed and
// oversized bodies and what the door does not support, each in Sprites'
// shape; a sandbox made through /v1 is a sprite of the door.
func TestRefusals(t *testing.T) {
	url, key, p, _ := start(t)
	do := func(method, path, k, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		return resp.StatusCode, v
	}
	check := func(what string, st int, v map[string]any, wantSt int, wantCode string) {
		t.Helper()
		if st != wantSt || v["error"] != wantCode || v["message"] == nil {
			t.Errorf("%s: %d %v, want %d {error: %s, message}", what, st, v, wantSt, wantCode)
		}
	}
	st, v := do("GET", "/v1/sprites", "mgk_bad", "")
	check("bad token", st, v, 401, "unauthorized")
	st, v = do("GET", "/v1/sprites", "", "")
	check("no token", st, v, 401, "unauthorized")
	st, v = do("GET", "/v1/sprites/nosuch", key, "")
	check("unknown sprite", st, v, 404, "not_found")
	st, v = do("GET", "/v1/sprites/nosuch/exec", key, "")
	check("unknown sprite's sessions", st, v, 404, "not_found")
	st, v = do("POST", "/v1/sprites/nosuch/exec?cmd=true", key, "")
	check("unknown sprite's HTTP exec", st, v, 404, "not_found")
	if v["message"] != "sprite not found" {
		t.Errorf("unknown sprite's HTTP exec: %v", v)
	}
	st, v = do("POST", "/v1/sprites", key, "{not json")
	check("malformed", st, v, 400, "invalid_request")
	st, v = do("POST", "/v1/sprites", key, `{"name":"`+strings.Repeat("x", 2<<20)+`"}`)
	check("oversized", st, v, 413, "request_too_large")
	st, v = do("POST", "/v1/sprites", key, `{"name":"../etc"}`)
	check("bad name", st, v, 400, "invalid_request")

	// A sandbox made through /v1 is a sprite of the door, and the door's
	// sprite a row of /v1.
	req, _ := http.NewRequest("POST", p.URL+"/v1/sandboxes", strings.NewReader(`{"name":"from-v1"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("/v1 create: %v %v", resp, err)
	}
	resp.Body.Close()
	st, v = do("GET", "/v1/sprites?prefix=from-", key, "")
	if ss, _ := v["sprites"].([]any); st != 200 || len(ss) != 1 || ss[0].(map[string]any)["name"] != "from-v1" {
		t.Errorf("the door's listing of a /v1 sandbox: %d %v", st, v)
	}
	st, _ = do("POST", "/v1/sprites", key, `{"name":"door-made"}`)
	if st != 201 {
		t.Fatalf("create: %d", st)
	}
	req, _ = http.NewRequest("GET", p.URL+"/v1/sandboxes/door-made", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("/v1 get of the door's sprite: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	// The exec WebSocket's handshake with a bad token is refused before
	// any upgrade, in the same shape.
	req, _ = http.NewRequest("GET", url+"/v1/sprites/door-made/exec?cmd=true", nil)
	for h, val := range map[string]string{"Authorization": "Bearer mgk_bad", "Connection": "Upgrade", "Upgrade": "websocket",
		"Sec-WebSocket-Version": "13", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} {
		req.Header.Set(h, val)
	}
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		var v map[string]any
		_ = json.NewDecoder(resp.Body).Decode(&v)
		resp.Body.Close()
		check("exec handshake with a bad token", resp.StatusCode, v, 401, "unauthorized")
	}
	st, v = do("POST", "/v1/sprites/door-made/exec/nosuch/kill", key, "")
	check("unknown session", st, v, 404, "not_found")
	for _, path := range []string{"/v1/sprites/door-made/services", "/v1/sprites/door-made/policy/privileges", "/v1/sprites/door-made/fs/watch"} {
		st, v = do("GET", path, key, "")
		check(path, st, v, 501, "not_supported")
	}
	st, v = do("POST", "/v1/sprites/door-made/fs/rename", key, `{"source":`)
	check("malformed rename", st, v, 400, "invalid_request")
	st, v = do("DELETE", "/v1/sprites/door-made/fs/delete?path=/&workingDir=/", key, "")
	if st != 400 || v["code"] != "EINVAL" {
		t.Errorf("rm /: %d %v", st, v)
	}
	for _, n := range []string{"door-made", "from-v1"} {
		if st, _ := do("DELETE", "/v1/sprites/"+n, key, ""); st != 204 {
			t.Errorf("delete %s: %d", n, st)
		}
	}
}

// TestHTTPExecStdinCut: an HTTP exec whose command ends while its stdin is
// still being sent answers its exit and is done, with the body's sender
// still open and silent (the copy of stdin is cut short, nothing is left
// behind).
func TestHTTPExecStdinCut(t *testing.T) {
	url, key, _, _ := start(t)
	req, _ := http.NewRequest("POST", url+"/v1/sprites", strings.NewReader(`{"name":"cut"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 201 {
		t.Fatalf("create: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	pr, pw := io.Pipe()
	defer pw.Close()
	// The body's sender sends nothing and never ends it.
	req, _ = http.NewRequest("POST", url+"/v1/sprites/cut/exec?cmd=sh&cmd=-c&cmd=exit+6&stdin=true", pr)
	req.Header.Set("Authorization", "Bearer "+key)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || len(b) < 2 || b[len(b)-2] != 3 || b[len(b)-1] != 6 {
		t.Fatalf("answer %q, %v; want it to end with the exit frame 3, 6", b, err)
	}
}
