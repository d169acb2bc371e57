package e2b_test

// Behaviours of the real service that the fake models (issue 21): the
// sandbox's own domain, Retry-After as a header, 409 as a state change.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// hostRouter is an HTTP client that resolves names the way E2B's DNS
// would for the fake: api.<anything> is the control plane, 49983-<id>.<any
// domain> is envd (which itself refuses a domain that is not its
// cluster's). It records every host it dialled.
type hostRouter struct {
	mu     sync.Mutex
	dialed []string
}

func (hr *hostRouter) client(srv *e2btest.Server) *http.Client {
	api := strings.TrimPrefix(srv.APIURL(), "http://")
	envd := strings.TrimPrefix(srv.SandboxURL(), "http://")
	var d net.Dialer
	tr := &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, _ := net.SplitHostPort(addr)
		hr.mu.Lock()
		hr.dialed = append(hr.dialed, addr)
		hr.mu.Unlock()
		switch {
		case strings.HasPrefix(host, "api."):
			return d.DialContext(ctx, network, api)
		case strings.HasPrefix(host, "49983-"):
			return d.DialContext(ctx, network, envd)
		}
		return nil, errors.New("no such host " + host)
	}}
	return &http.Client{Transport: tr}
}

func (hr *hostRouter) hosts() []string {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return append([]string(nil), hr.dialed...)
}

// A team on its own cluster: the create answer names the sandbox's domain,
// which is not the API URL's; every envd call must go there. A second
// provider (another CLI run) that did not create the sandbox finds the
// domain through GET /sandboxes/{id}.
func TestEnvdUsesTheSandboxDomain(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{Domain: "byoc.example", AnnounceDomain: true})
	defer srv.Close()
	hr := &hostRouter{}
	cfg := e2b.Config{APIKey: srv.APIKey(), APIURL: "http://api.e2b.test", User: srv.User(),
		HTTPClient: hr.client(srv), RequestTimeout: 5 * time.Second}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h, err := p.Create(ctx(t), "byoc-1", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"hi"}}, sandbox.ExecOptions{Timeout: 10 * time.Second})
	if err != nil || string(res.Output) != "hi\n" {
		t.Fatalf("Exec on a sandbox of another domain = %q, %v", res.Output, err)
	}
	id := h.Private.(string)
	want := "49983-" + id + ".byoc.example:80"
	for _, a := range hr.hosts() {
		if strings.HasPrefix(a, "49983-") && a != want {
			t.Fatalf("envd dialled at %s, want %s", a, want)
		}
	}

	p2, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	srv.ResetRequests()
	if err := p2.WriteFile(ctx(t), h, "/home/user/x", []byte("x"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatalf("WriteFile from a provider that did not create the sandbox: %v", err)
	}
	detail := false
	for _, r := range srv.Requests() {
		if r.Plane == e2btest.API && r.Method == http.MethodGet && r.Path == "/sandboxes/"+id {
			detail = true
		}
	}
	if !detail {
		t.Fatal("the domain of a sandbox this provider did not create was not read from GET /sandboxes/{id}")
	}

	// A paused sandbox's detail names no domain; the connect that resumes
	// it does.
	p3, _ := e2b.New(cfg)
	defer p3.Close()
	srv.Pause(id)
	if _, err := p3.Exec(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatalf("Exec after a pause, from a fresh provider: %v", err)
	}
}

