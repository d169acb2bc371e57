package sprites_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

func kindIs(t *testing.T, err error, kind string) {
	t.Helper()
	if sandbox.Kind(err) != kind {
		t.Fatalf("err = %v (kind %s), want %s", err, sandbox.Kind(err), kind)
	}
}

// TestUpgradeStatuses: a refused exec upgrade goes through the §3.2
// table; the Elixir adapter left these as a transient provider error, so a 401
// was retried.
func TestUpgradeStatuses(t *testing.T) {
	for _, tc := range []struct {
		status int
		header map[string]string
		body   string
		kind   string
		after  time.Duration
	}{
		{401, nil, `{"error":"unauthorized"}`, "denied", 0},
		{403, nil, "", "denied", 0},
		{404, nil, "", "not_found", 0},
		{503, nil, "booting", "unavailable", 0},
		{429, nil, `{"retry_after_seconds":5}`, "rate_limited", 5 * time.Second},
		{429, map[string]string{"Retry-After": "7"}, "", "rate_limited", 7 * time.Second},
		{302, map[string]string{"Location": "http://127.0.0.1:1/"}, "", "invalid", 0},
		{200, nil, "not a websocket", "invalid", 0},
	} {
		t.Run(fmt.Sprint(tc.status, tc.header), func(t *testing.T) {
			t.Parallel()
			srv, p := newFake(t, sprites.Config{})
			srv.AddSprite("ws")
			srv.Inject(spritestest.Fault{Path: "/v1/sprites/ws/exec", Status: tc.status, Header: tc.header, Body: []byte(tc.body)})
			h := sandbox.BuildHandle("sprites", "ws")
			_, err := p.Spawn(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
			kindIs(t, err, tc.kind)
			var rl *sandbox.RateLimitedError
			if errors.As(err, &rl) && rl.RetryAfter != tc.after {
				t.Fatalf("RetryAfter %v, want %v", rl.RetryAfter, tc.after)
			}
			_, err = p.Exec(ctxT(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{})
			kindIs(t, err, tc.kind)
			if tc.status == 401 && sandbox.Transient(err) {
				t.Fatal("a 401 upgrade must not be transient")
			}
		})
	}
}

func TestRESTErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault spritestest.Fault
		cfg   sprites.Config
		kind  string
		check func(t *testing.T, err error)
	}{
		{name: "404", fault: spritestest.Fault{Status: 404}, kind: "not_found"},
		{name: "401", fault: spritestest.Fault{Status: 401}, kind: "denied"},
		{name: "403", fault: spritestest.Fault{Status: 403}, kind: "denied"},
		{name: "418", fault: spritestest.Fault{Status: 418}, kind: "invalid"},
		{name: "302", fault: spritestest.Fault{Status: 302, Header: map[string]string{"Location": "/v1/sprites/other"}}, kind: "invalid"},
		{name: "500", fault: spritestest.Fault{Status: 500}, kind: "unavailable"},
		{name: "599", fault: spritestest.Fault{Status: 599}, kind: "unavailable"},
		{name: "429 body", fault: spritestest.Fault{Status: 429, Body: []byte(`{"error":"sprite_creation_rate_limited","retry_after_seconds":30}`)}, kind: "rate_limited",
			check: func(t *testing.T, err error) {
				var rl *sandbox.RateLimitedError
				if errors.As(err, &rl); rl.RetryAfter != 30*time.Second {
					t.Fatalf("retry after %v", rl.RetryAfter)
				}
			}},
		{name: "429 negative body, header", fault: spritestest.Fault{Status: 429, Header: map[string]string{"Retry-After": "2"}, Body: []byte(`{"retry_after_seconds":-1}`)}, kind: "rate_limited",
			check: func(t *testing.T, err error) {
				var rl *sandbox.RateLimitedError
				if errors.As(err, &rl); rl.RetryAfter != 2*time.Second {
					t.Fatalf("retry after %v", rl.RetryAfter)
				}
			}},
		{name: "body over the cap", fault: spritestest.Fault{Status: 200, Oversize: 9 << 20}, kind: "unavailable",
			check: func(t *testing.T, err error) { unavail("body_too_large")(t, err) }},
		{name: "timeout", cfg: sprites.Config{Timeout: 100 * time.Millisecond}, fault: spritestest.Fault{Stall: 5 * time.Second, Status: 200}, kind: "unavailable",
			check: func(t *testing.T, err error) { unavail(sandbox.ReasonTimeout)(t, err) }},
		{name: "transport", fault: spritestest.Fault{Drop: true}, kind: "unavailable",
			check: func(t *testing.T, err error) { unavail(sandbox.ReasonTransport)(t, err) }},
		{name: "truncated", fault: spritestest.Fault{Status: 200, Body: []byte(`{"status":"running"}`), Truncate: true}, kind: "unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, p := newFake(t, tc.cfg)
			srv.Inject(tc.fault)
			_, err := p.Get(ctxT(t), sandbox.BuildHandle("sprites", "g"))
			kindIs(t, err, tc.kind)
			if tc.check != nil {
				tc.check(t, err)
			}
			if n := len(srv.Requests()); n != 1 {
				t.Fatalf("%d requests (retry or redirect followed)", n)
			}
		})
	}
}

