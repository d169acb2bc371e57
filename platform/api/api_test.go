package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func withFakeB(b *testing.B) *apitest.Platform {
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	return apitest.Start(b, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}})
}

func withFake(t *testing.T, o apitest.Options) *apitest.Platform {
	t.Helper()
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	if o.Providers == nil {
		o.Providers = map[string]sandbox.Provider{}
	}
	o.Providers["fake"] = f
	return apitest.Start(t, o)
}

type answer struct {
	status int
	header http.Header
	body   []byte
	err    *api.Error
}

func call(t *testing.T, method, url, key string, body io.Reader) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, body: b}
	var e struct {
		Error *api.Error `json:"error"`
	}
	if json.Unmarshal(b, &e) == nil {
		a.err = e.Error
	}
	return a
}

// TestOpenAPIMatchesRoutes: the served document describes exactly the
// routes the server has, and the server routes every path the document
// names (a request to each reaches authentication, not the fallback 404).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	// Every route is asked without a key: more failed authentications than
	// the default burst of one address.
	pl := withFake(t, apitest.Options{Configure: func(c *api.Config) { c.FailedAuthBurst = 1000 }})
	a := call(t, "GET", pl.URL+"/v1/openapi.json", "", nil)
	if a.status != 200 || !bytes.Equal(a.body, api.OpenAPI) {
		t.Fatalf("GET /v1/openapi.json = %d", a.status)
	}
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(a.body, &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("not an OpenAPI 3 document: %v", err)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for m := range ops {
			if m == "parameters" {
				continue
			}
			documented = append(documented, strings.ToUpper(m)+" "+path)
		}
	}
	var routed []string
	for _, r := range api.Routes {
		routed = append(routed, r.Method+" "+r.Path)
	}
	slices.Sort(documented)
	slices.Sort(routed)
	if !slices.Equal(documented, routed) {
		t.Fatalf("document and routes differ:\ndocumented %v\nrouted     %v", documented, routed)
	}
	for _, r := range api.Routes {
		path := strings.NewReplacer("{name}", "x", "{session}", "s1", "{checkpoint}", "c1", "{port}", "8080", "{path}", "a/b").Replace(r.Path)
		got := call(t, r.Method, pl.URL+path, "", nil)
		switch {
		case r.Public && got.status != 200:
			t.Errorf("%s %s = %d, want 200", r.Method, path, got.status)
		case !r.Public && got.status != 401:
			t.Errorf("%s %s without a key = %d %s, want 401 (a route the mux does not have is 404)", r.Method, path, got.status, got.body)
		}
	}
	if got := call(t, "GET", pl.URL+"/v1/nope", "k", nil); got.status != 404 {
		t.Errorf("an unknown route = %d", got.status)
	}
}

func TestBadInput(t *testing.T) {
	pl := withFake(t, apitest.Options{Env: map[string]string{"SANDBOX_RUNNERS_ENABLED": "false"}})
	key := pl.Account(t, "alice")
	u := pl.URL + "/v1/sandboxes"
	for _, tc := range []struct {
		body   string
		status int
		field  string // the error names it
	}{
		{`{"name": "x", "limits": {"pids": "many"}}`, 400, "limits.pids"},
		{`{"name": 7}`, 400, "name"},
		{`{"name": "x", "colour": "blue"}`, 400, "colour"},
		{`{"name": "x"`, 400, "body"},
		{`not json`, 400, "body"},
		{``, 400, "body"},
		{`{"name": "x", "provider": "modal"}`, 400, "modal"},
		{`{"name": "x", "provider": "runner"}`, 400, "runner"},
		{`{"name": "x", "provider": "sprites"}`, 400, "SPRITES_TOKEN"},
		{`{"name": "a/b"}`, 400, "name"},
		{`{"name": "x", "limits": {"pids": -1}}`, 400, "limits"},
	} {
		a := call(t, "POST", u, key, strings.NewReader(tc.body))
		if a.status != tc.status || a.err == nil || !strings.Contains(a.err.Field+" "+a.err.Reason+" "+a.err.Message, tc.field) {
			t.Errorf("POST %s = %d %s, want %d naming %q", tc.body, a.status, a.body, tc.status, tc.field)
		}
	}
	big := `{"name": "x", "provider": "` + strings.Repeat("a", 2<<20) + `"}`
	if a := call(t, "POST", u, key, strings.NewReader(big)); a.status != 413 {
		t.Errorf("a 2 MiB body = %d %s, want 413", a.status, a.body)
	}
	for _, k := range []string{"", "mgk_0000000000000000_nope", key + "x", "Bearer"} {
		if a := call(t, "GET", u, k, nil); a.status != 401 {
			t.Errorf("key %q = %d, want 401", k, a.status)
		} else if strings.Contains(string(a.body), key[:20]) {
			t.Errorf("the 401 shows the key: %s", a.body)
		}
	}
}