// The default cluster answers "domain": null; the client's domain
// (E2B_DOMAIN) is the envd domain, and also names the control plane when
// no API URL is given.
func TestDomainFromConfig(t *testing.T) {
	srv := e2btest.NewServer(e2btest.Options{Domain: "corp.example"})
	defer srv.Close()
	hr := &hostRouter{}
	p, err := e2b.New(e2b.Config{APIKey: srv.APIKey(), APIURL: "http://api.e2b.test", Domain: "corp.example",
		User: srv.User(), HTTPClient: hr.client(srv), RequestTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	h, err := p.Create(ctx(t), "corp-1", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"ok"}}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil || string(res.Output) != "ok\n" {
		t.Fatalf("Exec = %q, %v", res.Output, err)
	}

	t.Setenv("E2B_API_KEY", "k")
	t.Setenv("E2B_API_URL", "")
	t.Setenv("E2B_BASE_URL", "")
	t.Setenv("E2B_DOMAIN", "corp.example")
	cfg := e2b.ConfigFromEnv()
	if cfg.Domain != "corp.example" {
		t.Fatalf("ConfigFromEnv().Domain = %q", cfg.Domain)
	}
	hr2 := &hostRouter{}
	cfg.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		hr2.mu.Lock()
		hr2.dialed = append(hr2.dialed, addr)
		hr2.mu.Unlock()
		return nil, errors.New("offline")
	}}}
	p2, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Close()
	_, _ = p2.ListAllNames(ctx(t))
	if got := hr2.hosts(); len(got) == 0 || got[0] != "api.corp.example:443" {
		t.Fatalf("with E2B_DOMAIN=corp.example the control plane was dialled at %v, want api.corp.example:443", got)
	}
}

// E2B's rate limiter puts the wait in a Retry-After header (seconds or an
// HTTP-date), never in the body.
func TestRetryAfterHeader(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("ra-1")
	body := `{"code":429,"message":"Rate limit exceeded"}`
	rows := []struct {
		name   string
		header map[string]string
		body   string
		want   time.Duration
		slack  time.Duration
	}{
		{"seconds", map[string]string{"Retry-After": "7"}, body, 7 * time.Second, 0},
		{"http-date", map[string]string{"Retry-After": "+30s"}, body, 30 * time.Second, 2 * time.Second},
		{"past date", map[string]string{"Retry-After": "Mon, 02 Jan 2006 15:04:05 GMT"}, body, 0, 0},
		{"negative", map[string]string{"Retry-After": "-3"}, body, 0, 0},
		{"garbage", map[string]string{"Retry-After": "soon"}, body, 0, 0},
		{"body is not a source", nil, `{"code":429,"retryAfterSeconds":9}`, 0, 0},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			if row.header["Retry-After"] == "+30s" { // an HTTP-date 30 s from now
				row.header = map[string]string{"Retry-After": time.Now().Add(30 * time.Second).UTC().Format(http.TimeFormat)}
			}
			check := func(where string, err error) {
				t.Helper()
				var rl *sandbox.RateLimitedError
				if !errors.As(err, &rl) {
					t.Fatalf("%s: %v, want RateLimited", where, err)
				}
				if d := rl.RetryAfter - row.want; d > row.slack || d < -row.slack {
					t.Fatalf("%s: retry after %v, want %v", where, rl.RetryAfter, row.want)
				}
			}
			e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Status: 429, Body: row.body, Header: row.header})
			_, err := e.p.ListAllNames(ctx(t))
			check("control plane", err)
			e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Status: 429, Body: row.body, Header: row.header})
			_, err = e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
			check("envd", err)
		})
	}
}

