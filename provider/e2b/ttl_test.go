package e2b_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// The TTL treadmill: a live command's heartbeats keep its sandbox running
// past its TTL; once they stop, the TTL auto-pauses the sandbox (stopping
// its processes); the next operation resumes it first, the paused process
// goes on, and stdin reaches it through the tag→List→pid fallback.
func TestTTLHeartbeatAutoPauseResume(t *testing.T) {
	e := newEnv(t, e2btest.Options{Second: 10 * time.Millisecond}, func(c *e2b.Config) {
		// 500 ms in the fake: a heartbeat every 30 ms keeps it running
		// even when a loaded machine holds the heartbeat back for a few
		// hundred ms (200 ms did not: a stalled heartbeat let the TTL
		// pause the sandbox under a live command).
		c.SandboxTimeout = 50 * time.Second
		c.Heartbeat = 30 * time.Millisecond
	})
	h := e.create("ttl-1")
	id := h.Private.(string)
	sb, _ := e.srv.Lookup(id)
	firstEnd := sb.EndAt

	c, err := e.p.Spawn(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo up; exec cat"}},
		sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-c.Events(); string(ev.Data) != "up\n" {
		t.Fatalf("first event %+v", ev)
	}
	// Past the first TTL, the sandbox still runs: heartbeats renewed it.
	eventually(t, 5*time.Second, "the first TTL to pass", func() bool {
		sb, _ := e.srv.Lookup(id)
		if sb.State != "running" {
			t.Fatalf("sandbox %s while its command heartbeats", sb.State)
		}
		return time.Now().After(firstEnd.Add(100 * time.Millisecond))
	})
	beats := 0
	for _, r := range e.srv.Requests() {
		if r.Path == "/sandboxes/"+id+"/timeout" {
			beats++
		}
	}
	if beats < 3 {
		t.Fatalf("%d heartbeats, want several", beats)
	}

	// Heartbeats stop with the command's local end: the TTL pauses it.
	_ = c.Stop()
	eventually(t, 5*time.Second, "auto-pause", func() bool {
		sb, _ := e.srv.Lookup(id)
		return sb.State == "paused"
	})
	if info, err := e.p.Get(ctx(t), h); err != nil || info.Status != sandbox.StatusSuspended {
		t.Fatalf("Get = %v, %v; want suspended", info, err)
	}

	// Any operation resumes it first.
	e.srv.ResetRequests()
	res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"back"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "back\n" {
		t.Fatalf("Exec after auto-pause = %q, %v", res.Output, err)
	}
	var seq []string
	for _, r := range e.srv.Requests() {
		seq = append(seq, r.Path)
	}
	ci := slices.Index(seq, "/v2/sandboxes/"+id+"/connect")
	si := slices.Index(seq, "/process.Process/Start")
	if ci < 0 || si < 0 || ci > si {
		t.Fatalf("want connect before Start, got %v", seq)
	}

	// The process paused with the sandbox lives on; its session replays and
	// takes stdin by pid, since envd refuses its tag after the resume.
	ss, err := e.p.ListSessions(ctx(t), h)
	if err != nil || len(ss) != 1 {
		t.Fatalf("sessions %v, %v", ss, err)
	}
	a, err := e.p.Attach(ctx(t), h, ss[0].ID, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-a.Events(); string(ev.Data) != "up\n" {
		t.Fatalf("replayed %+v", ev)
	}
	e.srv.ResetRequests()
	if err := a.WriteStdin(ctx(t), []byte("after-resume")); err != nil {
		t.Fatal(err)
	}
	var inputs []string
	for _, r := range e.srv.Requests() {
		if strings.HasPrefix(r.Path, "/process.Process/") {
			inputs = append(inputs, strings.TrimPrefix(r.Path, "/process.Process/"))
		}
	}
	if !slices.Equal(inputs, []string{"SendInput", "List", "SendInput"}) {
		t.Fatalf("stdin calls %v, want SendInput(tag) 404, List, SendInput(pid)", inputs)
	}
	if ev := <-a.Events(); string(ev.Data) != "after-resume" {
		t.Fatalf("tailed %+v", ev)
	}
	if err := a.CloseStdin(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if _, _, term := collect(t, a, 5*time.Second); term.Kind != sandbox.Exit || term.Code != 0 {
		t.Fatalf("attach terminal %+v", term)
	}
}

// A sandbox whose TTL is about to end when an operation lists it is
// renewed (connect) before the operation: otherwise the TTL pauses it
// between the listing, which said running, and the command's first
// heartbeat, and the command fails (here envd takes longer to start it
// than the TTL has left; E2B's proxy answers 502 for the paused sandbox).
func TestOperationRenewsATTLAboutToEnd(t *testing.T) {
	e := newEnv(t, e2btest.Options{Second: 10 * time.Millisecond}, func(c *e2b.Config) {
		c.SandboxTimeout = 100 * time.Second // 1 s in the fake
	})
	h := e.create("ttl-edge")
	id := h.Private.(string)
	eventually(t, 5*time.Second, "the TTL's last 150 ms", func() bool {
		sb, _ := e.srv.Lookup(id)
		return time.Until(sb.EndAt) < 150*time.Millisecond
	})
	e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Delay: 400 * time.Millisecond})
	e.srv.ResetRequests()
	res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"ok"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "ok\n" {
		t.Fatalf("Exec at the TTL's end = %q, %v", res.Output, err)
	}
	var seq []string
	for _, r := range e.srv.Requests() {
		seq = append(seq, r.Path)
	}
	ci := slices.Index(seq, "/v2/sandboxes/"+id+"/connect")
	si := slices.Index(seq, "/process.Process/Start")
	if ci < 0 || si < 0 || ci > si {
		t.Fatalf("want connect before Start, got %v", seq)
	}
	if sb, _ := e.srv.Lookup(id); sb.State != "running" {
		t.Fatalf("sandbox %s after the exec", sb.State)
	}
}

// A sandbox whose TTL is far from its end costs no renewal: the operation
// goes from the listing straight to envd.
func TestOperationLeavesAFarTTLAlone(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil) // E2B seconds; the default 30 min TTL
	h := e.create("ttl-far")
	e.srv.ResetRequests()
	res, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "echo", Args: []string{"ok"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "ok\n" {
		t.Fatalf("Exec = %q, %v", res.Output, err)
	}
	for _, r := range e.srv.Requests() {
		if strings.HasSuffix(r.Path, "/connect") {
			t.Fatalf("a running sandbox with most of its TTL left was connected: %+v", e.srv.Requests())
		}
	}
}
