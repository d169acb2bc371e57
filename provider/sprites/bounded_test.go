package sprites_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

const prose = "PRIVATE-PROVIDER-PROSE"

type check func(t *testing.T, err error)

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("err = %v, want nil", err)
	}
}

func unavail(reason string) check {
	return func(t *testing.T, err error) {
		t.Helper()
		var u *sandbox.UnavailableError
		if !errors.As(err, &u) || u.Reason != reason {
			t.Fatalf("err = %v, want Unavailable{%s}", err, reason)
		}
	}
}

func invalid(reason string) check {
	return func(t *testing.T, err error) {
		t.Helper()
		var iv *sandbox.InvalidError
		if !errors.As(err, &iv) || iv.Reason != reason {
			t.Fatalf("err = %v, want Invalid{%s}", err, reason)
		}
	}
}

// httpErr wants the §3.2 class with an empty body detail (no prose).
func httpErr(kind string, status int) check {
	return func(t *testing.T, err error) {
		t.Helper()
		if sandbox.Kind(err) != kind {
			t.Fatalf("err = %v (kind %s), want %s", err, sandbox.Kind(err), kind)
		}
		var d *sandbox.HTTPDetail
		var (
			iv *sandbox.InvalidError
			de *sandbox.DeniedError
			u  *sandbox.UnavailableError
			rl *sandbox.RateLimitedError
		)
		switch {
		case errors.As(err, &iv):
			d = iv.HTTP
		case errors.As(err, &de):
			d = de.HTTP
		case errors.As(err, &u):
			d = u.HTTP
		case errors.As(err, &rl):
			if rl.RetryAfter != 0 {
				t.Fatalf("RetryAfter = %v, want none", rl.RetryAfter)
			}
			return
		}
		if d == nil || d.Status != status || d.Body != "" {
			t.Fatalf("detail = %+v, want status %d with no body", d, status)
		}
	}
}

func is(target error) check {
	return func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, target) {
			t.Fatalf("err = %v, want %v", err, target)
		}
	}
}

type bcase struct {
	name     string
	faults   []spritestest.Fault
	want     check
	requests int
	timeout  time.Duration // passed to the operation; zero is its default
	force    bool          // terminate_session mode
	sprite   string        // a sprite the fake holds before the call
}

// runCases runs op once per case on a fresh fake with the case's faults,
// then checks the error, that no provider prose leaked, and the number of
// requests (no retries).
func runCases(t *testing.T, cfg sprites.Config, cases []bcase, op func(ctx context.Context, p *sprites.Provider, tc bcase) error) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, p := newFake(t, cfg)
			if tc.sprite != "" {
				srv.AddSprite(tc.sprite)
			}
			for _, f := range tc.faults {
				srv.Inject(f)
			}
			err := op(ctxT(t), p, tc)
			tc.want(t, err)
			if err != nil && strings.Contains(err.Error(), prose) {
				t.Fatalf("provider prose leaked: %v", err)
			}
			reqs := srv.Requests()
			if len(reqs) != tc.requests {
				t.Fatalf("%d requests, want %d: %+v", len(reqs), tc.requests, reqs)
			}
			for _, r := range reqs {
				if r.Proto != "HTTP/1.1" || r.AcceptEncoding != "" {
					t.Fatalf("request %s %s over %s with Accept-Encoding %q", r.Method, r.Path, r.Proto, r.AcceptEncoding)
				}
			}
		})
	}
}

func status(method, path string, code int, body string) spritestest.Fault {
	return spritestest.Fault{Method: method, Path: path, Times: 1, Status: code, Body: []byte(body),
		Header: map[string]string{"Location": "http://127.0.0.1:1/elsewhere", "Retry-After": "7"}}
}

func pad(n int) string { return strings.Repeat(" ", n) }

