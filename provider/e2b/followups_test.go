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
	e.srv.Inject(e2btest.Fault{Plane: e2btest.API, Method: "POST", Path: "/sandboxes", Match: "templateID", Delay: time.Second})
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
