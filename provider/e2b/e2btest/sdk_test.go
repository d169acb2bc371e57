package e2btest_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/provider/e2b/e2btest"
)

// SDKPackage is the E2B SDK the fake is checked against.
const SDKPackage = "e2b@2.51.0"

// TestSDK runs E2B's own SDK (sdk/e2b.mjs, public API only) against the
// fake playing the current service, and asserts every call's result: a
// fake that drifts from what the SDK sends or reads fails here.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, SDKPackage)
	srv := e2btest.NewServer(e2btest.Options{MaxPage: 100})
	defer srv.Close()
	res := sdk.Run(t, "sdk/e2b.mjs", nodesdk.Options{
		Env: map[string]string{
			"E2B_API_URL": srv.APIURL(), "E2B_SANDBOX_URL": srv.SandboxURL(), "E2B_API_KEY": srv.APIKey(),
		},
		Timeout: 3 * time.Minute,
	})
	if testing.Verbose() {
		for _, c := range res.Calls {
			t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
		}
	}
	if !res.Done || res.ExitCode != 0 {
		t.Errorf("script exit %d, done %v, timed out %v\nstderr:\n%s", res.ExitCode, res.Done, res.TimedOut, res.Stderr)
	}
	check := sdkChecker{t: t, res: res}

	var created struct{ SandboxID string }
	check.value("create", &created)
	var second, third struct{ SandboxID string }
	check.value("create second", &second)
	check.value("create third", &third)
	if created.SandboxID == "" || second.SandboxID == "" || third.SandboxID == "" {
		t.Fatalf("create gave no ids: %q %q %q", created.SandboxID, second.SandboxID, third.SandboxID)
	}

	// Paging: three sandboxes of the suite, two a page, newest first.
	var pages [][]struct{ SandboxID, N, State, TemplateID string }
	check.value("list paged", &pages)
	if len(pages) != 2 || len(pages[0]) != 2 || len(pages[1]) != 1 {
		t.Errorf("list paged = %+v, want pages of 2 and 1", pages)
	} else {
		var ns []string
		for _, p := range pages {
			for _, s := range p {
				ns = append(ns, s.N)
				if s.State != "running" || s.TemplateID != "base" {
					t.Errorf("listed %+v", s)
				}
			}
		}
		if !slices.Equal(ns, []string{"3", "2", "1"}) {
			t.Errorf("listed n = %v, want 3 2 1 (newest first)", ns)
		}
	}
	check.equal("list filtered", []string{second.SandboxID})
	check.equal("list running", 3)

	var info struct {
		SandboxID, TemplateID, State, EnvdVersion string
		Metadata                                  map[string]string
		TTLSeconds                                int
	}
	check.value("getInfo", &info)
	if info.SandboxID != created.SandboxID || info.TemplateID != "base" || info.State != "running" ||
		info.Metadata["n"] != "1" || info.Metadata["suite"] == "" || info.TTLSeconds < 100 || info.TTLSeconds > 120 || info.EnvdVersion == "" {
		t.Errorf("getInfo = %+v", info)
	}
	var ttl struct{ TTLSeconds int }
	check.value("setTimeout", &ttl)
	if ttl.TTLSeconds < 580 || ttl.TTLSeconds > 600 {
		t.Errorf("after setTimeout(600 s) the TTL is %d s", ttl.TTLSeconds)
	}
	check.equal("isRunning", true)
	check.equal("connect", map[string]any{"sandboxId": created.SandboxID, "stdout": "connected\n"})

	check.equal("run", map[string]any{"exitCode": 0, "stdout": "out\nfrom-create\n", "stderr": "err\n",
		"streamedOut": "out\nfrom-create\n", "streamedErr": "err\n"})
	var nonzero struct {
		Threw              string
		IsCommandExitError bool
	}
	check.value("run nonzero", &nonzero)
	if nonzero.Threw != "CommandExitError" || !nonzero.IsCommandExitError {
		t.Errorf("run nonzero = %+v, want CommandExitError", nonzero)
	}
	check.equal("run nonzero detail", map[string]any{"exitCode": 3, "stdout": "partial\n"})
	check.equal("makeDir for cwd", true)
	check.equal("cwd and envs", map[string]any{"stdout": "bar\nfrom-create\n", "inCwd": "here\n"})
	check.equal("background kill list", map[string]any{"listed": true, "killed": true, "waitThrew": "CommandExitError",
		"waitIsExit": true, "gone": true, "killAgain": false})
	check.equal("sendStdin", "got:hello\n")
	check.equal("closeStdin", "to cat")
	check.equal("commands.connect", map[string]any{"stdout": "late:now\n", "streamed": "late:now\n"})
	check.threw("run timeout", "TimeoutError", "isTimeoutError")

	check.equal("pty", map[string]any{"exitCode": 0, "sawFirst": true, "sawResized": true})

	check.equal("write text", map[string]any{"name": "hello.txt", "path": "/home/user/notes/hello.txt", "type": "file"})
	check.equal("read text", "hello, world\n")
	check.equal("write bytes", map[string]any{"name": "data.bin", "path": "/home/user/notes/data.bin"})
	b, err := nodesdk.Bytes(res.Call(t, "read bytes").Raw)
	if err != nil || len(b) != 256 {
		t.Errorf("read bytes = %d bytes, %v", len(b), err)
	}
	for i := range b {
		if b[i] != byte(i) {
			t.Errorf("read bytes[%d] = %d", i, b[i])
			break
		}
	}
	check.equal("write octet-stream", map[string]any{"name": "o.bin", "path": "/home/user/octet/o.bin"})
	check.equal("read octet-stream", 256)
	check.equal("write gzip", "/home/user/octet/z.txt")
	check.equal("read gzip", "zipped text")
	check.equal("write many", []string{"/home/user/many/one.txt", "/home/user/many/two.txt"})
	check.equal("list", []any{
		map[string]any{"name": "data.bin", "type": "file", "size": 256, "path": "/home/user/notes/data.bin"},
		map[string]any{"name": "hello.txt", "type": "file", "size": 13, "path": "/home/user/notes/hello.txt"},
	})
	check.equal("list depth 2", []string{"/home/user/notes", "/home/user/notes/data.bin", "/home/user/notes/hello.txt"})
	check.equal("makeDir", true)
	check.equal("makeDir again", false)
	check.equal("exists", map[string]any{"file": true, "dir": true, "missing": false})
	check.equal("getInfo file", map[string]any{"name": "hello.txt", "type": "file", "size": 13, "path": "/home/user/notes/hello.txt", "hasTime": true})
	check.equal("getInfo dir", map[string]any{"name": "made", "type": "dir"})
	check.equal("rename", map[string]any{"name": "hello.txt", "path": "/home/user/moved/hello.txt"})
	check.equal("read renamed", "hello, world\n")
	check.threw("read missing", "FileNotFoundError", "isNotFound", "isFileNotFound")
	check.equal("remove", false)
	check.threw("getInfo missing", "FileNotFoundError", "isNotFound")
	check.equal("watchDir", map[string]any{"created": true, "removed": true, "names": []any{"new.txt"}})
	check.equal("watchDir recursive", map[string]any{"name": "sub/leaf.txt", "entryPath": "/home/user/tree/sub/leaf.txt", "entryType": "file"})
	check.threw("watchDir missing", "FileNotFoundError", "isNotFound")

	check.equal("updateNetwork", nil)
	check.equal("pause", true)
	check.equal("state paused", "paused")
	check.equal("pause again", false)
	check.equal("resume by connect", map[string]any{"state": "running", "stdout": "hello, world\n"})

	check.threw("connect unknown", "SandboxNotFoundError", "isNotFound", "isSandboxNotFound")
	check.threw("getInfo unknown", "SandboxNotFoundError", "isNotFound")
	check.equal("kill unknown", false)
	check.threw("bad key", "AuthenticationError", "isAuth")
	check.threw("bad key create", "AuthenticationError", "isAuth")

	check.equal("kill", true)
	check.equal("kill again", false)
	check.equal("list after kill", sortedIDs(created.SandboxID, third.SandboxID))
	check.equal("isRunning after kill", false)
	check.threw("run after kill", "SandboxNotFoundError", "isNotFound")

	var networks []e2btest.Network
	for _, r := range srv.Requests() {
		if r.Method == "PUT" && r.Path == "/sandboxes/"+created.SandboxID+"/network" {
			var n e2btest.Network
			_ = json.Unmarshal([]byte(r.Body), &n)
			networks = append(networks, n)
		}
	}
	if len(networks) != 1 || !reflect.DeepEqual(networks[0], e2btest.Network{AllowOut: []string{"192.0.2.1"}, DenyOut: []string{"0.0.0.0/0"}}) {
		t.Errorf("networks applied = %+v, want the one updateNetwork set", networks)
	}
	if n := len(srv.Sandboxes()); n != 0 {
		t.Errorf("%d sandboxes left after the script killed its own", n)
	}
	// The SDK spoke the current routes, and envd got each sandbox's token.
	var v2create, v2connect int
	for _, r := range srv.Requests() {
		switch {
		case r.Method == "POST" && r.Path == "/v2/sandboxes":
			v2create++
		case r.Method == "POST" && strings.HasPrefix(r.Path, "/v2/sandboxes/") && strings.HasSuffix(r.Path, "/connect"):
			v2connect++
		case r.Method == "POST" && (r.Path == "/sandboxes" || strings.HasSuffix(r.Path, "/connect") && !strings.HasPrefix(r.Path, "/v2/")):
			t.Errorf("the SDK used the v1 route %s %s", r.Method, r.Path)
		}
	}
	if v2create < 3 || v2connect < 2 {
		t.Errorf("v2 creates %d, v2 connects %d", v2create, v2connect)
	}
}