// E2B answers 409 while a sandbox changes state: timeout, connect, network
// and the envd proxy answer it, and it passes. Pause waits out a snapshot
// or a pause in progress instead.
func TestConflictIsATransition(t *testing.T) {
	e := newEnv(t, e2btest.Options{TTLCheck: 5 * time.Millisecond}, func(c *e2b.Config) {
		c.TransitionBackoff = sandbox.Backoff{Attempts: 200, Base: 5 * time.Millisecond, Max: 20 * time.Millisecond}
	})
	h := e.create("tr-1")
	id := h.Private.(string)

	// Being snapshotted and never paused, the sandbox is in neither half of
	// E2B's listing (live running or pausing ones, paused ones from their
	// snapshots); the handle's id finds it through its own record.
	e.srv.Transition(id, "snapshotting", "running", time.Hour)
	if info, err := e.p.Get(ctx(t), h); err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get while snapshotting = %s, %v; want running", info.Status, err)
	}
	// envd behind the proxy: 409, transient, not Invalid.
	_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
	if sandbox.Kind(err) != "unavailable" || !sandbox.Transient(err) {
		t.Fatalf("Exec while snapshotting = %v, want a transient Unavailable", err)
	}
	e.srv.Transition(id, "snapshotting", "running", 0)
	eventually(t, 5*time.Second, "the snapshot to end", func() bool { sb, _ := e.srv.Lookup(id); return sb.State == "running" })
	// A handle without the id (another process's) cannot see it meanwhile:
	// the listing alone decides.
	e.srv.Transition(id, "snapshotting", "running", time.Hour)
	if _, err := e.p.Get(ctx(t), sandbox.BuildHandle(e2b.Name, "tr-1")); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get by name alone while snapshotting = %v, want ErrNotFound (what the listing says)", err)
	}
	e.srv.Transition(id, "snapshotting", "running", 0)
	eventually(t, 5*time.Second, "the snapshot to end", func() bool { sb, _ := e.srv.Lookup(id); return sb.State == "running" })
	// Idempotent calls ride a short transition out.
	e.srv.Transition(id, "snapshotting", "running", 50*time.Millisecond)
	if err := e.p.ApplyNetworkPolicy(ctx(t), h, sandbox.NetworkPolicy{Allow: []string{"example.com"}}); err != nil {
		t.Fatalf("ApplyNetworkPolicy across a 50 ms transition = %v", err)
	}
	e.srv.Transition(id, "snapshotting", "running", 50*time.Millisecond)
	if _, err := e.p.ListSessions(ctx(t), h); err != nil {
		t.Fatalf("ListSessions across a 50 ms transition = %v", err)
	}
	e.srv.Transition(id, "snapshotting", "running", 50*time.Millisecond)
	if err := e.p.WriteFile(ctx(t), h, "/home/user/f", []byte("whole"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatalf("WriteFile across a 50 ms transition = %v", err)
	}
	// The heartbeat (POST /timeout) retries its 409 too: a command whose
	// first heartbeat meets a transition still renews the TTL.
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/sandboxes/" + id + "/timeout", Status: 409,
		Body: `{"code":409,"message":"Sandbox \"` + id + `\" is being snapshotted"}`, Times: 2})
	e.srv.ResetRequests()
	if _, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sleep", Args: []string{"1"}}, sandbox.ExecOptions{Timeout: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range e.srv.Requests() {
		if r.Plane == e2btest.API && strings.HasSuffix(r.Path, "/timeout") {
			n++
		}
	}
	if n < 3 {
		t.Fatalf("%d timeout requests, want the two 409s retried", n)
	}
	// Connect's own 409 (a sandbox still changing state after E2B's
	// retries) is retried too.
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	e.srv.ResetRequests()
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes/" + id + "/connect", Status: 409,
		Body: `{"code":409,"message":"Sandbox \"` + id + `\" is being paused"}`, Times: 2})
	if _, err := e.p.Resume(ctx(t), h); err != nil {
		t.Fatalf("Resume across two 409s from connect = %v", err)
	}
	n = 0
	for _, r := range e.srv.Requests() {
		if r.Plane == e2btest.API && strings.HasSuffix(r.Path, "/connect") {
			n++
		}
	}
	if sb, _ := e.srv.Lookup(id); n != 3 || sb.State != "running" {
		t.Fatalf("%d connect requests, state %s; want the two 409s retried and the sandbox running", n, sb.State)
	}
	// A pause that meets a pause in progress joins it.
	e.srv.Transition(id, "pausing", "paused", 100*time.Millisecond)
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatalf("Suspend of a pausing sandbox = %v", err)
	}
	eventually(t, 5*time.Second, "the pause to finish", func() bool { sb, _ := e.srv.Lookup(id); return sb.State == "paused" })
	// Connect waits out a pause server-side and resumes.
	if _, err := e.p.Resume(ctx(t), h); err != nil {
		t.Fatal(err)
	}
}