func TestCreateNewAlgorithm(t *testing.T) {
	const name = "cn"
	post := func(code int, body string) spritestest.Fault { return status("POST", "/v1/sprites", code, body) }
	good := `{"name":"cn","id":"sprite-1"}`
	cases := []bcase{
		{name: "2xx valid", faults: []spritestest.Fault{post(200, good)}, want: ok, requests: 1},
		{name: "201 valid, 256-byte id", faults: []spritestest.Fault{post(201, `{"name":"cn","id":"`+strings.Repeat("i", 256)+`"}`)}, want: ok, requests: 1},
		{name: "409 already exists", faults: []spritestest.Fault{post(409, prose)}, want: is(sandbox.ErrAlreadyExists), requests: 1},
		{name: "302 invalid, not followed", faults: []spritestest.Fault{post(302, prose)}, want: httpErr("invalid", 302), requests: 1},
		{name: "400 invalid", faults: []spritestest.Fault{post(400, `{"error":"`+prose+`"}`)}, want: httpErr("invalid", 400), requests: 1},
		{name: "401 denied", faults: []spritestest.Fault{post(401, prose)}, want: httpErr("denied", 401), requests: 1},
		{name: "429 rate limited, no retry", faults: []spritestest.Fault{post(429, `{"retry_after_seconds":9}`)}, want: httpErr("rate_limited", 429), requests: 1},
		{name: "503 unavailable, no retry", faults: []spritestest.Fault{post(503, prose)}, want: httpErr("unavailable", 503), requests: 1},
		{name: "transport failure", faults: []spritestest.Fault{{Method: "POST", Drop: true}}, want: unavail(sprites.ReasonCreateTransportFailed), requests: 1},
		{name: "truncated 2xx body", faults: []spritestest.Fault{{Method: "POST", Status: 200, Body: []byte(good), Truncate: true}}, want: unavail(sprites.ReasonCreateTransportFailed), requests: 1},
		{name: "stall", faults: []spritestest.Fault{{Method: "POST", Stall: 5 * time.Second, Status: 200, Body: []byte(good)}}, want: unavail(sprites.ReasonCreateTimeout), requests: 1, timeout: 100 * time.Millisecond},
	}
	for _, body := range []string{
		`{"id":"sprite-1"}`, `{"name":"other","id":"sprite-1"}`, `{"name":"cn"}`, `{"name":"cn","id":""}`,
		`{"name":"cn","id":12}`, `{"name":"cn","id":"` + strings.Repeat("i", 257) + `"}`, `not json ` + prose, `[` + good + `]`,
		good + pad(65537-len(good)), `null`,
	} {
		cases = append(cases, bcase{name: "unconfirmed " + body[:min(len(body), 24)], faults: []spritestest.Fault{post(200, body)},
			want: unavail(sprites.ReasonCreateUnconfirmed), requests: 1})
	}
	runCases(t, sprites.Config{}, cases, func(ctx context.Context, p *sprites.Provider, tc bcase) error {
		h, err := p.CreateNew(ctx, name, sandbox.CreateNewOptions{Timeout: tc.timeout})
		if err == nil && (h.InstanceID == "" || h.Private != nil || h.Name != name) {
			return errors.New("bad handle")
		}
		return err
	})
}

func TestCreateNewStallClosesSocket(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	srv.Inject(spritestest.Fault{Method: "POST", Stall: 10 * time.Second, Status: 200})
	start := time.Now()
	_, err := p.CreateNew(ctxT(t), "cn", sandbox.CreateNewOptions{Timeout: 100 * time.Millisecond})
	unavail(sprites.ReasonCreateTimeout)(t, err)
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("took %v", d)
	}
	waitFor(t, func() bool { return srv.Abandoned() == 1 }, "the server to see the socket closed")
}

