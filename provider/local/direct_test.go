package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

func events(t *testing.T, c *sandbox.Command) (out, errOut string, term sandbox.Event) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return
			}
			switch ev.Kind {
			case sandbox.Stdout:
				out += string(ev.Data)
			case sandbox.Stderr:
				errOut += string(ev.Data)
			default:
				term = ev
			}
		case <-timeout:
			t.Fatal("command did not end")
		}
	}
}

// TestDirectSpawn: with LazySupervisor a plain spawn runs without any
// supervisor, keeps the stream rules, stdin, and the exit code.
func TestDirectSpawn(t *testing.T) {
	for _, mech := range []string{"trusted", "jail"} {
		t.Run(mech, func(t *testing.T) {
			if mech == "jail" {
				testenv.RequireRoot(t)
			}
			p, err := New(Config{StateDir: t.TempDir(), MechanismName: mech, LazySupervisor: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { destroyAll(p) })
			ctx := context.Background()
			h, err := p.Create(ctx, "direct", sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			reg := sandbox.NewRegistry(p)
			c, err := reg.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo out; echo err >&2; read x; echo got $x; exit 3"}}, sandbox.SpawnOptions{Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.WriteStdin(ctx, []byte("ping\n")); err != nil {
				t.Fatal(err)
			}
			out, errOut, term := events(t, c)
			if out != "out\ngot ping\n" || errOut != "err\n" || term.Kind != sandbox.Exit || term.Code != 3 {
				t.Fatalf("stdout %q stderr %q terminal %+v", out, errOut, term)
			}
			if err := c.WriteStdin(ctx, []byte("late")); !errors.Is(err, sandbox.ErrCommandExited) {
				t.Fatalf("write after exit = %v", err)
			}
			if _, err := supervisorPid(ctx, p, h); !errors.Is(err, supervisor.ErrNoSupervisor) {
				t.Fatalf("a direct spawn started a supervisor: %v", err)
			}
			// Stop ends a direct process: it has no session to come back to.
			c, err = reg.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"60"}}, sandbox.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			_ = c.Stop()
			if _, err := reg.Spawn(ctx, h, sandbox.Cmd{Name: "no-such-binary-xyz"}, sandbox.SpawnOptions{}); err == nil {
				t.Fatal("a missing binary spawned")
			}
			// A detachable spawn still goes through the supervisor.
			c, err = reg.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{Detachable: true})
			if err != nil {
				t.Fatal(err)
			}
			if _, _, term := events(t, c); term.Kind != sandbox.Exit || term.Code != 0 || c.SessionID == "" {
				t.Fatalf("detachable spawn: %+v session %q", term, c.SessionID)
			}
		})
	}
}

// TestDirectSpawnAfterTheSandboxStopped: the direct paths of Spawn and
// Exec do not ask whether the mechanism's sandbox runs; a spawn or an exec
// into one that stopped (recorded so, or its init killed behind the
// record's back) starts it again, and the command runs once.
func TestDirectSpawnAfterTheSandboxStopped(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tc := range []struct{ how, op string }{{"stopped", "spawn"}, {"init-killed", "spawn"}, {"stopped", "exec"}, {"init-killed", "exec"}} {
		how := tc.how
		t.Run(tc.op+"-"+how, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			p, h, r := lazyJailSandbox(t, ctx, "stopped")
			switch how {
			case "stopped":
				if err := p.mech.Stop(ctx, r.InstanceID); err != nil {
					t.Fatal(err)
				}
			case "init-killed":
				killInit(t, p, r.InstanceID)
			}
			reg := sandbox.NewRegistry(p)
			// The command leaves a mark in the home: it must be there
			// once, however many attempts it took.
			cmd := sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ran >> count; echo back"}}
			if tc.op == "exec" {
				res, err := reg.Exec(ctx, h, cmd, sandbox.ExecOptions{})
				if err != nil || string(res.Output) != "back\n" || res.ExitCode != 0 {
					t.Fatalf("exec: %+v, %v", res, err)
				}
			} else {
				c, err := reg.Spawn(ctx, h, cmd, sandbox.SpawnOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if out, _, term := events(t, c); out != "back\n" || term.Kind != sandbox.Exit || term.Code != 0 {
					t.Fatalf("stdout %q terminal %+v", out, term)
				}
			}
			res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "cat", Args: []string{"count"}}, sandbox.ExecOptions{})
			if err != nil || string(res.Output) != "ran\n" {
				t.Fatalf("the command's marks: %q, %v; want one", res.Output, err)
			}
		})
	}
}

