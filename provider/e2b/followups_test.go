package e2b_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// E2B answers a create once the sandbox has started from its template,
// and its SDK gives every request 60 s: a create slower than the ordinary
// request timeout is not a failure. The timeouts are scaled down: the
// create takes 4 ordinary request timeouts.
func TestSlowCreate(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, func(c *e2b.Config) {
		c.RequestTimeout = 250 * time.Millisecond
		c.LongRequestTimeout = 5 * time.Second
	})
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Method: "POST", Path: "/v2/sandboxes", Match: "templateID", Delay: time.Second})
	h, err := e.p.Create(ctx(t), "slow-create", sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create answered after 1 s (request timeout 250 ms, long 5 s) = %v", err)
	}
	if len(e.srv.Sandboxes()) != 1 || h.Private != e.srv.Sandboxes()[0].ID {
		t.Fatalf("handle %+v, sandboxes %+v", h, e.srv.Sandboxes())
	}
}

// childGone reports whether the process pid is gone or a zombie.
func childGone(pid string) bool {
	st, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return true
	}
	f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
	return len(f) > 0 && (f[0] == "Z" || f[0] == "X")
}

// The process-tree kill of an exec past its deadline, or cancelled, goes
// through envd and can be slow: Exec answers at once (exec_timeout, or
// the context's error) while the kill goes on in the background, and the
// kill still takes the tree down. The fake holds the kill's Start until
// Exec has returned.
func TestExecDoesNotWaitForTheTreeKill(t *testing.T) {
	for _, cancelled := range []bool{false, true} {
		name := "deadline"
		if cancelled {
			name = "cancel"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, e2btest.Options{}, func(c *e2b.Config) { c.KillTimeout = 30 * time.Second })
			h := e.create("slowkill-" + name)
			sb, _ := e.srv.Lookup(h.Private.(string))
			pidFile := filepath.Join(sb.Dir, "home", "child.pid")
			hold := make(chan struct{})
			released := false
			release := func() {
				if !released {
					released = true
					close(hold)
				}
			}
			defer release()
			e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Match: "declare -A seen", Hold: hold})
			cctx, cancel := context.WithCancel(ctx(t))
			defer cancel()
			opts := sandbox.ExecOptions{Timeout: time.Second}
			if cancelled {
				opts.Timeout = 20 * time.Second
			}
			done := make(chan error, 1)
			go func() {
				_, err := e.p.Exec(cctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 60 & echo $! > child.pid; sleep 60 & wait"}}, opts)
				done <- err
			}()
			var pid string
			eventually(t, 10*time.Second, "the exec to start its child", func() bool {
				b, err := os.ReadFile(pidFile)
				pid = strings.TrimSpace(string(b))
				return err == nil && pid != ""
			})
			if cancelled {
				cancel()
			}
			err := <-done
			switch {
			case cancelled && !errors.Is(err, context.Canceled):
				t.Fatalf("cancelled Exec = %v, want context.Canceled", err)
			case !cancelled && !sandbox.IsExecTimeout(err):
				t.Fatalf("Exec = %v, want exec_timeout", err)
			}
			// The kill is under way (held by the fake), not given up.
			eventually(t, 10*time.Second, "the kill's request to be held", func() bool { return e.srv.Held() == 1 })
			if childGone(pid) {
				t.Fatal("the child died before its kill was let through")
			}
			release()
			eventually(t, 10*time.Second, "the exec's child "+pid+" to die", func() bool { return childGone(pid) })
		})
	}
}