func TestGetAndStatus(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "st", sandbox.CreateOptions{})
	ok(t, err)
	for status, want := range map[string]sandbox.Status{"running": sandbox.StatusRunning, "warm": sandbox.StatusUnknown,
		"migrating": sandbox.StatusUnknown, "stopped": sandbox.StatusSuspended} {
		srv.SetStatus("st", status)
		info, err := p.Get(ctx, h)
		ok(t, err)
		var raw map[string]any
		if info.Status != want || json.Unmarshal(info.Raw, &raw) != nil || raw["status"] != status {
			t.Fatalf("%s: %+v", status, info)
		}
	}
	_, err = p.Get(ctx, sandbox.BuildHandle("sprites", "never"))
	is(sandbox.ErrNotFound)(t, err)
	_, err = p.Get(ctx, sandbox.BuildHandle("fake", "st"))
	invalid(sandbox.ReasonHandle)(t, err)
	_, err = p.Get(ctx, nil)
	invalid(sandbox.ReasonHandle)(t, err)
	ok(t, p.Suspend(ctx, sandbox.BuildHandle("sprites", "never")))
	_, err = p.Resume(ctx, sandbox.BuildHandle("sprites", "never"))
	is(sandbox.ErrNotFound)(t, err)
	r, err := p.Resume(ctx, h)
	if err != nil || r != h {
		t.Fatalf("resume %v %v", r, err)
	}
}

func TestCreate(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	_, err := p.Create(ctx, "c1", sandbox.CreateOptions{})
	ok(t, err)
	r := srv.Requests()
	if len(r) != 2 || r[0].Method != "POST" || string(r[0].Body) != `{"name":"c1"}` || r[1].Method != "PUT" || string(r[1].Body) != `{"url_settings":{"auth":"public"}}` {
		t.Fatalf("requests %+v", r)
	}
	srv.ResetRequests()
	h, err := p.Create(ctx, "c1", sandbox.CreateOptions{}) // 409: adopt, no URL update
	if err != nil || h.Name != "c1" || len(srv.Requests()) != 1 {
		t.Fatalf("adopt: %v %v, %d requests", h, err, len(srv.Requests()))
	}
	// A failing URL update is logged and ignored.
	srv.Inject(spritestest.Fault{Method: "PUT", Status: 500})
	_, err = p.Create(ctx, "c2", sandbox.CreateOptions{})
	ok(t, err)
	srv.Inject(spritestest.Fault{Method: "POST", Status: 500, Body: []byte("boom")})
	_, err = p.Create(ctx, "c3", sandbox.CreateOptions{})
	kindIs(t, err, "unavailable")
	_, err = p.Create(ctx, "bad/name", sandbox.CreateOptions{})
	invalid(sandbox.ReasonName)(t, err)
	_, err = p.Create(ctx, "c4", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 3}})
	invalid("limits")(t, err)

	srv2, p2 := newFake(t, sprites.Config{PublicURLs: sprites.Bool(false)})
	_, err = p2.Create(ctx, "c1", sandbox.CreateOptions{})
	ok(t, err)
	if n := len(srv2.Requests()); n != 1 {
		t.Fatalf("PublicURLs=false made %d requests", n)
	}
	if a, _ := srv2.URLAuth("c1"); a != "sprite" {
		t.Fatalf("auth %q", a)
	}
}