func TestCreateNewOptionsAndBody(t *testing.T) {
	srv, p := newFake(t, sprites.Config{PublicURLs: sprites.Bool(false)})
	ctx := ctxT(t)
	for _, to := range []time.Duration{-1, 500 * time.Microsecond, 120*time.Second + time.Millisecond} {
		_, err := p.CreateNew(ctx, "cn", sandbox.CreateNewOptions{Timeout: to})
		invalid(sprites.ReasonCreateTimeout)(t, err)
	}
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("validation made %d requests", n)
	}
	h, err := p.CreateNew(ctx, "cn", sandbox.CreateNewOptions{WaitForCapacity: true})
	ok(t, err)
	var body map[string]any
	_ = json.Unmarshal(srv.Requests()[0].Body, &body)
	if body["name"] != "cn" || body["wait_for_capacity"] != true || body["url_settings"].(map[string]any)["auth"] != "sprite" {
		t.Fatalf("body %v", body)
	}
	if a, _ := srv.URLAuth("cn"); a != "sprite" || len(srv.Requests()) != 1 {
		t.Fatalf("auth %q after %d requests: no follow-up write expected", a, len(srv.Requests()))
	}
	_, err = p.CreateNew(ctx, "cn", sandbox.CreateNewOptions{})
	is(sandbox.ErrAlreadyExists)(t, err)
	ok(t, p.Destroy(ctx, h))
	h2, err := p.CreateNew(ctx, "cn", sandbox.CreateNewOptions{})
	ok(t, err)
	if h2.InstanceID == h.InstanceID {
		t.Fatal("same instance id after destroy")
	}
}

func TestDestroyOnceAlgorithm(t *testing.T) {
	const path = "/v1/sprites/do"
	del := func(code int, body string) spritestest.Fault { return status("DELETE", path, code, body) }
	get := func(code int, body string) spritestest.Fault { return status("GET", path, code, body) }
	u := unavail(sprites.ReasonDeleteUnconfirmed)
	big := pad(65537)
	cases := []bcase{
		{name: "404 absent after one request", faults: []spritestest.Fault{del(404, "")}, want: ok, requests: 1},
		{name: "200 then GET 404", faults: []spritestest.Fault{del(200, ""), get(404, "")}, want: ok, requests: 2},
		{name: "202 then GET 404", faults: []spritestest.Fault{del(202, ""), get(404, "")}, want: ok, requests: 2},
		{name: "204 then GET 404", faults: []spritestest.Fault{del(204, ""), get(404, "")}, want: ok, requests: 2},
		{name: "oversize 2xx then GET 404", faults: []spritestest.Fault{del(200, big), get(404, "")}, want: ok, requests: 2},
		{name: "oversize 2xx then GET 200", faults: []spritestest.Fault{del(200, big), get(200, "{}")}, want: u, requests: 2},
		{name: "GET 200", faults: []spritestest.Fault{del(204, ""), get(200, "{}")}, want: u, requests: 2},
		{name: "GET 503", faults: []spritestest.Fault{del(204, ""), get(503, prose)}, want: u, requests: 2},
		{name: "GET 302", faults: []spritestest.Fault{del(204, ""), get(302, "")}, want: u, requests: 2},
		{name: "GET transport error", faults: []spritestest.Fault{del(204, ""), {Method: "GET", Drop: true}}, want: u, requests: 2},
		{name: "GET oversize 404", faults: []spritestest.Fault{del(204, ""), get(404, big)}, want: u, requests: 2},
		{name: "DELETE 302", faults: []spritestest.Fault{del(302, "")}, want: u, requests: 1},
		{name: "DELETE 401", faults: []spritestest.Fault{del(401, prose)}, want: u, requests: 1},
		{name: "DELETE 429", faults: []spritestest.Fault{del(429, `{"retry_after_seconds":3}`)}, want: u, requests: 1},
		{name: "DELETE 503", faults: []spritestest.Fault{del(503, prose)}, want: u, requests: 1},
		{name: "DELETE transport error", faults: []spritestest.Fault{{Method: "DELETE", Drop: true}}, want: u, requests: 1},
		{"DELETE stall", []spritestest.Fault{{Method: "DELETE", Stall: 5 * time.Second, Status: 204}}, unavail(sprites.ReasonDeleteTimeout), 1, 150 * time.Millisecond, false, ""},
		{"GET stall", []spritestest.Fault{del(204, ""), {Method: "GET", Stall: 5 * time.Second, Status: 404}}, unavail(sprites.ReasonDeleteTimeout), 2, 150 * time.Millisecond, false, ""},
		{name: "real sprite", want: ok, requests: 2, sprite: "do"}, // the fake's own DELETE 204 then GET 404
	}
	runCases(t, sprites.Config{}, cases, func(ctx context.Context, p *sprites.Provider, tc bcase) error {
		return p.DestroyOnce(ctx, sandbox.BuildHandle("sprites", "do"), sandbox.DestroyOnceOptions{Timeout: tc.timeout})
	})
}