func TestRateLimit(t *testing.T) {
	pl := withFake(t, apitest.Options{Configure: func(c *api.Config) { c.Rate, c.Burst = 0.01, 3 }})
	key := pl.Account(t, "alice")
	var last answer
	for range 4 {
		last = call(t, "GET", pl.URL+"/v1/sandboxes", key, nil)
	}
	if last.status != 429 || last.header.Get("Retry-After") == "" || last.err == nil || last.err.Kind != "rate_limited" {
		t.Fatalf("the 4th call of a 3-burst key = %d %v %s, want 429 with Retry-After", last.status, last.header, last.body)
	}
	// At 0.01 requests a second the next token is 100 s away: Retry-After
	// is that, in whole seconds (RFC 9110), and the body says it in ms.
	if ra, err := strconv.Atoi(last.header.Get("Retry-After")); err != nil || ra < 99 || ra > 100 || last.err.RetryAfterMS < 99000 || last.err.RetryAfterMS > 100000 {
		t.Fatalf("Retry-After %q, retry_after_ms %d: want 100 s", last.header.Get("Retry-After"), last.err.RetryAfterMS)
	}
	other := pl.Account(t, "bob")
	if a := call(t, "GET", pl.URL+"/v1/sandboxes", other, nil); a.status != 200 {
		t.Fatalf("another key is limited by the first one's rate: %d", a.status)
	}
}