func TestListAllNames(t *testing.T) {
	srv := spritestest.NewServer(spritestest.Options{PageSize: 1})
	t.Cleanup(srv.Close)
	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	ok(t, err)
	ctx := ctxT(t)
	for i := range 40 {
		srv.AddSprite(fmt.Sprintf("n%02d", i))
	}
	names, err := p.ListAllNames(ctx)
	if err != nil || len(names) != 40 || names[0] != "n00" || names[39] != "n39" {
		t.Fatalf("40 pages: %d names, %v", len(names), err)
	}
	srv.AddSprite("n40")
	srv.ResetRequests()
	_, err = p.ListAllNames(ctx)
	is(sandbox.ErrTruncated)(t, err)
	if n := len(srv.Requests()); n != 40 {
		t.Fatalf("%d pages fetched, want 40", n)
	}
	// has_more without a token (absent or empty) cannot go on: what was
	// collected is a part, not the whole.
	for _, body := range []string{`{"sprites":[{"name":"a"}],"has_more":true}`, `{"sprites":[{"name":"a"}],"has_more":true,"next_continuation_token":""}`} {
		srv.Inject(spritestest.Fault{Method: "GET", Path: "/v1/sprites", Times: 1, Status: 200, Body: []byte(body)})
		names, err = p.ListAllNames(ctx)
		if !errors.Is(err, sandbox.ErrTruncated) {
			t.Fatalf("has_more with no token: %v %v, want ErrTruncated", names, err)
		}
	}
	// has_more false with a stray token is the end.
	srv.Inject(spritestest.Fault{Method: "GET", Path: "/v1/sprites", Times: 1, Status: 200, Body: []byte(`{"sprites":[{"name":"a"}],"has_more":false,"next_continuation_token":"x"}`)})
	if names, err = p.ListAllNames(ctx); err != nil || len(names) != 1 {
		t.Fatalf("has_more false: %v %v", names, err)
	}
	srv.Inject(spritestest.Fault{Method: "GET", Path: "/v1/sprites", Times: 1, Status: 503})
	_, err = p.ListAllNames(ctx)
	kindIs(t, err, "unavailable")
	srv.Inject(spritestest.Fault{Method: "GET", Path: "/v1/sprites", Times: 1, Status: 200, Body: []byte(`{"items":[]}`)})
	_, err = p.ListAllNames(ctx)
	kindIs(t, err, "invalid")
}

func TestNetworkPolicy(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "np", sandbox.CreateOptions{})
	ok(t, err)
	ok(t, p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}))
	if pol, _ := srv.Policy("np"); string(pol) != `{"rules":[{"action":"deny","domain":"*"}]}` {
		t.Fatalf("deny-all policy %s", pol)
	}
	ok(t, p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"a.example", "b.example"}}))
	if pol, _ := srv.Policy("np"); string(pol) != `{"rules":[{"action":"allow","domain":"a.example"},{"action":"allow","domain":"b.example"}]}` {
		t.Fatalf("allow policy %s", pol)
	}
	srv.Inject(spritestest.Fault{Times: 1, Status: 400, Body: []byte("bad rule")})
	err = p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{})
	invalid("network_policy")(t, err)
	if sandbox.Transient(err) {
		t.Fatal("policy 400 must not be transient")
	}
	srv.Inject(spritestest.Fault{Times: 1, Status: 200})
	kindIs(t, p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{}), "invalid")
}

func TestPolicyTimeoutIsItsOwn(t *testing.T) {
	srv, p := newFake(t, sprites.Config{Timeout: 50 * time.Millisecond, PolicyTimeout: 5 * time.Second})
	srv.AddSprite("np")
	srv.Inject(spritestest.Fault{Method: "POST", Stall: 200 * time.Millisecond}) // slow, then the real answer
	ok(t, p.ApplyNetworkPolicy(ctxT(t), sandbox.BuildHandle("sprites", "np"), sandbox.NetworkPolicy{}))
}