// Only the sandbox's own record says it is paused. E2B's listing shows a
// sandbox that is being snapshotted or killed as paused when an earlier
// pause left a snapshot record, and a snapshotted one runs (and bills)
// again after; E2B's pause waits a snapshot out and pauses after it.
func TestSuspendAsksTheSandboxRecord(t *testing.T) {
	e := newEnv(t, e2btest.Options{TTLCheck: 5 * time.Millisecond}, nil)
	h := e.create("rec-1")
	id := h.Private.(string)
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Resume(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	e.srv.Transition(id, "snapshotting", "running", 300*time.Millisecond)
	if info, err := e.p.Get(ctx(t), h); err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get during a snapshot = %s, %v; want running (the listing says paused from the earlier snapshot)", info.Status, err)
	}
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatalf("Suspend during a snapshot = %v", err)
	}
	if sb, _ := e.srv.Lookup(id); sb.State != "paused" {
		t.Fatalf("Suspend during a snapshot returned with the sandbox %s, want paused (the listing said paused; the sandbox runs again after the snapshot)", sb.State)
	}

	// Being killed, it is listed paused from its snapshot, but its record
	// is gone: not a success.
	h2 := e.create("rec-2")
	id2 := h2.Private.(string)
	if err := e.p.Suspend(ctx(t), h2); err != nil {
		t.Fatal(err)
	}
	if _, err := e.p.Resume(ctx(t), h2); err != nil {
		t.Fatal(err)
	}
	e.srv.Transition(id2, "killing", "", time.Hour)
	if err := e.p.Suspend(ctx(t), h2); err == nil || !sandbox.Transient(err) {
		t.Fatalf("Suspend of a sandbox being killed = %v, want a transient error", err)
	}
}

// Destroy of a sandbox the listing leaves out (being snapshotted, never
// paused) must not report success and leave it running: the handle's id
// finds it.
func TestDestroyDuringASnapshot(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("snap-d")
	id := h.Private.(string)
	e.srv.Transition(id, "snapshotting", "running", time.Hour)
	if err := e.p.Destroy(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.srv.Lookup(id); ok {
		t.Fatal("Destroy returned nil and the sandbox being snapshotted is still there")
	}
	if err := e.p.Destroy(ctx(t), h); err != nil {
		t.Fatalf("Destroy again = %v, want nil", err)
	}
}

// An unknown template is E2B's 404 on create, as is an unknown tag of a
// known one, and a malformed reference its 400: a bad argument, never
// ErrNotFound (which a caller reads as "the sandbox is gone").
func TestUnknownTemplate(t *testing.T) {
	for _, row := range []struct{ template, msg string }{
		{"no-such-template", "template 'no-such-template' not found"},
		{"base:v9", "tag 'v9' does not exist for template 'base'"},
		{"base:no tag", "Invalid template reference"},
	} {
		t.Run(row.template, func(t *testing.T) {
			e := newEnv(t, e2btest.Options{Templates: []string{"base", "base:v1"}}, func(c *e2b.Config) { c.Template = row.template })
			_, err := e.p.Create(ctx(t), "tpl-1", sandbox.CreateOptions{})
			var inv *sandbox.InvalidError
			if errors.Is(err, sandbox.ErrNotFound) || !errors.As(err, &inv) || inv.Reason != "template" || !strings.Contains(inv.Msg, row.msg) {
				t.Fatalf("Create with template %q = %v, want Invalid{template} with E2B's message %q", row.template, err, row.msg)
			}
			if len(e.srv.Sandboxes()) != 0 {
				t.Fatal("a sandbox was made")
			}
		})
	}
	for _, ok := range []string{"base:v1", "base:default", "Base"} {
		e := newEnv(t, e2btest.Options{Templates: []string{"base", "base:v1"}}, func(c *e2b.Config) { c.Template = ok })
		if _, err := e.p.Create(ctx(t), "tpl-ok", sandbox.CreateOptions{}); err != nil {
			t.Fatalf("Create with template %q = %v", ok, err)
		}
	}
}

// envd signals a process alone; an exec killed at its deadline must not
// leave its children running.
func TestExecDeadlineKillsTheTree(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("tree-1")
	_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 30 & echo $! > child.pid; sleep 30 & wait"}},
		sandbox.ExecOptions{Timeout: 2 * time.Second})
	if !sandbox.IsExecTimeout(err) {
		t.Fatalf("Exec = %v, want exec_timeout", err)
	}
	b, err := e.p.ReadFile(ctx(t), h, "/home/user/child.pid")
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	eventually(t, 5*time.Second, "the exec's child "+pid+" to die", func() bool {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return true // gone
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
	})
}