// TestAccountsSeeOnlyTheirOwn: bob cannot see, use or destroy alice's
// sandbox (404, never 403), and both may use the same name.
func TestAccountsSeeOnlyTheirOwn(t *testing.T) {
	pl := withFake(t, apitest.Options{})
	alice, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "box", "provider": "fake"}`)); a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	for _, r := range []struct{ m, p, body string }{
		{"GET", "/v1/sandboxes/box", ""},
		{"POST", "/v1/sandboxes/box/exec", `{"cmd": "emit", "args": ["out:x"]}`},
		{"DELETE", "/v1/sandboxes/box", ""},
		{"POST", "/v1/sandboxes/box/suspend", ""},
		{"GET", "/v1/sandboxes/box/sessions", ""},
		{"PUT", "/v1/sandboxes/box/files?path=/tmp/x", "data"},
	} {
		if a := call(t, r.m, pl.URL+r.p, bob, strings.NewReader(r.body)); a.status != 404 {
			t.Errorf("bob %s %s = %d %s, want 404", r.m, r.p, a.status, a.body)
		}
	}
	// Every route on a sandbox, and its stream, answers bob 404 alike.
	for _, r := range api.Routes {
		if !strings.Contains(r.Path, "{name}") {
			continue
		}
		path := strings.NewReplacer("{name}", "box", "{session}", "s1", "{checkpoint}", "c1", "{port}", "8080", "{path}", "a/b").Replace(r.Path)
		body := `{}`
		switch r.Handler {
		case "exec":
			body = `{"cmd": "emit", "args": ["out:x"]}`
		case "write_file", "read_file":
			path += "?path=/tmp/x"
		}
		req, err := http.NewRequest(r.Method, pl.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+bob)
		if r.Handler == "stream" {
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Sec-WebSocket-Version", "13")
			req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 404 || !strings.Contains(string(got), `"kind":"not_found"`) {
			t.Errorf("bob %s %s = %d %s, want 404 not_found", r.Method, path, resp.StatusCode, got)
		}
	}
	a := call(t, "GET", pl.URL+"/v1/sandboxes", bob, nil)
	if !strings.Contains(string(a.body), `"data":[]`) {
		t.Errorf("bob lists %s", a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/box", alice, nil); a.status != 200 {
		t.Errorf("alice's own sandbox after bob's attempts = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", bob, strings.NewReader(`{"name": "box", "provider": "fake"}`)); a.status != 201 {
		t.Errorf("bob's own box = %d %s", a.status, a.body)
	}
}

// TestStickyAndRestart: a sandbox stays on the provider that made it, and
// a platform restarted on the same database finds it.
func TestStickyAndRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "platform.db")
	f, fr := fake.New(), fake.New()
	t.Cleanup(func() { _ = f.Close(); _ = fr.Close() })
	st, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SANDBOX_PROVIDER": "fake"}
	pl := apitest.Start(t, apitest.Options{Store: st, Env: env, Providers: map[string]sandbox.Provider{"fake": f}})
	key := pl.Account(t, "alice")
	startRunner(t, pl.URL, key, "r1", fr)
	waitOnline(t, pl, 1)
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "box"}`)); a.status != 201 || !strings.Contains(string(a.body), `"provider":"fake"`) {
		t.Fatalf("create on the default = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "rbox", "provider": "runner"}`)); a.status != 201 {
		t.Fatalf("create pinned = %d %s", a.status, a.body)
	}
	// Adopting without a pin goes where it lives; a pin elsewhere is refused.
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "rbox"}`)); a.status != 200 || !strings.Contains(string(a.body), `"provider":"runner"`) {
		t.Fatalf("adopt = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "rbox", "provider": "fake"}`)); a.status != 409 {
		t.Fatalf("a pin on another provider = %d %s, want 409", a.status, a.body)
	}
	ctx := context.Background()
	if names, _ := f.ListAllNames(ctx); len(names) != 1 || !strings.HasPrefix(names[0], api.NamePrefix) {
		t.Fatalf("fake holds %v, want one platform-made name", names)
	}
	if names, _ := fr.ListAllNames(ctx); len(names) != 1 || !strings.HasPrefix(names[0], "runner-") {
		t.Fatalf("the runner holds %v, want one runner name", names)
	}
	pl.TS.Close()
	pl.API.Close()
	st.Close()

	st2, err := sqlite.Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st2.Close() })
	pl2 := apitest.Start(t, apitest.Options{Store: st2, Env: env, Providers: map[string]sandbox.Provider{"fake": f}})
	a := call(t, "POST", pl2.URL+"/v1/sandboxes/box/exec", key, strings.NewReader(`{"cmd": "emit", "args": ["out:after restart"]}`))
	var res api.ExecResult
	if a.status != 200 || json.Unmarshal(a.body, &res) != nil || string(res.Output) != "after restart" {
		t.Fatalf("exec after restart = %d %s", a.status, a.body)
	}
	if l := call(t, "GET", pl2.URL+"/v1/sandboxes", key, nil); !strings.Contains(string(l.body), `"name":"rbox"`) {
		t.Fatalf("list after restart: %s", l.body)
	}
}

// TestRunnerPlacement: a runner daemon authenticated with an account's key
// is that account's; new runner sandboxes are spread over the account's
// runners (placement, fleet.go), never put on another account's.
func TestRunnerPlacement(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	alice, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	fa1, fa2, fb := fake.New(), fake.New(), fake.New()
	for _, f := range []*fake.Provider{fa1, fa2, fb} {
		t.Cleanup(func() { _ = f.Close() })
	}
	startRunner(t, pl.URL, bob, "bobs", fb)
	waitOnline(t, pl, 1)
	// alice has no runner: no_runner_online, nothing recorded.
	a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "r", "provider": "runner"}`))
	if a.status != 503 || a.err == nil || a.err.Reason != "no_runner_online" || a.header.Get("Retry-After") == "" {
		t.Fatalf("create with no runner of the account = %d %s", a.status, a.body)
	}
	startRunner(t, pl.URL, alice, "first", fa1)
	waitOnline(t, pl, 2)
	time.Sleep(10 * time.Millisecond)
	startRunner(t, pl.URL, alice, "second", fa2)
	waitOnline(t, pl, 3)
	for _, name := range []string{"r", "r2"} {
		if a := call(t, "POST", pl.URL+"/v1/sandboxes", alice, strings.NewReader(`{"name": "`+name+`", "provider": "runner"}`)); a.status != 201 {
			t.Fatalf("create = %d %s", a.status, a.body)
		}
	}
	ctx := context.Background()
	n1, _ := fa1.ListAllNames(ctx)
	n2, _ := fa2.ListAllNames(ctx)
	nb, _ := fb.ListAllNames(ctx)
	if len(n1) != 1 || len(n2) != 1 || len(nb) != 0 {
		t.Fatalf("placed on first %v, second %v, bob's %v; want one on each of alice's", n1, n2, nb)
	}
	r := call(t, "GET", pl.URL+"/v1/runners", alice, nil)
	if strings.Contains(string(r.body), "bobs") || !strings.Contains(string(r.body), "second") {
		t.Fatalf("alice's runners: %s", r.body)
	}
}

func startRunner(t *testing.T, url, key, name string, p sandbox.Provider) {
	t.Helper()
	d, err := runner.New(runner.Config{URL: url, Token: key, Name: name, Root: "/nowhere", Provider: p, Logger: slog.New(slog.DiscardHandler),
		BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		d.Close()
	})
}

func waitOnline(t *testing.T, pl *apitest.Platform, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(pl.Relay.Host().Online()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d runners online, want %d", len(pl.Relay.Host().Online()), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newPlatformClient(t testing.TB, pl *apitest.Platform, key string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: pl.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestNothingEnabled: a platform with no provider starts, and every
// create fails naming what to set.
func TestNothingEnabled(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_RUNNERS_ENABLED": "false"}})
	key := pl.Account(t, "alice")
	a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "x"}`))
	if a.status != 400 || a.err == nil || a.err.Reason != "provider" {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	for _, w := range []string{"SPRITES_TOKEN", "E2B_API_KEY", "DAYTONA_API_KEY", "SANDBOX_RUNNERS_ENABLED", "managoat doctor"} {
		if !strings.Contains(a.err.Message, w) {
			t.Errorf("the refusal %q does not name %s", a.err.Message, w)
		}
	}
	if l := call(t, "GET", pl.URL+"/v1/sandboxes", key, nil); l.status != 200 {
		t.Fatalf("list = %d", l.status)
	}
}