func TestPublicURL(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "pu", sandbox.CreateOptions{})
	ok(t, err)
	u, err := p.PublicURL(ctx, h)
	if err != nil || !strings.HasPrefix(u, "https://") {
		t.Fatalf("%q %v", u, err)
	}
	srv.Inject(spritestest.Fault{Times: 1, Status: 200, Body: []byte(`{"name":"pu","url":""}`)})
	_, err = p.PublicURL(ctx, h)
	is(sandbox.ErrUnsupported)(t, err)
	srv.Inject(spritestest.Fault{Times: 1, Status: 503})
	_, err = p.PublicURL(ctx, h)
	kindIs(t, err, "unavailable")
	_, err = p.PublicURL(ctx, sandbox.BuildHandle("sprites", "never"))
	is(sandbox.ErrNotFound)(t, err)
}

func TestWriteFile(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "wf", sandbox.CreateOptions{})
	ok(t, err)
	srv.ResetRequests()
	ok(t, p.WriteFile(ctx, h, "/home/sprite/a/b.txt", []byte("data"), sandbox.WriteFileOptions{Mode: 0o600}))
	ok(t, p.WriteFile(ctx, h, "/home/sprite/c.txt", nil, sandbox.WriteFileOptions{}))
	r := srv.Requests()
	if q := r[0].Query(); q.Get("mode") != "600" || q.Get("path") != "/home/sprite/a/b.txt" || q.Get("workingDir") != "/" || q.Get("mkdirParents") != "true" {
		t.Fatalf("query %v", q)
	}
	if q := r[1].Query(); q.Get("mode") != "644" {
		t.Fatalf("default mode %v", q)
	}
	if b, err := srv.File("wf", "/home/sprite/a/b.txt"); err != nil || string(b) != "data" {
		t.Fatalf("%q %v", b, err)
	}
	kindIs(t, p.WriteFile(ctx, sandbox.BuildHandle("sprites", "never"), "/x", []byte("x"), sandbox.WriteFileOptions{}), "not_found")
}

func TestSessionsAndTTY(t *testing.T) {
	_, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "tty", sandbox.CreateOptions{})
	ok(t, err)
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "read x; echo got-$x; echo to-err >&2; exit 5"}},
		sandbox.SpawnOptions{TTY: true, Stdin: true, Detachable: true, TTYRows: 30, TTYCols: 100})
	ok(t, err)
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || !ss[0].TTY || ss[0].CreatedAt.IsZero() || !strings.Contains(ss[0].Command, "read x") {
		t.Fatalf("sessions %+v %v", ss, err)
	}
	ok(t, c.WriteStdin(ctx, []byte("hi\r")))
	var out strings.Builder
	var last sandbox.Event
	for ev := range c.Events() {
		if ev.Kind == sandbox.Stderr {
			t.Fatal("stderr event in TTY mode")
		}
		if ev.Terminal() {
			last = ev
			break
		}
		out.Write(ev.Data)
	}
	if last.Kind != sandbox.Exit || last.Code != 5 || !strings.Contains(out.String(), "got-hi") || !strings.Contains(out.String(), "to-err") {
		t.Fatalf("out %q last %+v", out.String(), last)
	}
	if sprites.SessionID(c) != ss[0].ID {
		t.Fatalf("session id %q vs %q", sprites.SessionID(c), ss[0].ID)
	}
	// Attach learns the TTY mode from session_info and replays raw bytes.
	a, err := p.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{})
	ok(t, err)
	evs := collect(t, a)
	if e := evs[len(evs)-1]; e.Kind != sandbox.Exit || e.Code != 5 {
		t.Fatalf("attach end %+v", e)
	}
	_, err = p.Attach(ctx, h, "999", sandbox.AttachOptions{})
	is(sandbox.ErrNotFound)(t, err)
	_ = c.Stop()
}