// An exec its caller gives up (Ctrl-C) is killed with its tree too, not
// left running in the sandbox.
func TestExecCancelKillsTheTree(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("tree-2")
	sb, _ := e.srv.Lookup(h.Private.(string))
	pidFile := filepath.Join(sb.Dir, "home", "child.pid")
	cctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := e.p.Exec(cctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 30 & echo $! > child.pid; sleep 30 & wait"}},
			sandbox.ExecOptions{Timeout: 20 * time.Second})
		done <- err
	}()
	var pid string
	eventually(t, 10*time.Second, "the exec to start its child", func() bool {
		b, err := os.ReadFile(pidFile)
		pid = strings.TrimSpace(string(b))
		return err == nil && pid != ""
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Exec = %v, want context.Canceled", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("cancelled Exec did not return")
	}
	eventually(t, 5*time.Second, "the cancelled exec's child "+pid+" to die", func() bool {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return true
		}
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
	})
}

// E2B caps every TTL at the plan's maximum instance length and then
// refuses the heartbeat (400 "Max instance length exceeded"); the sandbox
// pauses under a live command. The command says why, rather than a bare
// closed_before_exit.
func TestMaxInstanceLength(t *testing.T) {
	e := newEnv(t, e2btest.Options{Second: 20 * time.Millisecond, TTLCheck: 5 * time.Millisecond, MaxInstanceLength: 75},
		func(c *e2b.Config) { c.Heartbeat = 100 * time.Millisecond })
	h := e.create("max-1")
	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	_, _, term := collect(t, c, 10*time.Second)
	var u *sandbox.UnavailableError
	if term.Kind != sandbox.Error || !errors.As(term.Err, &u) || u.Reason != e2b.ReasonMaxInstanceLength {
		t.Fatalf("command at the maximum instance length ended with %+v (%v), want Unavailable{%s}", term, term.Err, e2b.ReasonMaxInstanceLength)
	}
	// A resume starts a new instance: work goes on.
	if res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"again"}}, sandbox.ExecOptions{Timeout: 5 * time.Second}); err != nil || string(res.Output) != "again\n" {
		t.Fatalf("Exec after the resume = %q, %v", res.Output, err)
	}
}

// A sandbox running past its maximum instance length (E2B has not paused
// it yet) cannot be kept alive: connect answers 400 "Max instance length
// exceeded" as /timeout does. An operation that meets it says why, and is
// transient (once paused, a resume starts a new instance), not Invalid.
func TestMaxInstanceLengthAtConnect(t *testing.T) {
	// TTLCheck: the fake never gets round to pausing it.
	e := newEnv(t, e2btest.Options{Second: 10 * time.Millisecond, TTLCheck: time.Hour, MaxInstanceLength: 20}, nil)
	h := e.create("maxc-1")
	start := time.Now()
	eventually(t, 5*time.Second, "the maximum instance length to pass", func() bool { return time.Since(start) > 400*time.Millisecond })
	_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{Timeout: 5 * time.Second})
	var u *sandbox.UnavailableError
	if !errors.As(err, &u) || u.Reason != e2b.ReasonMaxInstanceLength || !sandbox.Transient(err) {
		t.Fatalf("Exec on a sandbox past its maximum instance length = %v, want a transient Unavailable{%s}", err, e2b.ReasonMaxInstanceLength)
	}
	e.srv.Pause(h.Private.(string))
	if res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"new"}}, sandbox.ExecOptions{Timeout: 5 * time.Second}); err != nil || string(res.Output) != "new\n" {
		t.Fatalf("Exec once it is paused = %q, %v; want a resumed instance", res.Output, err)
	}
}