// With ExecWaitsForKill (a CLI that exits as soon as Exec returns), Exec
// answers only once the kill is over, so the kill cannot die with the
// process.
func TestExecWaitsForKill(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, func(c *e2b.Config) {
		c.KillTimeout = 30 * time.Second
		c.ExecWaitsForKill = true
	})
	h := e.create("waitkill")
	sb, _ := e.srv.Lookup(h.Private.(string))
	pidFile := filepath.Join(sb.Dir, "home", "child.pid")
	hold := make(chan struct{})
	e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Match: "declare -A seen", Hold: hold})
	done := make(chan error, 1)
	go func() {
		_, err := e.p.Exec(ctx(t), h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "sleep 60 & echo $! > child.pid; sleep 60 & wait"}},
			sandbox.ExecOptions{Timeout: time.Second})
		done <- err
	}()
	eventually(t, 10*time.Second, "the kill's request to be held", func() bool { return e.srv.Held() == 1 })
	select {
	case err := <-done:
		close(hold)
		t.Fatalf("Exec returned (%v) while its kill was held", err)
	default:
	}
	b, _ := os.ReadFile(pidFile)
	pid := strings.TrimSpace(string(b))
	close(hold)
	if err := <-done; !sandbox.IsExecTimeout(err) {
		t.Fatalf("Exec = %v, want exec_timeout", err)
	}
	if pid == "" {
		t.Fatal("the exec wrote no child pid")
	}
	eventually(t, 5*time.Second, "the exec's child "+pid+" to die", func() bool { return childGone(pid) })
}

// A sandbox being resumed (by a connect from elsewhere) is, as E2B shows
// it, paused in the listing and in its record, refused by envd (502) and
// joined by another connect. Get, Exec and Resume of it behave: never
// ErrNotFound, and one resume only.
func TestResumingSandbox(t *testing.T) {
	e := newEnv(t, e2btest.Options{}, nil)
	h := e.create("resuming")
	id := h.Private.(string)
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	for _, hh := range []*sandbox.Handle{h, sandbox.BuildHandle(e2b.Name, h.Name)} {
		if !e.srv.Transition(id, "resuming", "running", 1500*time.Millisecond) {
			t.Fatal("could not start a resume")
		}
		before, _ := e.srv.Lookup(id)
		info, err := e.p.Get(ctx(t), hh)
		if err != nil || info.Status != sandbox.StatusSuspended {
			t.Fatalf("Get of a resuming sandbox = %v, %v; want suspended (E2B shows it paused)", info.Status, err)
		}
		res, err := e.p.Exec(ctx(t), hh, sandbox.Cmd{Name: "echo", Args: []string{"hi"}}, sandbox.ExecOptions{StderrToStdout: true})
		if err != nil || string(res.Output) != "hi\n" {
			t.Fatalf("Exec on a resuming sandbox = %q, %v", res.Output, err)
		}
		if _, err := e.p.Resume(ctx(t), hh); err != nil {
			t.Fatalf("Resume of a resumed sandbox = %v", err)
		}
		after, _ := e.srv.Lookup(id)
		if after.Resumes != before.Resumes+1 || after.State != "running" {
			t.Fatalf("resumes %d → %d (state %s), want exactly one more", before.Resumes, after.Resumes, after.State)
		}
		if err := e.p.Suspend(ctx(t), h); err != nil {
			t.Fatal(err)
		}
	}
}

// Two processes resume the same paused sandbox at once: the second connect
// joins the first's resume, each gets the sandbox, and it resumes once.
func TestConcurrentResumesJoin(t *testing.T) {
	e := newEnv(t, e2btest.Options{ResumeDelay: time.Second}, nil)
	h := e.create("joined")
	id := h.Private.(string)
	if err := e.p.Suspend(ctx(t), h); err != nil {
		t.Fatal(err)
	}
	other, err := e2b.New(e.cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	errs := make(chan error, 2)
	for _, p := range []*e2b.Provider{e.p, other} {
		go func() {
			_, err := p.Exec(ctx(t), sandbox.BuildHandle(e2b.Name, h.Name), sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{})
			errs <- err
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("Exec on a sandbox resumed meanwhile = %v", err)
		}
	}
	if sb, _ := e.srv.Lookup(id); sb.Resumes != 1 || sb.State != "running" {
		t.Fatalf("resumes %d, state %s; want one resume, running", sb.Resumes, sb.State)
	}
}
