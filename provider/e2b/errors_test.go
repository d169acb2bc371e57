package e2b_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// Every row of the status table (§3.2), on the control plane (the listing
// behind ListAllNames) and on envd (a unary call and the Start stream).
func TestErrorTable(t *testing.T) {
	rows := []struct {
		status     int
		body       string
		kind       string
		retryAfter time.Duration
	}{
		{404, `{"code":404,"message":"nope"}`, "not_found", 0},
		{401, `{"code":401,"message":"Invalid API key"}`, "denied", 0},
		{403, `{"code":403,"message":"forbidden"}`, "denied", 0},
		{429, `{"code":429,"message":"Rate limit exceeded"}`, "rate_limited", 0},
		{429, `not json`, "rate_limited", 0},
		{500, `{"code":500}`, "unavailable", 0},
		{502, ``, "unavailable", 0},
		{503, `{"code":503}`, "unavailable", 0},
		{599, ``, "unavailable", 0},
		{400, `{"code":400}`, "invalid", 0},
		{409, `{"code":409}`, "unavailable", 0},
		{418, ``, "invalid", 0},
		{422, ``, "invalid", 0},
		{302, ``, "invalid", 0},
	}
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("errors-1")
	check := func(t *testing.T, where string, err error, kind string, ra time.Duration) {
		t.Helper()
		if got := sandbox.Kind(err); got != kind {
			t.Fatalf("%s: %v is %s, want %s", where, err, got, kind)
		}
		var rl *sandbox.RateLimitedError
		if errors.As(err, &rl) && rl.RetryAfter != ra {
			t.Fatalf("%s: retry after %v, want %v", where, rl.RetryAfter, ra)
		}
		var u *sandbox.UnavailableError
		if kind == "unavailable" && (!errors.As(err, &u) || u.HTTP == nil) {
			t.Fatalf("%s: %v carries no HTTP detail", where, err)
		}
	}
	for _, row := range rows {
		t.Run(strconv.Itoa(row.status), func(t *testing.T) {
			e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Status: row.status, Body: row.body})
			_, err := e.p.ListAllNames(ctx(t))
			check(t, "control plane", err, row.kind, row.retryAfter)

			times := 1
			if row.status == 409 {
				times = 5 // List is retried while the sandbox is transitioning
			}
			e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/List", Status: row.status, Body: row.body, Times: times})
			_, err = e.p.ListSessions(ctx(t), h)
			kind := row.kind
			if row.status == 404 {
				// envd's 404 is not the listing's: the sandbox is still listed.
				kind = "unavailable"
			}
			check(t, "envd unary", err, kind, row.retryAfter)

			e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Status: row.status, Body: row.body})
			c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
			if c != nil {
				t.Fatalf("Spawn returned a command despite %d", row.status)
			}
			check(t, "envd stream", err, row.kind, row.retryAfter)
		})
	}
}