// Duplicates of a name (a create race) converge on the oldest by the
// creation stamp the provider writes, not by startedAt, which a resume
// resets: resuming the older one must not make the newer canonical.
func TestCanonicalSurvivesResume(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	now := time.Now().UTC()
	md := func(at time.Time) map[string]string {
		m := stamped("dup-1")
		m[e2b.MetaCreated] = at.Format(time.RFC3339Nano)
		return m
	}
	older := e.srv.CreateSandbox(md(now.Add(-time.Minute)), 300, true)
	time.Sleep(5 * time.Millisecond)
	newer := e.srv.CreateSandbox(md(now), 300, true)
	e.srv.Pause(older)
	time.Sleep(5 * time.Millisecond)
	e.srv.Resume(older) // its startedAt is now the latest
	h, err := e.p.Create(ctx(t), "dup-1", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h.Private != older {
		t.Fatalf("Create adopted %v, want the older sandbox %s (newer %s)", h.Private, older, newer)
	}
	// The provider's own creates carry the stamp.
	h2 := e.create("dup-2")
	sb, _ := e.srv.Lookup(h2.Private.(string))
	if _, err := time.Parse(time.RFC3339Nano, sb.Metadata[e2b.MetaCreated]); err != nil {
		t.Fatalf("created without a creation stamp: %v", sb.Metadata)
	}
}

// envd before 0.3.0 ignores Start's stdin field (every process gets an
// open stdin), and before 0.5.2 has no CloseStdin. An exec must still see
// EOF at once, and a CloseStdin that cannot be delivered must say so.
func TestOldEnvd(t *testing.T) {
	old := newEnv(t, e2btest.Options{EnvdVersion: "0.2.4"}, nil)
	h := old.create("old-1")
	res, err := old.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "cat; echo done $0 \"$1\"", "x", "a b"}}, sandbox.ExecOptions{Timeout: 3 * time.Second})
	if err != nil || string(res.Output) != "done x a b\n" || res.ExitCode != 0 {
		t.Fatalf("Exec of a stdin reader on envd 0.2.4 = %q, %d, %v; want EOF at once", res.Output, res.ExitCode, err)
	}
	res, err = old.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "exit 7"}}, sandbox.ExecOptions{Timeout: 3 * time.Second})
	if err != nil || res.ExitCode != 7 {
		t.Fatalf("exit status through the workaround = %d, %v", res.ExitCode, err)
	}

	mid := newEnv(t, e2btest.Options{EnvdVersion: "0.5.0"}, nil)
	h2 := mid.create("old-2")
	c, err := mid.p.Spawn(ctx(t), h2, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	if err := c.WriteStdin(ctx(t), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseStdin(ctx(t)); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("CloseStdin on envd 0.5.0 = %v, want ErrNotSupported", err)
	}
}

// Pause and connect snapshot or restore a whole VM and may take longer than
// an ordinary request: they get Config.LongRequestTimeout.
func TestSlowPauseAndConnect(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, func(c *e2b.Config) {
		c.RequestTimeout = time.Second
		c.LongRequestTimeout = 10 * time.Second
	})
	h := e.create("slow-1")
	id := h.Private.(string)
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/sandboxes/" + id + "/pause", Delay: 1500 * time.Millisecond})
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatalf("a pause that takes 1.5 s = %v", err)
	}
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes/" + id + "/connect", Delay: 1500 * time.Millisecond})
	if _, err := e.p.Resume(ctx(t), h); err != nil {
		t.Fatalf("a resume that takes 1.5 s = %v", err)
	}
	// An ordinary request keeps the ordinary bound.
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Delay: 1500 * time.Millisecond})
	if _, err := e.p.ListAllNames(ctx(t)); sandbox.Kind(err) != "unavailable" {
		t.Fatalf("a listing that takes 1.5 s with a 1 s bound = %v", err)
	}
}