// TestExecInterruptedIsNotRetried: an exec whose sandbox dies under the
// running command fails as unavailable, and is not run again (the direct
// path retries only a command that never started).
func TestExecInterruptedIsNotRetried(t *testing.T) {
	testenv.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, h, r := lazyJailSandbox(t, ctx, "interrupted")
	reg := sandbox.NewRegistry(p)
	type result struct {
		res sandbox.ExecResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ran >> count; sleep 60"}}, sandbox.ExecOptions{})
		done <- result{res, err}
	}()
	count := filepath.Join(p.homeDir(r.InstanceID), "count")
	for {
		if b, _ := os.ReadFile(count); len(b) > 0 {
			break
		}
		select {
		case got := <-done:
			t.Fatalf("exec ended before its mark: %+v", got)
		case <-time.After(5 * time.Millisecond):
		}
	}
	killInit(t, p, r.InstanceID)
	got := <-done
	var ue *sandbox.UnavailableError
	if !errors.As(got.err, &ue) {
		t.Fatalf("exec under a killed sandbox: %+v, %v; want unavailable", got.res, got.err)
	}
	if b, _ := os.ReadFile(count); string(b) != "ran\n" {
		t.Fatalf("the command's marks: %q; want one (not run again)", b)
	}
}

// lazyJailSandbox creates a sandbox on a lazily supervised jail provider
// in a fresh state directory, and returns its record.
func lazyJailSandbox(t *testing.T, ctx context.Context, name string) (*Provider, *sandbox.Handle, *record) {
	t.Helper()
	p := newLocal(t, "jail", true)
	h, err := p.Create(ctx, name, sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := p.load(h.Name)
	if err != nil {
		t.Fatal(err)
	}
	return p, h, r
}

// killInit kills the jail init of instance iid behind the record's back.
func killInit(t *testing.T, p *Provider, iid string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(p.StateDir(), "mech", "jail", iid, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		InitPid int `json:"initPid"`
	}
	if err := json.Unmarshal(b, &st); err != nil || st.InitPid <= 0 {
		t.Fatalf("init pid %d: %v", st.InitPid, err)
	}
	if err := syscall.Kill(st.InitPid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
}

// The sandbox's WallClock limit bounds a spawned command as it bounds an
// Exec: through the supervisor and on the direct path, the command is
// killed at the end of its budget and told why on its stderr.
func TestSpawnedCommandsHaveTheBudget(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
			p := newLocal(t, "trusted", lazy)
			ctx := context.Background()
			h, err := p.Create(ctx, "budget", sandbox.CreateOptions{Limits: sandbox.Limits{WallClock: 300 * time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo start; sleep 20; echo after"}}, sandbox.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out, errOut, term := events(t, c)
			if took := time.Since(start); took > 15*time.Second {
				t.Fatalf("the command ran %v past a 300 ms budget", took)
			}
			if out != "start\n" || !strings.Contains(errOut, "ran out of its budget of 300ms") || term.Kind != sandbox.Exit || term.Code != 128+9 {
				t.Fatalf("stdout %q stderr %q terminal %+v", out, errOut, term)
			}
		})
	}
}

// A session whose sandbox's init dies under it has no exit status: it ends
// closed before exit (as when its supervisor dies), never with a made-up
// exit code, through the supervisor and on the direct path alike.
func TestSessionWhoseInitDiesIsLost(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
			p := newLocal(t, "jail", lazy)
			ctx := context.Background()
			h, err := p.Create(ctx, "initdies", sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo a; sleep 30"}}, sandbox.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if ev := <-c.Events(); ev.Kind != sandbox.Stdout {
				t.Fatalf("first event %+v", ev)
			}
			r, _, err := p.load(h.Name)
			if err != nil {
				t.Fatal(err)
			}
			killInit(t, p, r.InstanceID)
			_, _, term := events(t, c)
			if term.Kind == sandbox.Exit {
				t.Fatalf("a command whose init died exited with %d", term.Code)
			}
			var ue *sandbox.UnavailableError
			if !sandbox.IsClosedBeforeExit(term.Err) && !errors.As(term.Err, &ue) {
				t.Fatalf("terminal %v (%T), want closed before exit or unavailable", term.Err, term.Err)
			}
			t.Logf("terminal: %v", term.Err)
		})
	}
}

// newLocal is a provider over mechanism mech, lazy or with a supervisor
// per sandbox, whose sandboxes go at the test's end.
func newLocal(t testing.TB, mech string, lazy bool) *Provider {
	t.Helper()
	if mech != "trusted" {
		testenv.RequireRoot(t)
	}
	p, err := New(Config{StateDir: t.TempDir(), MechanismName: mech, LazySupervisor: lazy})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	return p
}