// TestRevokedKeyIsRefusedAtOnce: a key revoked by another process (serve
// admin key revoke) is refused on the next request.
func TestRevokedKeyIsRefusedAtOnce(t *testing.T) {
	pl := withFake(t, apitest.Options{})
	key := pl.Account(t, "alice")
	if a := call(t, "GET", pl.URL+"/v1/sandboxes", key, nil); a.status != 200 {
		t.Fatalf("before: %d", a.status)
	}
	if err := pl.Store.RevokeKey(context.Background(), api.KeyID(key), time.Now()); err != nil {
		t.Fatal(err)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes", key, nil); a.status != 401 {
		t.Fatalf("after revocation: %d %s", a.status, a.body)
	}
}

// TestBadInputNamesTheField: every 400 of a request's own value says
// which field (the answer's "field"), on every route that takes one, and
// keeps the contract's reason.
func TestBadInputNamesTheField(t *testing.T) {
	pl := withFake(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	key := pl.Account(t, "alice")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "box"}`)); a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	for _, tc := range []struct{ m, p, body, field, reason string }{
		{"POST", "/v1/sandboxes", `{"name": ""}`, "name", "name"},
		{"POST", "/v1/sandboxes", `{"name": "a b"}`, "name", "name"},
		{"POST", "/v1/sandboxes", `{"name": "y", "limits": {"memory_bytes": -1}}`, "limits.memory_bytes", "limits"},
		{"POST", "/v1/sandboxes", `{"name": "y", "limits": {"disk_bytes": -1}}`, "limits.disk_bytes", "limits"},
		{"POST", "/v1/sandboxes", `{"name": "y", "limits": {"wall_clock_ms": -1}}`, "limits.wall_clock_ms", "limits"},
		{"POST", "/v1/sandboxes", `{"name": "y", "publish": [0]}`, "publish", "json"},
		{"GET", "/v1/sandboxes/a%20b", ``, "name", "name"},
		{"POST", "/v1/sandboxes/box/exec", `{"cmd": 5}`, "cmd", "json"},
		{"POST", "/v1/sandboxes/box/exec", `{}`, "cmd", "json"},
		{"POST", "/v1/sandboxes/box/sessions/s1/terminate", `{"mode": "gently"}`, "mode", "termination_request"},
		{"POST", "/v1/sandboxes/box/sessions/s1/terminate", `{"timeout_ms": 999999}`, "timeout_ms", "termination_request"},
		{"POST", "/v1/sandboxes/box/sessions/s%201/terminate", `{}`, "session", "termination_request"},
		{"PUT", "/v1/sandboxes/box/files", `data`, "path", "path"},
		{"GET", "/v1/sandboxes/box/files", ``, "path", "path"},
		{"PUT", "/v1/sandboxes/box/files?path=/tmp/x&mode=999", `data`, "mode", "json"},
		{"DELETE", "/v1/sandboxes/box?timeout_ms=soon", ``, "timeout_ms", "json"},
		{"PUT", "/v1/sandboxes/box/network-policy", `{"allow": "x"}`, "allow", "json"},
	} {
		a := call(t, tc.m, pl.URL+tc.p, key, strings.NewReader(tc.body))
		if a.status != 400 || a.err == nil || a.err.Field != tc.field || a.err.Reason != tc.reason || !strings.Contains(a.err.Message, strings.TrimPrefix(tc.field, "limits.")) {
			t.Errorf("%s %s %s = %d %s, want 400 with field %q, reason %q", tc.m, tc.p, tc.body, a.status, a.body, tc.field, tc.reason)
		}
	}
}

// TestFieldErrorAsTheClientSeesIt: a field's refusal, turned back into
// the contract's error as the Go client does (Error.Err), is Invalid with
// the contract's reason and a message naming the field once.
func TestFieldErrorAsTheClientSeesIt(t *testing.T) {
	pl := withFake(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	key := pl.Account(t, "alice")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "box"}`)); a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	a := call(t, "POST", pl.URL+"/v1/sandboxes/box/sessions/s1/terminate", key, strings.NewReader(`{"timeout_ms": 3600000}`))
	if a.err == nil {
		t.Fatalf("terminate = %d %s", a.status, a.body)
	}
	err := a.err.Err()
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || iv.Reason != "termination_request" || strings.Count(err.Error(), "sandbox: invalid") != 1 || !strings.Contains(err.Error(), "timeout_ms: timeout") {
		t.Fatalf("a 1 h termination timeout = %v, want Invalid{termination_request} naming timeout_ms once", err)
	}
}