func TestDestroyOnceOptions(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	for _, to := range []time.Duration{-1, 500 * time.Microsecond, 120*time.Second + time.Millisecond} {
		invalid(sprites.ReasonDeleteTimeout)(t, p.DestroyOnce(ctxT(t), sandbox.BuildHandle("sprites", "do"), sandbox.DestroyOnceOptions{Timeout: to}))
	}
	invalid(sandbox.ReasonHandle)(t, p.DestroyOnce(ctxT(t), nil, sandbox.DestroyOnceOptions{}))
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("validation made %d requests", n)
	}
}

func TestTerminateSessionAlgorithm(t *testing.T) {
	const path = "/v1/sprites/ts/exec/17/kill"
	kill := func(code int, body string) []spritestest.Fault {
		return []spritestest.Fault{status("POST", path, code, body)}
	}
	u := unavail(sprites.ReasonTerminationUnconfirmed)
	type tc struct {
		name  string
		force bool
		f     []spritestest.Fault
		want  check
	}
	nd := func(lines ...string) string { return strings.Join(lines, "\n") + "\n" }
	sig := `{"type":"signal","signal":"SIGTERM","pid":17}`
	kil := `{"type":"signal","signal":"SIGKILL","pid":17}`
	cases := []tc{
		{"graceful 404 absent", false, kill(404, prose), ok},
		{"force 404 unconfirmed", true, kill(404, ""), u},
		{"graceful signal timeout killed complete", false, kill(200, nd(sig, `{"type":"timeout"}`, `{"type":"killed"}`, `{"type":"complete","exit_code":137}`)), ok},
		{"graceful exited complete", false, kill(200, nd(`{"type":"exited"}`, `{"type":"complete","exit_code":0}`)), ok},
		{"force sigkill exited complete", true, kill(200, nd(kil, `{"type":"exited"}`, `{"type":"complete","exit_code":137}`)), ok},
		{"401", false, kill(401, prose), httpErr("denied", 401)},
		{"429", false, kill(429, `{"retry_after_seconds":4}`), httpErr("rate_limited", 429)},
		{"503", false, kill(503, prose), httpErr("unavailable", 503)},
		{"302 not followed", false, kill(302, prose), httpErr("invalid", 302)},
		{"410", false, kill(410, prose), httpErr("invalid", 410)},
		{"transport failure", false, []spritestest.Fault{{Method: "POST", Drop: true}}, unavail(sprites.ReasonTerminationTransport)},
		{"truncated", false, []spritestest.Fault{{Method: "POST", Status: 200, Truncate: true, Body: []byte(nd(`{"type":"exited"}`, `{"type":"complete","exit_code":0}`))}}, unavail(sprites.ReasonTerminationTransport)},
		{"oversize", false, kill(200, nd(`{"type":"exited"}`, `{"type":"complete","exit_code":0}`)+pad(16385)), u},
	}
	for _, body := range []string{
		"", nd(sig), nd(`{"type":"complete","exit_code":0}`), nd(`{"type":"killed"}`), "not json\n", "[]\n",
		nd(`{"type":"killed"}`, `{"type":"complete"}`), nd(`{"type":"error","error":"x"}`, `{"type":"killed"}`, `{"type":"complete","exit_code":0}`),
		nd(`{"type":"mystery"}`, `{"type":"killed"}`, `{"type":"complete","exit_code":0}`),
		nd(`{"type":"killed"}`, `{"type":"complete","exit_code":0}`, `{"type":"exited"}`),
		nd(`{"type":"killed"}`, `{"type":"complete","exit_code":-1}`), nd(`{"type":"killed"}`, `{"type":"complete","exit_code":256}`),
		nd(`{"type":"killed"}`, `{"type":"complete","exit_code":1.5}`), nd(`{"type":"killed"}`, `{"type":"complete","exit_code":"137"}`),
	} {
		cases = append(cases, tc{"graceful uncertain " + strings.ReplaceAll(body, "\n", "|"), false, kill(200, body), u})
	}
	for _, s := range []string{`{"type":"signal","signal":null,"pid":17}`, sig, `{"type":"signal","signal":"SIGKILL"}`, `{"type":"signal","signal":"SIGKILL","pid":0}`} {
		cases = append(cases, tc{"force uncertain " + s, true, kill(200, nd(s, `{"type":"exited"}`, `{"type":"complete","exit_code":137}`)), u})
	}
	var bc []bcase
	for _, c := range cases {
		bc = append(bc, bcase{name: c.name, faults: c.f, want: c.want, requests: 1, force: c.force})
	}
	runCases(t, sprites.Config{}, bc, func(ctx context.Context, p *sprites.Provider, tc bcase) error {
		m := sandbox.Graceful
		if tc.force {
			m = sandbox.Force
		}
		return p.TerminateSession(ctx, sandbox.BuildHandle("sprites", "ts"), "17", sandbox.TerminateOptions{Timeout: time.Second, Mode: m})
	})
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestTerminateSessionRequest(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h := sandbox.BuildHandle("sprites", "ts")
	for _, bad := range []struct {
		id   string
		opts sandbox.TerminateOptions
	}{{"", sandbox.TerminateOptions{}}, {"../x", sandbox.TerminateOptions{}}, {"a?x=1", sandbox.TerminateOptions{}},
		{strings.Repeat("a", 257), sandbox.TerminateOptions{}}, {"ok", sandbox.TerminateOptions{Mode: "unknown"}},
		{"ok", sandbox.TerminateOptions{Timeout: 30*time.Second + 1}}, {"ok", sandbox.TerminateOptions{Timeout: -1}}} {
		invalid(sandbox.ReasonTerminationRequest)(t, p.TerminateSession(ctx, h, bad.id, bad.opts))
	}
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("validation made %d requests", n)
	}
	srv.Inject(status("POST", "*", 404, ""))
	srv.Inject(status("POST", "*", 404, ""))
	ok(t, p.TerminateSession(ctx, h, "17", sandbox.TerminateOptions{Timeout: 1500 * time.Millisecond}))
	_ = p.TerminateSession(ctx, h, "17", sandbox.TerminateOptions{Mode: sandbox.Force})
	r := srv.Requests()
	if len(r) != 2 || r[0].Path != "/v1/sprites/ts/exec/17/kill" || r[0].Query().Get("signal") != "SIGTERM" ||
		r[0].Query().Get("timeout") != "1500ms" || len(r[0].Body) != 0 ||
		r[1].Query().Get("signal") != "SIGKILL" || r[1].Query().Get("timeout") != "10000ms" {
		t.Fatalf("requests %+v", r)
	}
}

