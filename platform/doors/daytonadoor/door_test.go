package daytonadoor_test

import (
	"encoding/json"
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
	"github.com/managoat/managoat/platform/doors/daytonadoor"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a platform on the local provider (jail as root, else
// trusted) with the door mounted at /daytona; it returns the door's URL,
// a key and the platform.
func start(t *testing.T) (string, string, *apitest.Platform) {
	t.Helper()
	mech := "trusted"
	if os.Geteuid() == 0 {
		mech = "jail"
	}
	lp, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: mech})
	if err != nil {
		t.Fatal(err)
	}
	p := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": lp}, Env: map[string]string{"SANDBOX_PROVIDER": "local"}})
	d, err := daytonadoor.New(daytonadoor.Options{API: p.API, Prefix: "/daytona"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(d)
	t.Cleanup(func() { ts.Close(); _ = d.Close() })
	return ts.URL + "/daytona", p.Account(t, "acme"), p
}

// v1Status is the /v1 status of a GET of the named sandbox.
func v1Status(t *testing.T, p *apitest.Platform, key, name string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", p.URL+"/v1/sandboxes/"+name, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSDK runs testdata/door.mjs (Daytona's SDK) against the door over a
// real platform on the local provider and asserts every call.
func TestSDK(t *testing.T) {
	sdk := nodesdk.Setup(t, "@daytonaio/sdk@0.218.0")
	url, key, p := start(t)
	res := sdk.Run(t, "testdata/door.mjs", nodesdk.Options{
		Env: map[string]string{"DAYTONA_API_URL": url, "DAYTONA_API_KEY": key}, Timeout: 3 * time.Minute,
	})
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
	throws := func(name, class, substr string) {
		t.Helper()
		c := res.Call(t, name)
		if c.OK {
			t.Errorf("%s did not throw: %s", name, c.Raw)
			return
		}
		if e := c.Err(); !strings.Contains(e, class) || !strings.Contains(e, substr) {
			t.Errorf("%s threw %s, want %s (%s)", name, e, class, substr)
		}
	}
	eq("create", map[string]any{"id": "door-a", "name": "door-a", "state": "started", "labels": map[string]string{"suite": "door", "role": "a", "code-toolbox-language": "python"}})
	eq("create other", map[string]any{"id": "door-b", "name": "door-b", "state": "started", "labels": map[string]string{"suite": "other", "code-toolbox-language": "python"}})
	throws("create duplicate", "DaytonaConflictError", "already exists")
	eq("get", map[string]any{"id": "door-a", "name": "door-a", "state": "started", "labels": map[string]string{"suite": "door", "role": "a", "code-toolbox-language": "python"}})
	throws("get missing", "DaytonaNotFoundError", "not found")
	eq("list labels", []string{"door-a"})
	eq("list all", []string{"door-a", "door-b"})
	eq("exec exit", map[string]any{"exitCode": 3, "lines": []string{"", "hi", "oops"}})
	eq("exec created env", map[string]any{"exitCode": 0, "result": "yes\n"})
	eq("exec cwd", map[string]any{"exitCode": 0, "result": "cwdtest\n"})
	eq("exec env", map[string]any{"exitCode": 0, "result": "from-env\n"})
	throws("exec timeout", "DaytonaTimeoutError", "timed out after 1 seconds")
	eq("createFolder", "0750")
	eq("uploadFile", "68656c6c6f206f6c6420776f726c640a00ff")
	eq("uploadFiles", nil)
	eq("downloadFile", []int{104, 101, 108, 108, 111, 32, 111, 108, 100, 32, 119, 111, 114, 108, 100, 10, 0, 255})
	throws("downloadFile missing", "Daytona", "not found")
	eq("downloadFiles", []any{map[string]any{"source": "work/sub/b.txt", "result": "second old\n", "error": nil},
		map[string]any{"source": "work/none.txt", "result": nil, "error": "error"}})
	eq("listFiles", []any{map[string]any{"name": "a.txt", "isDir": false, "size": 18}, map[string]any{"name": "c.bin", "isDir": false, "size": 8},
		map[string]any{"name": "sub", "isDir": true, "size": 0}})
	throws("listFiles missing", "DaytonaNotFoundError", "not found")
	eq("searchFiles", []string{"sub/b.txt", "work/a.txt"})
	eq("findFiles", []any{map[string]any{"file": "sub/b.txt", "line": 1, "content": "second old"}, map[string]any{"file": "work/a.txt", "line": 1, "content": "hello old world"}})
	eq("replaceInFiles", []bool{true, true})
	eq("after replace", "second new\n")
	eq("moveFiles", "not text")
	eq("deleteFile", []string{"sub"})
	throws("deleteFile dir without recursive", "Daytona", "recursive")
	eq("deleteFile recursive", []string{})
	eq("list relabelled", []string{"door-a"})
	eq("stop", "stopped")
	eq("get stopped", "stopped")
	eq("start", "started")
	eq("exec after start", map[string]any{"exitCode": 0, "result": "back\n"})
	throws("bad key", "DaytonaAuthenticationError", "")
	eq("delete", true)
	throws("get deleted", "DaytonaNotFoundError", "not found")
	eq("delete other", true)
	// The door's sandboxes were the platform's rows: the deletes went through.
	for _, n := range []string{"door-a", "door-b"} {
		if st := v1Status(t, p, key, n); st != 404 {
			t.Errorf("/v1 get of deleted %s: %d", n, st)
		}
	}
}

// TestRefusals: bad keys, unknown ids, malformed and oversized bodies and
// what the door does not serve, each in Daytona's shape; a /v1 sandbox is
// listed by the door.
func TestRefusals(t *testing.T) {
	url, key, p := start(t)
	do := func(method, path, k, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url+path, strings.NewReader(body))
		if k != "" {
			req.Header.Set("Authorization", "Bearer "+k)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 4096)
		n, _ := resp.Body.Read(buf)
		return resp.StatusCode, string(buf[:n])
	}
	if st, body := do("GET", "/sandbox", "mgk_bad", ""); st != 401 || !strings.Contains(body, `"statusCode":401`) {
		t.Errorf("bad key: %d %s", st, body)
	}
	if st, _ := do("GET", "/sandbox", "", ""); st != 401 {
		t.Errorf("no key: %d", st)
	}
	if st, body := do("POST", "/sandbox", key, "{not json"); st != 400 || !strings.Contains(body, `"statusCode":400`) {
		t.Errorf("malformed: %d %s", st, body)
	}
	if st, _ := do("POST", "/sandbox", key, `{"name":"`+strings.Repeat("x", 2<<20)+`"}`); st != 413 {
		t.Errorf("oversized: %d", st)
	}
	if st, body := do("GET", "/sandbox/nosuch", key, ""); st != 404 || !strings.Contains(body, `"statusCode":404`) {
		t.Errorf("unknown: %d %s", st, body)
	}
	if st, body := do("GET", "/snapshots", key, ""); st != 501 || !strings.Contains(body, `"statusCode":501`) {
		t.Errorf("snapshots: %d %s", st, body)
	}
	if st, _ := do("POST", "/sandbox", key, `{"snapshot":"python"}`); st != 400 {
		t.Errorf("snapshot create: %d", st)
	}
	// A sandbox made through /v1 is listed by the door.
	req, _ := http.NewRequest("POST", p.URL+"/v1/sandboxes", strings.NewReader(`{"name":"fromv1"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("/v1 create: %v %v", resp, err)
	}
	resp.Body.Close()
	st, body := do("GET", "/sandbox", key, "")
	if st != 200 || !strings.Contains(body, `"name":"fromv1"`) {
		t.Errorf("list: %d %s", st, body)
	}
	if st, body := do("GET", "/toolbox/fromv1/lsp/completions", key, ""); st != 501 {
		t.Errorf("lsp: %d %s", st, body)
	}
	if st, _ := do("DELETE", "/sandbox/fromv1", key, ""); st != 200 {
		t.Errorf("delete: %d", st)
	}
	if st := v1Status(t, p, key, "fromv1"); st != 404 {
		t.Errorf("/v1 after delete: %d", st)
	}
}