func TestPortNoticeDropped(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "port", sandbox.CreateOptions{})
	ok(t, err)
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
	ok(t, err)
	next(t, c)
	waitFor(t, func() bool { return sprites.SessionID(c) != "" }, "session_info")
	if !srv.NotifyPort("port", sprites.SessionID(c), 8080) {
		t.Fatal("no session")
	}
	ok(t, c.CloseStdin(ctx))
	if ev := next(t, c); ev.Kind != sandbox.Exit {
		t.Fatalf("got %+v, want only the exit", ev)
	}
}

func TestCheckpoints(t *testing.T) {
	srv, p := newFake(t, sprites.Config{CheckpointCreationEnabled: true})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "cps", sandbox.CreateOptions{})
	ok(t, err)
	ok(t, p.WriteFile(ctx, h, "/f", []byte("one"), sandbox.WriteFileOptions{}))
	id1, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{Comment: "env x"})
	ok(t, err)
	ok(t, p.WriteFile(ctx, h, "/f", []byte("two"), sandbox.WriteFileOptions{}))
	id2, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{Comment: "env x"})
	ok(t, err)
	if _, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{}); err != nil {
		t.Fatal(err)
	}
	if id1 == id2 {
		t.Fatal("same id")
	}
	ok(t, p.RestoreCheckpoint(ctx, h, id1))
	if b, _ := srv.File("cps", "/f"); string(b) != "one" {
		t.Fatalf("restored %q", b)
	}
	var rf *sandbox.RestoreFailedError
	if err := p.RestoreCheckpoint(ctx, h, "v99"); !errors.As(err, &rf) || !strings.Contains(rf.Detail, "not found") {
		t.Fatalf("restore of an unknown id = %v", err)
	}
	srv.Inject(spritestest.Fault{Times: 1, Status: 200, Body: []byte(`{"type":"info","data":"x","error":"disk full"}` + "\n")})
	if err := p.RestoreCheckpoint(ctx, h, id1); !errors.As(err, &rf) || rf.Detail != "disk full" {
		t.Fatalf("error field on info = %v", err)
	}
	// Newest matching comment wins; Current is ignored.
	srv.Inject(spritestest.Fault{Method: "POST", Times: 1, Status: 200, Body: []byte(`{"type":"complete","data":"ok"}`)})
	srv.Inject(spritestest.Fault{Method: "GET", Times: 1, Status: 200, Body: []byte(`[{"id":"Current","create_time":"2026-01-01T12:00:00Z","comment":"env x"},` +
		`{"id":"v2","create_time":"2026-01-01T11:00:00Z","comment":"env x"},{"id":"v1","create_time":"2026-01-01T10:00:00Z","comment":"env x"},` +
		`{"id":"v3","create_time":"2026-01-01T13:00:00Z","comment":"other"}]`)})
	if id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{Comment: "env x"}); err != nil || id != "v2" {
		t.Fatalf("%q %v", id, err)
	}
	srv.Inject(spritestest.Fault{Method: "GET", Times: 1, Status: 503})
	_, err = p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	var pe *sandbox.ProviderError
	if !errors.As(err, &pe) || pe.Reason != "no_checkpoint_id" {
		t.Fatalf("failing listing = %v", err)
	}
	srv.Inject(spritestest.Fault{Method: "POST", Times: 1, Status: 503})
	_, err = p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	kindIs(t, err, "unavailable")

	srvOff, off := newFake(t, sprites.Config{})
	_, err = off.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	is(sandbox.ErrNotSupported)(t, err)
	is(sandbox.ErrNotSupported)(t, off.RestoreCheckpoint(ctx, h, "v1"))
	if len(srvOff.Requests()) != 0 {
		t.Fatal("flag off contacted Sprites")
	}
}

func TestCapabilities(t *testing.T) {
	_, off := newFake(t, sprites.Config{})
	_, on := newFake(t, sprites.Config{CheckpointCreationEnabled: true})
	want := "[attach create_new destroy_once force_terminate_session network_policy public_url suspend terminate_session tty]"
	if got := fmt.Sprint([]sandbox.Capability(off.Capabilities())); got != want {
		t.Fatalf("off: %s", got)
	}
	if c := on.Capabilities(); !c.Has(sandbox.CapCheckpoint) || !c.Has(sandbox.CapCreateCheckpointOnce) || len(c) != 11 {
		t.Fatalf("on: %v", c)
	}
	if off.Name() != "sprites" {
		t.Fatal(off.Name())
	}
}

