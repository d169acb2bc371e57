package e2bdoor_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/doors/e2bdoor"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a platform on the local provider (jail as root, else
// trusted) with the door mounted at /e2b; it returns the door's URL and a
// key.
func start(t *testing.T) (string, string, *apitest.Platform) { return startB(t) }

func startB(t testing.TB) (string, string, *apitest.Platform) { return startIn(t, t.TempDir()) }

// startIn is startB with the local provider's state in dir.
func startIn(t testing.TB, dir string) (string, string, *apitest.Platform) {
	t.Helper()
	mech := "trusted"
	if os.Geteuid() == 0 {
		mech = "jail"
	}
	lp, err := local.New(local.Config{StateDir: dir, MechanismName: mech})
	if err != nil {
		t.Fatal(err)
	}
	p := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": lp}, Env: map[string]string{"SANDBOX_PROVIDER": "local"}})
	d, err := e2bdoor.New(e2bdoor.Options{API: p.API, Prefix: "/e2b"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d)
	t.Cleanup(func() { ts.Close(); _ = d.Close() })
	return ts.URL + "/e2b", p.Account(t, "acme"), p
}

// TestSDK runs testdata/door.mjs (E2B's SDK) against the door over a real
// platform on the local provider and asserts every call.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, "e2b@2.51.0")
	url, key, p := start(t)
	res := sdk.Run(t, "testdata/door.mjs", nodesdk.Options{
		Env: map[string]string{"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": key, "E2B_USER_HOME": "/home/sprite"}, Timeout: 3 * time.Minute,
	})
	for _, c := range res.Calls {
		t.Logf("%s ok=%v %s %s", c.Name, c.OK, c.Raw, c.Err())
	}
	if !res.Done || res.ExitCode != 0 {
		t.Errorf("script exit %d, done %v\nstderr:\n%s", res.ExitCode, res.Done, res.Stderr)
	}
	val := func(name string, v any) {
		t.Helper()
		c := res.Call(t, name)
		if !c.OK {
			t.Errorf("%s threw %s", name, c.Err())
			return
		}
		if err := json.Unmarshal(c.Raw, v); err != nil {
			t.Errorf("%s: %s: %v", name, c.Raw, err)
		}
	}
	eq := func(name string, want any) {
		t.Helper()
		var got, w any
		val(name, &got)
		b, _ := json.Marshal(want)
		_ = json.Unmarshal(b, &w)
		if !reflect.DeepEqual(got, w) {
			g, _ := json.Marshal(got)
			t.Errorf("%s = %s, want %s", name, g, b)
		}
	}
	var a, b struct{ SandboxID string }
	val("create", &a)
	val("create second", &b)
	eq("list paged", [][]string{{"2"}, {"1"}})
	eq("list filtered", []string{b.SandboxID})
	// The ttl is counted down from create (timeoutMs 120 s) by the time
	// getInfo answers: at most 120, and more than the script's own bound.
	var info struct {
		SandboxID, TemplateID, N, State string
		TTL                             int
	}
	val("getInfo", &info)
	if info.SandboxID != a.SandboxID || info.TemplateID != "base" || info.N != "1" || info.State != "running" || info.TTL > 120 || info.TTL < 120-180 {
		t.Errorf("getInfo = %+v", info)
	}
	var ttl int
	val("setTimeout", &ttl)
	if ttl < 590 || ttl > 600 {
		t.Errorf("ttl after setTimeout = %d", ttl)
	}
	eq("isRunning", true)
	eq("connect", "connected\n")
	eq("run", map[string]any{"exitCode": 0, "stdout": "out\nfrom-create\n", "stderr": "err\n", "streamedOut": "out\nfrom-create\n", "streamedErr": "err\n"})
	eq("run nonzero", map[string]any{"isExit": true, "exitCode": 3, "stdout": "partial\n"})
	eq("cwd and envs", "bar\n/tmp\n")
	eq("sendStdin", "got:hello\n")
	eq("closeStdin", "to cat")
	eq("background kill list", map[string]any{"listed": true, "killed": true, "waitIsExit": true})
	eq("pty", 0)
	eq("write text", map[string]any{"name": "door-hello.txt", "path": "/home/sprite/door-hello.txt"})
	eq("read text", "hello, world\n")
	eq("write bytes", "/home/sprite/door-data.bin")
	eq("read bytes", true)
	eq("write many", []string{"/home/sprite/many/one.txt", "/home/sprite/many/two.txt"})
	eq("read many", []string{"one", "two"})
	var miss map[string]any
	val("read missing", &miss)
	if miss["isNotFound"] != true {
		t.Errorf("read missing = %v", miss)
	}
	eq("list", []any{
		map[string]any{"name": "one.txt", "type": "file", "size": 3, "path": "/home/sprite/many/one.txt"},
		map[string]any{"name": "two.txt", "type": "file", "size": 3, "path": "/home/sprite/many/two.txt"},
	})
	eq("list depth 2", []string{"/home/sprite/many", "/home/sprite/many/one.txt", "/home/sprite/many/two.txt"})
	eq("makeDir", true)
	eq("makeDir again", false)
	eq("exists", map[string]any{"file": true, "dir": true, "missing": false})
	eq("getInfo file", map[string]any{"name": "door-hello.txt", "type": "file", "size": 13, "path": "/home/sprite/door-hello.txt", "hasTime": true})
	eq("getInfo dir", map[string]any{"name": "made", "type": "dir"})
	eq("rename", map[string]any{"name": "hello.txt", "path": "/home/sprite/moved/hello.txt"})
	eq("read renamed", "hello, world\n")
	eq("remove", false)
	eq("watchDir", map[string]any{"got": []string{"create new.txt", "write old.txt", "chmod old.txt", "rename new.txt", "create renamed.txt", "remove old.txt", "create a|b\nc"}, "missing": true, "crowded": true})
	var gm map[string]any
	val("getInfo missing", &gm)
	if gm["isNotFound"] != true {
		t.Errorf("getInfo missing = %v", gm)
	}
	var cu map[string]any
	val("connect unknown", &cu)
	if cu["isSandboxNotFound"] != true {
		t.Errorf("connect unknown = %v", cu)
	}
	eq("kill unknown", false)
	var bk map[string]any
	val("bad key", &bk)
	if bk["isAuth"] != true {
		t.Errorf("bad key = %v", bk)
	}
	// E2B's timeout kills the sandbox at its end (create's timeoutMs, then
	// setTimeout's), as a row of /v1 too.
	var ex struct {
		SandboxID                         string
		RunningBefore, RunningAfter, Gone bool
	}
	val("timeout expiry", &ex)
	if !ex.RunningBefore || ex.RunningAfter || !ex.Gone {
		t.Errorf("timeout expiry = %+v", ex)
	}
	var st struct {
		RunningAtFirstEnd, RunningAfter bool
	}
	val("setTimeout expiry", &st)
	if !st.RunningAtFirstEnd || st.RunningAfter {
		t.Errorf("setTimeout expiry = %+v", st)
	}
	for _, id := range []string{ex.SandboxID} {
		req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
			t.Errorf("/v1 get of the expired sandbox %q: %v %v", id, resp, err)
		} else {
			resp.Body.Close()
		}
	}
	eq("kill", true)
	eq("kill again", false)
	eq("list after kill", []string{a.SandboxID})
	// The door's sandboxes are the platform's rows: the kill went through.
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+b.SandboxID, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 404 {
		t.Errorf("/v1 get of the killed sandbox: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// TestRefusals: bad keys, unknown ids, malformed bodies and tokens of
// another sandbox, each in E2B's shape.
func TestRefusals(t *testing.T) {
	url, key, p := start(t)
	do := func(method, path, k, body string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if k != "" {
			req.Header.Set("X-API-Key", k)
		}
		for h, v := range hdr {
			req.Header.Set(h, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	if st, body := do("GET", "/v2/sandboxes", "mgk_bad", "", nil); st != 401 || !strings.Contains(body, `"code":401`) {
		t.Errorf("bad key: %d %s", st, body)
	}
	if st, _ := do("GET", "/v2/sandboxes", "", "", nil); st != 401 {
		t.Errorf("no key: %d", st)
	}
	if st, body := do("POST", "/v2/sandboxes", key, "{not json", nil); st != 400 || !strings.Contains(body, `"code":400`) {
		t.Errorf("malformed: %d %s", st, body)
	}
	if st, _ := do("POST", "/v2/sandboxes", key, `{"templateID":"`+strings.Repeat("x", 2<<20)+`"}`, nil); st != 413 {
		t.Errorf("oversized: %d", st)
	}
	if st, _ := do("GET", "/sandboxes/inosuch", key, "", nil); st != 404 {
		t.Errorf("unknown: %d", st)
	}
	if st, _ := do("POST", "/v2/sandboxes", key, `{"templateID":"python"}`, nil); st != 404 {
		t.Errorf("unknown template: %d", st)
	}
	if st, _ := do("GET", "/templates", key, "", nil); st != 501 {
		t.Errorf("templates: %d", st)
	}
	st, body := do("POST", "/v2/sandboxes", key, `{"templateID":"base"}`, nil)
	var s1 struct{ SandboxID, EnvdAccessToken string }
	if st != 201 || json.Unmarshal([]byte(body), &s1) != nil || s1.EnvdAccessToken == "" {
		t.Fatalf("create: %d %s", st, body)
	}
	defer do("DELETE", "/sandboxes/"+s1.SandboxID, key, "", nil)
	// A sandbox made through the door is a row of /v1.
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+s1.SandboxID, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("/v1 get of the door's sandbox: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	env := func(id, tok string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "X-Access-Token": tok, "Content-Type": "application/json"}
	}
	if st, _ := do("POST", "/process.Process/List", "", "{}", env(s1.SandboxID, s1.EnvdAccessToken)); st != 200 {
		t.Errorf("list with the token: %d", st)
	}
	for name, h := range map[string]map[string]string{
		"no token": env(s1.SandboxID, ""), "tampered": env(s1.SandboxID, s1.EnvdAccessToken[:len(s1.EnvdAccessToken)-2]+"AA"),
		"other sandbox": env("iother", s1.EnvdAccessToken),
	} {
		if st, _ := do("POST", "/process.Process/List", "", "{}", h); st != 401 {
			t.Errorf("%s: %d, want 401", name, st)
		}
	}
	if st, _ := do("POST", "/process.Process/List", "", "{bad", env(s1.SandboxID, s1.EnvdAccessToken)); st != 400 {
		t.Errorf("malformed Connect JSON: %d", st)
	}
}

// TestMetadataOutlivesTheDoor: a sandbox's E2B metadata is kept on the
// platform's record (labels e2b.metadata/KEY), so a new door over the same
// platform (serve restarted) still lists it, filters by it, and /v1 shows
// it; an entry the labels cannot hold stays in the first door's memory.
func TestMetadataOutlivesTheDoor(t *testing.T) {
	url, key, p := start(t)
	do := func(base, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := do(url, "POST", "/sandboxes", `{"templateID":"base","metadata":{"team":"blue","bad key!":"x"}}`)
	var made struct{ SandboxID string }
	if code != 201 || json.Unmarshal([]byte(body), &made) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	defer do(url, "DELETE", "/sandboxes/"+made.SandboxID, "")
	d2, err := e2bdoor.New(e2bdoor.Options{API: p.API, Prefix: "/e2b"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d2)
	defer func() { ts.Close(); _ = d2.Close() }()
	code, body = do(ts.URL+"/e2b", "GET", "/v2/sandboxes?metadata=team%3Dblue", "")
	var listed []struct {
		SandboxID string
		Metadata  map[string]string
	}
	if code != 200 || json.Unmarshal([]byte(body), &listed) != nil || len(listed) != 1 || listed[0].SandboxID != made.SandboxID ||
		!reflect.DeepEqual(listed[0].Metadata, map[string]string{"team": "blue"}) {
		t.Fatalf("the new door's filtered list: %d %s", code, body)
	}
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+made.SandboxID, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `"e2b.metadata/team":"blue"`) {
		t.Errorf("/v1's record has no metadata label: %s", b)
	}
	if _, body := do(url, "GET", "/sandboxes/"+made.SandboxID, ""); !strings.Contains(body, `"bad key!":"x"`) {
		t.Errorf("the first door lost the entry the labels cannot hold: %s", body)
	}
}
