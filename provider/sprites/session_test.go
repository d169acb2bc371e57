package sprites_test

// A session's id is read from Sprites' session_info frame, never guessed
// (issue 21, item 12); a session that must outlive its client asks for it
// with max_run_after_disconnect.

import (
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

func newFakeOpts(t *testing.T, o spritestest.Options) (*spritestest.Server, *sprites.Provider) {
	t.Helper()
	srv := spritestest.NewServer(o)
	t.Cleanup(srv.Close)
	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

// drain reads a command's output until its terminal event.
func drain(t *testing.T, c *sandbox.Command) (string, sandbox.Event) {
	t.Helper()
	var out strings.Builder
	for {
		ev := next(t, c)
		switch ev.Kind {
		case sandbox.Stdout, sandbox.Stderr:
			out.Write(ev.Data)
		default:
			return out.String(), ev
		}
	}
}

// The server starts the process (and so lists the session) a while after
// the upgrade. Spawn still returns the session's own id, the one the
// server announced, even among earlier sessions of the same command.
func TestSpawnReadsItsSessionID(t *testing.T) {
	srv, p := newFakeOpts(t, spritestest.Options{StartDelay: 50 * time.Millisecond})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "ids", sandbox.CreateOptions{})
	ok(t, err)
	argv := sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo $N; sleep 5"}}
	var cmds []*sandbox.Command
	for _, n := range []string{"first", "second", "third"} {
		c, err := p.Spawn(ctx, h, argv, sandbox.SpawnOptions{Detachable: true, Env: []string{"N=" + n}})
		ok(t, err)
		defer c.Stop()
		if c.SessionID == "" {
			t.Fatalf("Spawn %s returned no session id", n)
		}
		if c.SessionID != sprites.SessionID(c) {
			t.Fatalf("Command.SessionID %q is not the announced %q", c.SessionID, sprites.SessionID(c))
		}
		// The id is listed at once: Spawn returned after the process
		// existed.
		ss, err := p.ListSessions(ctx, h)
		ok(t, err)
		found := false
		for _, s := range ss {
			found = found || s.ID == c.SessionID
		}
		if !found {
			t.Fatalf("session %s is not listed after Spawn returned: %+v", c.SessionID, ss)
		}
		cmds = append(cmds, c)
	}
	for i, n := range []string{"first", "second", "third"} {
		a, err := p.Attach(ctx, h, cmds[i].SessionID, sandbox.AttachOptions{})
		ok(t, err)
		if a.SessionID != cmds[i].SessionID {
			t.Fatalf("Attach's SessionID %q, want %q", a.SessionID, cmds[i].SessionID)
		}
		ev := next(t, a)
		if ev.Kind != sandbox.Stdout || string(ev.Data) != n+"\n" {
			t.Fatalf("attach to %s's session replays %q, want %q", n, ev.Data, n+"\n")
		}
		_ = a.Stop()
		ok(t, p.TerminateSession(ctx, h, cmds[i].SessionID, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second}))
		if srv.SessionRunning("ids", cmds[i].SessionID) {
			t.Fatalf("%s's session runs on after its termination", n)
		}
	}
	// A command that ends at once still names its session.
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{Detachable: true})
	ok(t, err)
	if c.SessionID == "" {
		t.Fatal("a quick command's Spawn returned no session id")
	}
	if _, ev := drain(t, c); ev.Kind != sandbox.Exit || ev.Code != 0 {
		t.Fatalf("quick command ended with %+v", ev)
	}
}