// TestTerminateSessionTimeout: with a 1 ms allowance the call is bounded by
// 1 ms + 5 s, and the socket is closed then.
func TestTerminateSessionTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("takes 5 s")
	}
	t.Parallel()
	srv, p := newFake(t, sprites.Config{})
	srv.Inject(spritestest.Fault{Method: "POST", Stall: 20 * time.Second, Status: 200})
	start := time.Now()
	err := p.TerminateSession(ctxT(t), sandbox.BuildHandle("sprites", "ts"), "17", sandbox.TerminateOptions{Timeout: time.Millisecond})
	unavail(sprites.ReasonTerminationTimeout)(t, err)
	if d := time.Since(start); d > 6500*time.Millisecond {
		t.Fatalf("took %v", d)
	}
	waitFor(t, func() bool { return srv.Abandoned() == 1 }, "the server to see the socket closed")
}

func TestCreateCheckpointOnceAlgorithm(t *testing.T) {
	const comment = "sandbox-operation:op-1"
	postP, getP := "/v1/sprites/cp/checkpoint", "/v1/sprites/cp/checkpoints"
	complete := "{\"type\":\"info\",\"data\":\"Creating\"}\n{\"type\":\"complete\",\"data\":\"done\"}\n"
	post := func(code int, body string) spritestest.Fault { return status("POST", postP, code, body) }
	get := func(code int, body string) spritestest.Fault { return status("GET", getP, code, body) }
	match := `{"id":"v2","comment":"` + comment + `"}`
	u := unavail(sprites.ReasonCheckpointUnconfirmed)
	cases := []bcase{
		{name: "confirmed", faults: []spritestest.Fault{post(200, complete), get(200, `[{"id":"Current"},{"id":"v1"},`+match+`]`)}, want: ok, requests: 2},
		{name: "complete only", faults: []spritestest.Fault{post(200, `{"type":"complete","data":""}`), get(200, `[`+match+`]`)}, want: ok, requests: 2},
		{name: "budget exactly 64KiB", faults: []spritestest.Fault{post(200, complete), get(200, `[`+match+pad(65536-len(complete)-len(match)-2)+`]`)}, want: ok, requests: 2},
		{name: "budget exceeded across both", faults: []spritestest.Fault{post(200, complete), get(200, `[`+match+pad(65536-len(match)-2)+`]`)}, want: u, requests: 2},
		{name: "POST oversize", faults: []spritestest.Fault{post(200, complete+pad(65537-len(complete)))}, want: u, requests: 1},
		{name: "POST truncated with complete", faults: []spritestest.Fault{{Method: "POST", Status: 200, Body: []byte(complete), Truncate: true}}, want: u, requests: 1},
		{name: "POST transport error", faults: []spritestest.Fault{{Method: "POST", Drop: true}}, want: u, requests: 1},
		{name: "POST stall", faults: []spritestest.Fault{{Method: "POST", Stall: 5 * time.Second, Status: 200}}, want: unavail(sprites.ReasonCheckpointTimeout), requests: 1, timeout: 100 * time.Millisecond},
		{name: "GET gets only the remaining time", faults: []spritestest.Fault{{Method: "POST", Stall: 150 * time.Millisecond, Status: 200, Body: []byte(complete)},
			{Method: "GET", Stall: 200 * time.Millisecond, Status: 200, Body: []byte(`[` + match + `]`)}}, want: unavail(sprites.ReasonCheckpointTimeout), requests: 2, timeout: 250 * time.Millisecond},
	}
	for _, code := range []int{201, 202, 204, 302, 400, 401, 404, 429, 500, 503} {
		cases = append(cases, bcase{name: "POST " + http.StatusText(code), faults: []spritestest.Fault{post(code, complete)}, want: u, requests: 1})
	}
	for _, body := range []string{"", "not-json", "[]", "{}", `{"type":"info","data":"x"}`, `{"type":"error","error":"x"}`,
		`{"type":"complete","data":7}`, `{"type":"complete","data":"x","error":"boom"}`,
		"{\"type\":\"info\",\"data\":\"x\",\"error\":null}\n{\"type\":\"complete\",\"data\":\"x\"}",
		"{\"type\":\"complete\",\"data\":\"x\"}\n{\"type\":\"complete\",\"data\":\"x\"}",
		"{\"type\":\"complete\",\"data\":\"x\"}\n{\"type\":\"info\",\"data\":\"x\"}"} {
		cases = append(cases, bcase{name: "POST stream " + strings.ReplaceAll(body, "\n", "|"), faults: []spritestest.Fault{post(200, body)}, want: u, requests: 1})
	}
	for _, code := range []int{202, 302, 404, 429, 503} {
		cases = append(cases, bcase{name: "GET " + http.StatusText(code), faults: []spritestest.Fault{post(200, complete), get(code, `[`+match+`]`)}, want: u, requests: 2})
	}
	for _, body := range []string{"not-json", "{}", "[]", "[null]", "[4]", `[{"id":null}]`, `[{"id":"v1","comment":"sandbox-operation:other"}]`,
		`[{"id":"Current","comment":"` + comment + `"}]`, `[` + match + `,{"id":"v3","comment":"` + comment + `"}]`,
		`[{"id":"","comment":"` + comment + `"}]`, `[{"id":"` + strings.Repeat("i", 257) + `","comment":"` + comment + `"}]`,
		`[` + match + `,{"id":"v9","comment":5}]`} {
		cases = append(cases, bcase{name: "GET listing " + body[:min(len(body), 40)], faults: []spritestest.Fault{post(200, complete), get(200, body)}, want: u, requests: 2})
	}
	runCases(t, sprites.Config{CheckpointCreationEnabled: true}, cases, func(ctx context.Context, p *sprites.Provider, tc bcase) error {
		id, err := p.CreateCheckpointOnce(ctx, sandbox.BuildHandle("sprites", "cp"), sandbox.CheckpointOnceOptions{Timeout: tc.timeout, OperationID: "op-1"})
		if err == nil && id != "v2" {
			return errors.New("wrong id " + id)
		}
		return err
	})
}