// TestFileOverTheLimit: a file write's body over MaxFile is 413, and
// nothing is written.
func TestFileOverTheLimit(t *testing.T) {
	pl := withFake(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}, Configure: func(c *api.Config) { c.MaxFile = 1024 }})
	key := pl.Account(t, "alice")
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "box"}`)); a.status != 201 {
		t.Fatalf("create = %d %s", a.status, a.body)
	}
	if a := call(t, "PUT", pl.URL+"/v1/sandboxes/box/files?path=/tmp/big", key, strings.NewReader(strings.Repeat("x", 2048))); a.status != 413 || a.err == nil || a.err.Kind != api.KindTooLarge {
		t.Fatalf("a 2 KiB file over a 1 KiB limit = %d %s, want 413", a.status, a.body)
	}
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/box/files?path=/tmp/big", key, nil); a.status != 404 {
		t.Fatalf("the refused file reads %d %.40s, want 404", a.status, a.body)
	}
	if a := call(t, "PUT", pl.URL+"/v1/sandboxes/box/files?path=/tmp/small", key, strings.NewReader(strings.Repeat("x", 1024))); a.status != 204 {
		t.Fatalf("a file at the limit = %d %s", a.status, a.body)
	}
}

// TestOpenAPISchemasMatchTypes: each schema of the document has exactly
// the JSON fields of the Go type the server reads or writes for it, so the
// document cannot drift from the code (disk_bytes was in neither).
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	for name, v := range map[string]any{
		"Limits": api.Limits{}, "Sandbox": api.Sandbox{}, "CreateRequest": api.CreateRequest{}, "ExecRequest": api.ExecRequest{},
		"ExecResult": api.ExecResult{}, "Session": api.Session{}, "TerminateRequest": api.TerminateRequest{},
		"NetworkPolicy": api.PolicyRequest{}, "CheckpointRequest": api.CheckpointRequest{}, "Provider": api.ProviderInfo{},
		"StreamStart": api.StreamStart{}, "StreamMessage": api.StreamMsg{},
	} {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("the document has no schema %s", name)
			continue
		}
		var documented, fields []string
		for p := range s.Properties {
			documented = append(documented, p)
		}
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			if tag := strings.Split(typ.Field(i).Tag.Get("json"), ",")[0]; tag != "" && tag != "-" {
				fields = append(fields, tag)
			}
		}
		slices.Sort(documented)
		slices.Sort(fields)
		if !slices.Equal(documented, fields) {
			t.Errorf("schema %s documents %v; %s has %v", name, documented, typ, fields)
		}
	}
}