func TestFakeCloseWithoutExitAndAttachFallback(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "cwe", sandbox.CreateOptions{})
	ok(t, err)
	srv.Inject(spritestest.Fault{Path: "/v1/sprites/cwe/exec", Times: 1, CloseWithoutExit: true, Body: []byte("partial")})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
	ok(t, err)
	evs := collect(t, c)
	if len(evs) != 2 || string(evs[0].Data) != "partial" || !sandbox.IsClosedBeforeExit(evs[1].Err) {
		t.Fatalf("events %+v", evs)
	}
	// A dropped session replays its output, then closed_before_exit again.
	d, err := p.Spawn(ctx, h, sandbox.Cmd{Name: spritestest.DropCommand, Args: []string{"gone"}}, sandbox.SpawnOptions{Detachable: true})
	ok(t, err)
	collect(t, d)
	id := sprites.SessionID(d)
	// The path form is refused once (an older server): Attach retries the
	// legacy ?id= form.
	srv.ResetRequests()
	srv.Inject(spritestest.Fault{Path: "/v1/sprites/cwe/exec/" + id, Times: 1, Status: 404})
	a, err := p.Attach(ctx, h, id, sandbox.AttachOptions{})
	ok(t, err)
	evs = collect(t, a)
	if len(evs) != 2 || string(evs[0].Data) != "gone\n" || !sandbox.IsClosedBeforeExit(evs[1].Err) {
		t.Fatalf("attach events %+v", evs)
	}
	if r := srv.Requests(); len(r) != 2 || r[1].Query().Get("id") != id {
		t.Fatalf("requests %+v", r)
	}
}

// TestTerminateEscalates: a process that ignores SIGTERM is killed after
// the allowance, and that is still a confirmed termination; force mode is
// confirmed by the SIGKILL signal event.
func TestTerminateEscalates(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "esc", sandbox.CreateOptions{})
	ok(t, err)
	stubborn := sandbox.Cmd{Name: "sh", Args: []string{"-c", `trap "" TERM; echo ready; while :; do sleep 0.05; done`}}
	for _, mode := range []sandbox.TerminateMode{sandbox.Graceful, sandbox.Force} {
		c, err := p.Spawn(ctx, h, stubborn, sandbox.SpawnOptions{Detachable: true})
		ok(t, err)
		next(t, c)
		waitFor(t, func() bool { return sprites.SessionID(c) != "" }, "session_info")
		id := sprites.SessionID(c)
		ok(t, p.TerminateSession(ctx, h, id, sandbox.TerminateOptions{Timeout: 200 * time.Millisecond, Mode: mode}))
		if srv.SessionRunning("esc", id) {
			t.Fatal("still running")
		}
		if ev := next(t, c); ev.Kind != sandbox.Exit || ev.Code != 137 {
			t.Fatalf("%s: %+v", mode, ev)
		}
	}
}

// TestNetworkPolicyRefusesWhatIsNotADomain: an address, a CIDR or a port
// is refused Invalid{network_policy} before any request (a Sprites rule
// names a domain: 10.0.0.0/8 sent as one matched nothing and allowed
// nothing the caller asked for), and the policy in force is unchanged.
func TestNetworkPolicyRefusesWhatIsNotADomain(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "npd", sandbox.CreateOptions{})
	ok(t, err)
	ok(t, p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"*.example.org"}}))
	before, _ := srv.Policy("npd")
	for _, e := range []string{"10.0.0.0/8", "192.0.2.1", "example.com:443", "[2001:db8::1]:443"} {
		err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"a.example", e}})
		invalid("network_policy")(t, err)
		if !strings.Contains(err.Error(), e) {
			t.Errorf("%s: the error does not name the entry: %v", e, err)
		}
	}
	if after, _ := srv.Policy("npd"); string(after) != string(before) {
		t.Fatalf("policy changed by refused lists: %s, was %s", after, before)
	}
}