func sortedIDs(ids ...string) []string { slices.Sort(ids); return ids }

type sdkChecker struct {
	t   *testing.T
	res *nodesdk.Result
}

func (c sdkChecker) value(name string, v any) {
	c.t.Helper()
	call := c.res.Call(c.t, name)
	if !call.OK {
		c.t.Errorf("%s: threw %s", name, call.Err())
		return
	}
	if err := json.Unmarshal(call.Raw, v); err != nil {
		c.t.Errorf("%s: %s: %v", name, call.Raw, err)
	}
}

// equal compares the call's value with want, both as JSON.
func (c sdkChecker) equal(name string, want any) {
	c.t.Helper()
	call := c.res.Call(c.t, name)
	if !call.OK {
		c.t.Errorf("%s: threw %s", name, call.Err())
		return
	}
	var got, w any
	wb, _ := json.Marshal(want)
	_ = json.Unmarshal(wb, &w)
	if err := json.Unmarshal(call.Raw, &got); err != nil || !reflect.DeepEqual(got, w) {
		c.t.Errorf("%s = %s, want %s", name, call.Raw, wb)
	}
}

// threw checks a call that reported what it caught (the script's thrown):
// the class, and each instanceof check named.
func (c sdkChecker) threw(name, class string, instances ...string) {
	c.t.Helper()
	var got map[string]any
	c.value(name, &got)
	if got["threw"] != class {
		c.t.Errorf("%s threw %v (%v), want %s", name, got["threw"], got["message"], class)
	}
	for _, k := range instances {
		if got[k] != true {
			c.t.Errorf("%s: %s is %v: %s", name, k, got[k], fmt.Sprint(got))
		}
	}
}