func TestTransportFaults(t *testing.T) {
	e := newEnv(t, e2btest.Options{Second: 10 * time.Millisecond}, func(c *e2b.Config) {
		c.RequestTimeout = 300 * time.Millisecond
		c.KeepaliveInterval = time.Second // envd keepalives every 10 ms in the fake
		c.StallTimeout = 300 * time.Millisecond
	})
	h := e.create("faults-1")
	sleepy := sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo partial; sleep 0.2; exit 5"}}

	t.Run("stalled request is Unavailable timeout", func(t *testing.T) {
		e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Stall: true})
		_, err := e.p.Get(ctx(t), h)
		var u *sandbox.UnavailableError
		if !errors.As(err, &u) || u.Reason != sandbox.ReasonTimeout {
			t.Fatalf("Get on a stalled plane = %v", err)
		}
	})
	t.Run("stalled start is Unavailable", func(t *testing.T) {
		e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Stall: true})
		_, err := e.p.Spawn(ctx(t), h, sleepy, sandbox.SpawnOptions{})
		if sandbox.Kind(err) != "unavailable" {
			t.Fatalf("Spawn on a stalled envd = %v", err)
		}
	})
	t.Run("stalled stream is Unavailable stream_stalled", func(t *testing.T) {
		e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", StallStream: true})
		c, err := e.p.Spawn(ctx(t), h, sleepy, sandbox.SpawnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, _, term := collect(t, c, 5*time.Second)
		var u *sandbox.UnavailableError
		if term.Kind != sandbox.Error || !errors.As(term.Err, &u) || u.Reason != "stream_stalled" {
			t.Fatalf("terminal %+v", term)
		}
	})
	t.Run("keepalives keep a quiet stream alive", func(t *testing.T) {
		c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 0.8; exit 6"}}, sandbox.SpawnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, term := collect(t, c, 5*time.Second); term.Kind != sandbox.Exit || term.Code != 6 {
			t.Fatalf("terminal %+v", term)
		}
	})
	t.Run("stream without end event is closed_before_exit, never exit", func(t *testing.T) {
		e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", NoEnd: true})
		c, err := e.p.Spawn(ctx(t), h, sleepy, sandbox.SpawnOptions{})
		if err != nil {
			t.Fatal(err)
		}
		out, _, term := collect(t, c, 5*time.Second)
		if out != "partial\n" || term.Kind != sandbox.Error || !sandbox.IsClosedBeforeExit(term.Err) {
			t.Fatalf("got %q then %+v", out, term)
		}
		e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", NoEnd: true})
		if _, err := e.p.Exec(ctx(t), h, sleepy, sandbox.ExecOptions{}); !sandbox.IsClosedBeforeExit(err) {
			t.Fatalf("Exec = %v", err)
		}
	})
	t.Run("end-of-stream error is normalized", func(t *testing.T) {
		_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "/no/such/binary"}, sandbox.ExecOptions{})
		if sandbox.Kind(err) != "unavailable" {
			t.Fatalf("Exec of a missing binary = %v", err)
		}
	})
	t.Run("exec past its deadline is exec_timeout and is killed", func(t *testing.T) {
		_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.ExecOptions{Timeout: 200 * time.Millisecond})
		if !sandbox.IsExecTimeout(err) {
			t.Fatalf("Exec = %v", err)
		}
		eventually(t, 5*time.Second, "the timed-out exec to be killed", func() bool {
			sb, _ := e.srv.Lookup(h.Private.(string))
			return sb.Processes == 0
		})
	})
	t.Run("a 404 by id is not_found only when the listing agrees", func(t *testing.T) {
		id := h.Private.(string)
		e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/sandboxes/" + id + "/pause", Status: 404})
		if err := e.p.Suspend(ctx(t), h); sandbox.Kind(err) != "unavailable" {
			t.Fatalf("Suspend with a spurious 404 = %v", err)
		}
		e.srv.Kill(id)
		if err := e.p.Suspend(ctx(t), h); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Suspend of a killed sandbox = %v", err)
		}
		if _, err := e.p.Exec(ctx(t), h, sleepy, sandbox.ExecOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("Exec on a killed sandbox = %v", err)
		}
	})
	t.Run("wrong key is denied", func(t *testing.T) {
		p, err := e2b.New(e2b.Config{APIKey: "wrong", APIURL: e.srv.APIURL()})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var d *sandbox.DeniedError
		if _, err := p.Create(ctx(t), "x", sandbox.CreateOptions{}); !errors.As(err, &d) {
			t.Fatalf("Create with a wrong key = %v", err)
		}
	})
	t.Run("refused connection is Unavailable transport", func(t *testing.T) {
		p, err := e2b.New(e2b.Config{APIKey: "k", APIURL: "http://127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		var u *sandbox.UnavailableError
		if _, err := p.ListAllNames(ctx(t)); !errors.As(err, &u) || u.Reason != sandbox.ReasonTransport {
			t.Fatalf("ListAllNames = %v", err)
		}
	})
}
