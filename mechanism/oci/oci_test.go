package oci_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/oci"
)

var runtimes = []string{"runc", "runsc"}

// tid makes an id unique to this test process (tests of other packages
// drive the mechanism on the same machine concurrently).
func tid(name string) string { return fmt.Sprintf("%s-%d", name, os.Getpid()) }

func newMech(t *testing.T, runtime, dir string) *oci.Mechanism {
	t.Helper()
	m, err := oci.New(oci.Config{Runtime: runtime, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// started provisions and starts a sandbox destroyed at cleanup.
func started(t *testing.T, m *oci.Mechanism, id string, spec mechanism.Spec) {
	t.Helper()
	ctx := context.Background()
	if err := m.Provision(ctx, id, spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	if err := m.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
}

func TestParseName(t *testing.T) {
	for in, want := range map[string]string{"oci": "runc", "oci:runsc": "runsc", "oci/runc": "runc", "oci:/opt/crun": "/opt/crun"} {
		if got, ok := oci.ParseName(in); !ok || got != want {
			t.Errorf("ParseName(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
	for _, in := range []string{"jail", "oci:", "ocix", ""} {
		if _, ok := oci.ParseName(in); ok {
			t.Errorf("ParseName(%q) ok", in)
		}
	}
}

func TestMissingRuntimeRefused(t *testing.T) {
	m := newMech(t, "/nonexistent/runsc", t.TempDir())
	if m.Name() != "oci/runsc" {
		t.Errorf("name %q", m.Name())
	}
	err := m.Provision(context.Background(), "x", mechanism.Spec{})
	if !errors.Is(err, mechanism.ErrCapabilityUnavailable) || !strings.Contains(err.Error(), "runsc is not installed") ||
		!strings.Contains(err.Error(), "apt-get install runsc") {
		t.Fatalf("provision with a missing runtime = %v", err)
	}
	if s, err := m.Status(context.Background(), "x"); s != mechanism.StatusAbsent || err != nil {
		t.Errorf("status = %s, %v", s, err)
	}
	if ok, why := oci.Available(context.Background(), "/nonexistent/runc"); ok || !strings.Contains(why, "not installed") {
		t.Errorf("Available = %v, %q", ok, why)
	}
	if l, err := m.ListRunning(context.Background()); err != nil || len(l) != 0 {
		t.Errorf("ListRunning = %v, %v", l, err)
	}
}

// fakeRuntime is a runtime whose state answers are scripted: it reports
// the container in the state written in <dir>/state, or fails.
func fakeRuntime(t *testing.T) (path, stateFile string) {
	dir := t.TempDir()
	stateFile = filepath.Join(dir, "state")
	path = filepath.Join(dir, "fake-runtime")
	script := `#!/bin/sh
while [ "$1" = --root ]; do shift 2; done
cmd=$1; shift
s=$(cat ` + stateFile + `)
case $cmd in
create|delete|start|kill) exit 0 ;;
state) [ "$s" = fail ] && { echo "runtime broken" >&2; exit 1; }; printf '{"id":"%s","pid":1,"status":"%s","bundle":"/x"}' "$1" "$s" ;;
list) [ "$s" = fail ] && exit 1; echo '[]' ;;
esac
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, stateFile
}

func TestStatusUnknownNeverAbsent(t *testing.T) {
	rt, state := fakeRuntime(t)
	m, err := oci.New(oci.Config{Runtime: rt, StateDir: t.TempDir(), Prober: yes{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	os.WriteFile(state, []byte("created"), 0o644)
	if err := m.Provision(ctx, "u", mechanism.Spec{}); err != nil {
		t.Fatal(err)
	}
	for st, want := range map[string]mechanism.Status{
		"created": mechanism.StatusProvisioned, "running": mechanism.StatusRunning, "stopped": mechanism.StatusStopped,
		"paused": mechanism.StatusRunning, "creating": mechanism.StatusStarting, "frobnicated": mechanism.StatusUnknown,
		"fail": mechanism.StatusUnknown,
	} {
		os.WriteFile(state, []byte(st), 0o644)
		if got, err := m.Status(ctx, "u"); got != want || err != nil {
			t.Errorf("runtime state %q: status %s, %v; want %s", st, got, err, want)
		}
	}
	os.WriteFile(state, []byte("frobnicated"), 0o644)
	if l, err := m.ListRunning(ctx); err != nil || len(l) != 0 {
		t.Errorf("ListRunning = %v, %v", l, err)
	}
	if got, _ := m.Status(ctx, "never"); got != mechanism.StatusUnknown {
		// the fake lists nothing but answers state for any id
		t.Logf("status of a never-provisioned id with a runtime answering %q: %s", "frobnicated", got)
	}
	if err := m.Destroy(ctx, "u"); err != nil {
		t.Fatal(err)
	}
}

type yes struct{}

func (yes) Probe(_ context.Context, c mechanism.Capability) mechanism.Report {
	return mechanism.Report{Name: c, Available: true}
}

func TestDeclarations(t *testing.T) {
	for _, rt := range runtimes {
		m := newMech(t, rt, t.TempDir())
		req, con := mechanism.Required(m), mechanism.Constructed(m)
		for _, c := range req {
			if !slices.Contains(con, c) {
				t.Errorf("%s requires %s from the host", m.Name(), c)
			}
		}
		g := mechanism.Guaranteed(m)
		if slices.Contains(g, mechanism.MemoryCap) != (rt == "runc") || slices.Contains(g, mechanism.PidsCap) != (rt == "runc") {
			t.Errorf("%s guarantees %v", m.Name(), g)
		}
	}
}

func TestRestartKeepsListAndStatus(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			dir := t.TempDir()
			m := newMech(t, rt, dir)
			started(t, m, tid("keep"), mechanism.Spec{})
			// A second mechanism on the same state dir sees the running sandbox
			// (a restart of the managing process).
			m2 := newMech(t, rt, dir)
			if l, err := m2.ListRunning(context.Background()); err != nil || !slices.Equal(l, []string{tid("keep")}) {
				t.Fatalf("after restart ListRunning = %v, %v", l, err)
			}
			if s, _ := m2.Status(context.Background(), tid("keep")); s != mechanism.StatusRunning {
				t.Fatalf("after restart status %s", s)
			}
			c, err := m2.Execute(context.Background(), tid("keep"), []string{"echo", "hi"}, mechanism.ExecOptions{})
			if err != nil || string(c.Stdout) != "hi\n" {
				t.Fatalf("execute after restart: %+v %v", c, err)
			}
			// Another mechanism on another runtime or state dir does not list it.
			other := newMech(t, rt, t.TempDir())
			if l, _ := other.ListRunning(context.Background()); len(l) != 0 {
				t.Errorf("a foreign mechanism lists %v", l)
			}
		})
	}
}

func TestExecute(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			m := newMech(t, rt, t.TempDir())
			started(t, m, tid("ex"), mechanism.Spec{Env: []string{"A=spec", "B=spec"}})
			ctx := context.Background()
			c, err := m.Execute(ctx, tid("ex"), []string{"sh", "-c", `echo "$A $B $HOME $(pwd)"; cat; printf err >&2; exit 3`},
				mechanism.ExecOptions{Env: []string{"B=call"}, Dir: "/tmp", Stdin: strings.NewReader("input\n")})
			if err != nil || c.ExitStatus != 3 || string(c.Stdout) != "spec call /home/sprite /tmp\ninput\n" || string(c.Stderr) != "err" {
				t.Fatalf("completion %+v (stdout %q stderr %q), %v", c, c.Stdout, c.Stderr, err)
			}
			// The managing process's environment is not inherited.
			os.Setenv("MANAGOAT_OCI_SECRET", "leak")
			defer os.Unsetenv("MANAGOAT_OCI_SECRET")
			if c, _ := m.Execute(ctx, tid("ex"), []string{"env"}, mechanism.ExecOptions{}); bytes.Contains(c.Stdout, []byte("leak")) {
				t.Errorf("host environment leaked: %s", c.Stdout)
			}
			// The seccomp deny-list holds for exec'd commands (on runsc
			// through the filter-exec helper).
			c, _ = m.Execute(ctx, tid("ex"), []string{"sh", "-c", "unshare -U true 2>&1; echo rc=$?; grep ^Seccomp: /proc/self/status"}, mechanism.ExecOptions{})
			if !bytes.Contains(c.Stdout, []byte("Operation not permitted")) || !bytes.Contains(c.Stdout, []byte("Seccomp:\t2")) {
				t.Errorf("unshare in the container: %q", c.Stdout)
			}
			// Could not run: missing binary, missing dir, absent sandbox.
			for _, argv := range [][]string{{"no-such-binary"}, {"/bin/no-such"}} {
				if _, err := m.Execute(ctx, tid("ex"), argv, mechanism.ExecOptions{}); !errors.Is(err, mechanism.ErrCouldNotRun) {
					t.Errorf("%v: %v", argv, err)
				}
			}
			if _, err := m.Execute(ctx, tid("ex"), []string{"true"}, mechanism.ExecOptions{Dir: "/nope"}); !errors.Is(err, mechanism.ErrCouldNotRun) {
				t.Errorf("missing dir: %v", err)
			}
			if _, err := m.Execute(ctx, "absent", []string{"true"}, mechanism.ExecOptions{}); !errors.Is(err, mechanism.ErrNotFound) {
				t.Errorf("absent: %v", err)
			}
			// A forged marker from the command is just output.
			c, err = m.Execute(ctx, tid("ex"), []string{"sh", "-c", "echo managoat-x:notfound >&2; exit 127"}, mechanism.ExecOptions{})
			if err != nil || c.ExitStatus != 127 {
				t.Errorf("exit 127 with text: %+v %v", c, err)
			}
			// Cancel: could not run, the process group is gone.
			cctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			_, err = m.Execute(cctx, tid("ex"), []string{"sh", "-c", "sleep 30 & sleep 30"}, mechanism.ExecOptions{})
			if !errors.Is(err, mechanism.ErrCouldNotRun) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("canceled: %v", err)
			}
			c, _ = m.Execute(ctx, tid("ex"), []string{"sh", "-c", "ps -e -o comm= | grep -c sleep"}, mechanism.ExecOptions{})
			if strings.TrimSpace(string(c.Stdout)) != "1" { // the init's own sleep
				t.Errorf("sleeps left after cancel: %q", c.Stdout)
			}
			// Stop: could not run afterwards; Start brings the same home back.
			if _, err := m.Execute(ctx, tid("ex"), []string{"sh", "-c", "echo kept > $HOME/f"}, mechanism.ExecOptions{}); err != nil {
				t.Fatal(err)
			}
			if err := m.Stop(ctx, tid("ex")); err != nil {
				t.Fatal(err)
			}
			if _, err := m.Execute(ctx, tid("ex"), []string{"true"}, mechanism.ExecOptions{}); !errors.Is(err, mechanism.ErrNotRunning) {
				t.Errorf("stopped: %v", err)
			}
			if err := m.Start(ctx, tid("ex")); err != nil {
				t.Fatal(err)
			}
			if c, err := m.Execute(ctx, tid("ex"), []string{"cat", "f"}, mechanism.ExecOptions{}); err != nil || string(c.Stdout) != "kept\n" {
				t.Errorf("home after restart: %q %v", c.Stdout, err)
			}
			if u, err := m.Usage(ctx, tid("ex")); err != nil || u.MemoryBytes <= 0 || u.DiskBytes <= 0 {
				t.Errorf("usage %+v %v", u, err)
			}
		})
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

func TestStartProcess(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			m := newMech(t, rt, t.TempDir())
			started(t, m, tid("sp"), mechanism.Spec{Limits: mechanism.Limits{WallClock: time.Second}})
			ctx := context.Background()
			r, w, _ := os.Pipe()
			var out, errb syncBuf
			p, err := m.StartProcess(ctx, tid("sp"), mechanism.ProcessSpec{
				Argv: []string{"sh", "-c", "echo ready; echo e >&2; sleep 2; exec cat"}, Stdin: r, Stdout: &out, Stderr: &errb})
			r.Close()
			if err != nil {
				t.Fatal(err)
			}
			if (rt == "runc") != (p.Pid() > 0) {
				t.Errorf("pid %d", p.Pid())
			}
			deadline := time.Now().Add(10 * time.Second)
			for !strings.Contains(out.String(), "ready") && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			// The wall-clock budget (1 s) does not apply to a process.
			fmt.Fprintln(w, "echoed")
			w.Close()
			st, err := p.Wait()
			if err != nil || st.Code != 0 || out.String() != "ready\nechoed\n" || errb.String() != "e\n" {
				t.Fatalf("wait %+v %v; out %q err %q", st, err, out.String(), errb.String())
			}
			// Signal reaches the process group.
			p, err = m.StartProcess(ctx, tid("sp"), mechanism.ProcessSpec{Argv: []string{"sh", "-c", "sleep 60 & wait"}})
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(100 * time.Millisecond)
			if err := p.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if st, err := p.Wait(); err != nil || st.Code != 128+int(syscall.SIGTERM) {
				t.Errorf("after SIGTERM: %+v %v", st, err)
			}
			if _, err := m.StartProcess(ctx, tid("sp"), mechanism.ProcessSpec{Argv: []string{"nope-binary"}}); !errors.Is(err, mechanism.ErrCouldNotRun) {
				t.Errorf("missing binary: %v", err)
			}
		})
	}
}

// A container left in the runtime's root by a destroy cut short (the
// sandbox directory gone) does not block provisioning the id again.
func TestProvisionOverStaleContainer(t *testing.T) {
	requireRuntime(t, "runc")
	dir := t.TempDir()
	m := newMech(t, "runc", dir)
	id := tid("stale")
	started(t, m, id, mechanism.Spec{})
	sandboxes, _ := filepath.Glob(filepath.Join(dir, "runc", "sandboxes", id))
	if len(sandboxes) != 1 {
		t.Fatalf("sandbox dir not found under %s", dir)
	}
	// Keep the bundle (the container needs it to be deleted) but drop the
	// record that makes it ours.
	if err := os.Remove(filepath.Join(sandboxes[0], "spec.json")); err != nil {
		t.Fatal(err)
	}
	if err := m.Provision(context.Background(), id, mechanism.Spec{}); err != nil {
		t.Fatalf("provision over a stale container: %v", err)
	}
	if s, _ := m.Status(context.Background(), id); s != mechanism.StatusProvisioned {
		t.Fatalf("status %s", s)
	}
}

func TestConcurrentProvisionOneSandbox(t *testing.T) {
	requireRuntime(t, "runc")
	m := newMech(t, "runc", t.TempDir())
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = m.Provision(context.Background(), tid("race"), mechanism.Spec{}) }()
	}
	wg.Wait()
	defer m.Destroy(context.Background(), tid("race"))
	for _, err := range errs {
		if err != nil {
			t.Errorf("provision: %v", err)
		}
	}
	if err := m.Provision(context.Background(), tid("race"), mechanism.Spec{Env: []string{"X=1"}}); !errors.Is(err, mechanism.ErrExists) {
		t.Errorf("different spec: %v", err)
	}
}

func TestAvailable(t *testing.T) {
	for _, rt := range runtimes {
		requireRuntime(t, rt)
		ok, why := oci.Available(context.Background(), rt)
		if !ok {
			t.Errorf("%s: %s", rt, why)
		}
		t.Logf("%s: %v %s", rt, ok, why)
	}
}

// TestNoLeftovers runs last (alphabetically it need not): it checks that no
// container cgroup of this package is left on the host.
func TestZNoLeftoverCgroups(t *testing.T) {
	testenvRoot(t)
	var left []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return filepath.SkipDir
		}
		// Only this test process's sandboxes: other packages' tests use the
		// mechanism on the same machine at the same time.
		mine := strings.HasSuffix(d.Name(), fmt.Sprintf("-%d", os.Getpid())) || strings.Contains(d.Name(), fmt.Sprintf("-%d-", os.Getpid()))
		if d.IsDir() && strings.HasPrefix(d.Name(), "managoat-oci-") && mine {
			left = append(left, p)
			return filepath.SkipDir
		}
		if strings.Count(p, "/") > 7 {
			return filepath.SkipDir
		}
		return nil
	})
	if len(left) > 0 {
		t.Errorf("cgroups left behind: %v", left)
	}
}