// session_info's session_id is the process's PID: a JSON integer in the
// exec API reference, a string to sprites-go (which decodes it into one).
// Either way Spawn's Command names it, in decimal.
func TestSpawnSessionIDForms(t *testing.T) {
	for _, id := range []string{`1847`, `"1847"`} {
		t.Run(id, func(t *testing.T) {
			info := `{"type":"session_info","session_id":` + id + `,"command":"x","created":1767609000,"is_owner":true,"tty":false}`
			p := scripted(t, []msg{{text: true, data: []byte(info)}, {data: []byte{1, 'o'}}, {data: []byte{3, 0}}}, "hold")
			c, err := p.Spawn(ctxT(t), sandbox.BuildHandle("sprites", "s"), sandbox.Cmd{Name: "x"}, sandbox.SpawnOptions{Detachable: true})
			ok(t, err)
			defer c.Stop()
			if c.SessionID != "1847" || sprites.SessionID(c) != "1847" {
				t.Fatalf("session_id %s: Command.SessionID %q, announced %q; want 1847", id, c.SessionID, sprites.SessionID(c))
			}
			if out, ev := drain(t, c); out != "o" || ev.Kind != sandbox.Exit || ev.Code != 0 {
				t.Fatalf("output %q, end %+v", out, ev)
			}
		})
	}
}

// A socket that never announces its session: a detachable Spawn fails
// rather than return a session nobody can find again; one that closes
// first returns, and its stream says how it ended.
func TestSpawnWithoutSessionInfo(t *testing.T) {
	srv, p := newFakeOpts(t, spritestest.Options{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "noinfo", sandbox.CreateOptions{})
	ok(t, err)
	srv.Inject(spritestest.Fault{Path: "/v1/sprites/noinfo/exec", Times: 1, CloseWithoutExit: true, Body: []byte("x")})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{Detachable: true})
	ok(t, err)
	if _, ev := drain(t, c); ev.Kind != sandbox.Error || !sandbox.IsClosedBeforeExit(ev.Err) {
		t.Fatalf("closed without session_info: %+v", ev)
	}
}

// Sprites runs a non-TTY process 10 s past its socket unless the exec asks
// otherwise (max_run_after_disconnect); a detachable spawn must ask for
// forever, and no longer sends the retired detachable parameter.
func TestDetachableOutlivesItsClient(t *testing.T) {
	srv, p := newFakeOpts(t, spritestest.Options{MaxRunAfterDisconnect: 100 * time.Millisecond})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "keep", sandbox.CreateOptions{})
	ok(t, err)
	srv.ResetRequests()
	d, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.SpawnOptions{Detachable: true})
	ok(t, err)
	var q map[string][]string
	for _, r := range srv.Requests() {
		if r.WebSocket {
			q = r.Query()
		}
	}
	if q["max_run_after_disconnect"] == nil || q["max_run_after_disconnect"][0] != "0" || q["detachable"] != nil {
		t.Fatalf("detachable exec query %v, want max_run_after_disconnect=0 and no detachable", q)
	}
	n, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.SpawnOptions{})
	ok(t, err)
	ok(t, d.Stop())
	ok(t, n.Stop())
	// The one that asked for nothing dies after the service's default...
	deadline := time.Now().Add(10 * time.Second)
	for srv.SessionRunning("keep", n.SessionID) {
		if time.Now().After(deadline) {
			t.Fatal("a session that was not detachable outlived max_run_after_disconnect")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// ...and well past it, the detachable one still runs.
	time.Sleep(300 * time.Millisecond)
	if !srv.SessionRunning("keep", d.SessionID) {
		t.Fatal("a detachable session died after its client left")
	}
	ok(t, p.TerminateSession(ctx, h, d.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second}))
}

// An exec past its deadline is killed through its session, not left to
// run out Sprites' 10 s after its socket closes.
func TestExecDeadlineKillsTheSession(t *testing.T) {
	srv, p := newFakeOpts(t, spritestest.Options{MaxRunAfterDisconnect: time.Minute})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "dl", sandbox.CreateOptions{})
	ok(t, err)
	_, err = p.Exec(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.ExecOptions{Timeout: 300 * time.Millisecond})
	if !sandbox.IsExecTimeout(err) {
		t.Fatalf("Exec = %v, want exec_timeout", err)
	}
	ss, err := p.ListSessions(ctx, h)
	ok(t, err)
	for _, s := range ss {
		if srv.SessionRunning("dl", s.ID) {
			t.Fatalf("session %s (%s) runs on after its exec's deadline", s.ID, s.Command)
		}
	}
}