func TestCreateCheckpointOnceOptions(t *testing.T) {
	srv, p := newFake(t, sprites.Config{CheckpointCreationEnabled: true})
	_, off := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h := sandbox.BuildHandle("sprites", "cp")
	for _, to := range []time.Duration{-1, 500 * time.Microsecond, 120*time.Second + time.Millisecond} {
		_, err := p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{Timeout: to, OperationID: "op"})
		invalid(sprites.ReasonCheckpointTimeout)(t, err)
		_, err = off.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{Timeout: to, OperationID: "op"})
		invalid(sprites.ReasonCheckpointTimeout)(t, err) // options before the flag
	}
	for _, id := range []string{"", "contains space", "a\n", strings.Repeat("a", 129), "ü"} {
		_, err := p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: id})
		invalid(sprites.ReasonCheckpointOperationID)(t, err)
	}
	_, err := off.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op"})
	is(sandbox.ErrNotSupported)(t, err)
	if n := len(srv.Requests()); n != 0 {
		t.Fatalf("validation made %d requests", n)
	}
	// The exact request body, and a real round trip on the fake.
	hh, err := p.Create(ctx, "cp", sandbox.CreateOptions{})
	ok(t, err)
	srv.ResetRequests()
	id, err := p.CreateCheckpointOnce(ctx, hh, sandbox.CheckpointOnceOptions{OperationID: "op-" + strings.Repeat("x", 125)})
	ok(t, err)
	r := srv.Requests()
	if len(r) != 2 || r[0].Path != "/v1/sprites/cp/checkpoint" || string(r[0].Body) != `{"comment":"sandbox-operation:op-`+strings.Repeat("x", 125)+`"}` ||
		r[1].Method != "GET" || r[1].Path != "/v1/sprites/cp/checkpoints" || id == "" {
		t.Fatalf("id %q requests %+v", id, r)
	}
}

// TestCreateCheckpointOnceCallerGone: the caller's cancellation returns at
// once, and the request is still torn down at its own deadline.
func TestCreateCheckpointOnceCallerGone(t *testing.T) {
	srv, p := newFake(t, sprites.Config{CheckpointCreationEnabled: true})
	srv.Inject(spritestest.Fault{Method: "POST", Stall: 20 * time.Second, Status: 200})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	_, err := p.CreateCheckpointOnce(ctx, sandbox.BuildHandle("sprites", "cp"), sandbox.CheckpointOnceOptions{Timeout: 300 * time.Millisecond, OperationID: "op"})
	unavail(sprites.ReasonCheckpointTimeout)(t, err)
	if !errors.Is(err, context.Canceled) || time.Since(start) > 250*time.Millisecond {
		t.Fatalf("err %v after %v", err, time.Since(start))
	}
	waitFor(t, func() bool { return srv.Abandoned() == 1 }, "the socket closed at the deadline")
	// A context cancelled before anything was sent sends nothing.
	srv.ResetRequests()
	_, err = p.CreateCheckpointOnce(ctx, sandbox.BuildHandle("sprites", "cp"), sandbox.CheckpointOnceOptions{OperationID: "op2"})
	if !errors.Is(err, context.Canceled) || len(srv.Requests()) != 0 {
		t.Fatalf("err %v, %d requests", err, len(srv.Requests()))
	}
}
