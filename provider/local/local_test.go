package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	MaybeRunSupervisor()
	if dir := os.Getenv(envChild); dir != "" {
		childSpawnAndDie(dir)
	}
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

func destroyAll(p *Provider) {
	ctx := context.Background()
	names, _ := p.ListAllNames(ctx)
	for _, n := range names {
		_ = p.Destroy(ctx, sandbox.BuildHandle(Name, n))
	}
}

func newJail(t testing.TB) *Provider { t.Helper(); return newLocal(t, "jail", false) }

func newTrusted(t testing.TB) *Provider { t.Helper(); return newLocal(t, "trusted", false) }

// trustedAndJail is a trusted provider and, as root, a jail one. Without
// root the jail's half is left out, said in the log, and a failure under
// CI=true (testenv's rule for a missing prerequisite), while the trusted
// half still runs.
func trustedAndJail(t testing.TB) map[string]*Provider {
	t.Helper()
	ps := map[string]*Provider{"trusted": newTrusted(t)}
	switch {
	case os.Geteuid() == 0:
		ps["jail"] = newJail(t)
	case testenv.InCI():
		t.Fatal("prerequisite missing under CI=true: the jail half needs root (euid 0)")
	default:
		t.Log("jail half not run: needs root (euid 0); under CI=true this is a failure")
	}
	return ps
}

// fixtures are the shell's, with Connect: a jail that enforces egress
// shows deny-all (Governance/EmptyAllowlistAccepted).
func fixtures() sandboxtest.Fixtures {
	fx := sandboxtest.ShellFixtures()
	fx.Connect = sandboxtest.ShellConnect
	return fx
}

// TestConformanceTrusted: trusted paths are host paths, so the suite's
// working directory is /tmp; the provider refuses files outside the
// sandbox's home even on trusted, so the suite's one file write is
// redirected into the home.
func TestConformanceTrusted(t *testing.T) {
	sandboxtest.Run(t, homeWriter{newTrusted(t)}, fixtures())
}

type homeWriter struct{ *Provider }

func (w homeWriter) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, o sandbox.WriteFileOptions) error {
	return w.Provider.WriteFile(ctx, h, strings.Replace(path, "/tmp/", "/home/sprite/", 1), data, o)
}

func (w homeWriter) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	return w.Provider.ReadFile(ctx, h, strings.Replace(path, "/tmp/", "/home/sprite/", 1))
}

// TestConformanceJail: the suite on the jail. The jail's init ignores
// SIGTERM and its workloads inherit that (mechanism/jail, reported), so a
// graceful termination there always runs its whole grace before SIGKILL;
// shortGrace turns the suite's default 10 s grace into 1 s to keep the
// run short. Nothing else is changed.
func TestConformanceJail(t *testing.T) {
	sandboxtest.Run(t, shortGrace{newJail(t)}, fixtures(), sandboxtest.WithDir("/home/sprite"), sandboxtest.WithTimeout(5*time.Second))
}

type shortGrace struct{ *Provider }

func (g shortGrace) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, o sandbox.TerminateOptions) error {
	if o.Timeout == 0 || o.Timeout > time.Second {
		o.Timeout = time.Second
	}
	return g.Provider.TerminateSession(ctx, h, id, o)
}

func TestDefaultStateDir(t *testing.T) {
	t.Setenv("MANAGOAT_HOME", "/x/y")
	if d := DefaultStateDir(); d != "/x/y" {
		t.Fatalf("DefaultStateDir = %q", d)
	}
	t.Setenv("MANAGOAT_HOME", "")
	if os.Geteuid() == 0 {
		if d := DefaultStateDir(); d != "/var/lib/managoat" {
			t.Fatalf("DefaultStateDir as root = %q", d)
		}
	}
}

func TestUnwritableStateDir(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "file")
	os.WriteFile(f, nil, 0o600)
	if _, err := New(Config{StateDir: filepath.Join(f, "state"), MechanismName: "trusted"}); err == nil {
		t.Fatal("New on a state dir under a file succeeded")
	}
}

func TestFileEscapes(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "files", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteFile(ctx, h, "/home/sprite/a/b.txt", []byte("hi"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	if b, err := p.ReadFile(ctx, h, "a/b.txt"); err != nil || string(b) != "hi" {
		t.Fatalf("ReadFile = %q, %v", b, err)
	}
	outside := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(outside, []byte("secret"), 0o600)
	home := p.HostPath(h, "/home/sprite")
	os.Symlink(filepath.Dir(outside), filepath.Join(home, "link"))
	for _, bad := range []string{"/etc/passwd", "../x", "/home/sprite/../../etc/passwd", "link/secret"} {
		var iv *sandbox.InvalidError
		if _, err := p.ReadFile(ctx, h, bad); !errors.As(err, &iv) {
			t.Errorf("ReadFile(%q) = %v, want Invalid", bad, err)
		}
		if err := p.WriteFile(ctx, h, bad, []byte("x"), sandbox.WriteFileOptions{}); !errors.As(err, &iv) {
			t.Errorf("WriteFile(%q) = %v, want Invalid", bad, err)
		}
	}
	if b, _ := os.ReadFile(outside); string(b) != "secret" {
		t.Fatalf("a write escaped: %q", b)
	}
	if _, err := p.ReadFile(ctx, h, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("missing file: %v", err)
	}
}

func TestCheckpointRestoresHome(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "cp", sandbox.CreateOptions{})
	p.WriteFile(ctx, h, "keep.txt", []byte("v1"), sandbox.WriteFileOptions{})
	id, err := p.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.WriteFile(ctx, h, "keep.txt", []byte("v2"), sandbox.WriteFileOptions{})
	p.WriteFile(ctx, h, "new.txt", []byte("x"), sandbox.WriteFileOptions{})
	if err := p.RestoreCheckpoint(ctx, h, id); err != nil {
		t.Fatal(err)
	}
	if b, _ := p.ReadFile(ctx, h, "keep.txt"); string(b) != "v1" {
		t.Fatalf("restored %q", b)
	}
	if _, err := p.ReadFile(ctx, h, "new.txt"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("file made after the checkpoint survived restore: %v", err)
	}
}

// Sessions outlive the provider value that started them, and a kill -9 of
// the supervisor leaves the sandbox stopped, its journal whole.
func TestSessionsOutliveCaller(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "outlive", sandbox.CreateOptions{})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo one; echo two >&2; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	c.Stop()
	// A new provider over the same state dir: as if the CLI exited and came back.
	p2, err := New(Config{StateDir: p.StateDir(), Mechanism: p.Mechanism()})
	if err != nil {
		t.Fatal(err)
	}
	ss, _ := p2.ListSessions(ctx, h)
	if len(ss) != 1 {
		t.Fatalf("sessions %+v", ss)
	}
	a, err := p2.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.WriteStdin(ctx, []byte("three\n")); err != nil {
		t.Fatal(err)
	}
	var out, errb string
	deadline := time.After(10 * time.Second)
	for out != "one\nthree\n" || errb != "two\n" {
		select {
		case ev := <-a.Events():
			if ev.Kind == sandbox.Stdout {
				out += string(ev.Data)
			} else if ev.Kind == sandbox.Stderr {
				errb += string(ev.Data)
			} else {
				t.Fatalf("event %v", ev)
			}
		case <-deadline:
			t.Fatalf("got %q %q", out, errb)
		}
	}
	info, err := p2.Get(ctx, h)
	if err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get = %+v %v", info, err)
	}
	pid, _ := supervisorPid(ctx, p2, h)
	syscallKill(pid)
	waitFor(t, func() bool { return syscall.Kill(pid, 0) != nil })
	// The sandbox runs on without its supervisor: Get says so, a new
	// supervisor having adopted it (and killed the orphaned session).
	info, err = p2.Get(ctx, h)
	if err != nil || info.Status != sandbox.StatusRunning || !strings.Contains(string(info.Raw), `"readopted":true`) {
		t.Fatalf("Get after the supervisor's kill -9: %+v %s %v", info, info.Raw, err)
	}
	// The attached command ends with an error, never an exit.
	for ev := range a.Events() {
		if ev.Kind == sandbox.Exit {
			t.Fatalf("exit %d after the supervisor died", ev.Code)
		}
		if ev.Kind == sandbox.Error && !sandbox.IsClosedBeforeExit(ev.Err) {
			t.Fatalf("error %v", ev.Err)
		}
	}
	// Attach again: every byte journaled before the kill, then the error.
	a2, err := p2.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out = ""
	var last sandbox.Event
	for ev := range a2.Events() {
		if ev.Kind == sandbox.Stdout {
			out += string(ev.Data)
		}
		last = ev
	}
	if out != "one\nthree\n" || last.Kind != sandbox.Error {
		t.Fatalf("replay %q, last %v", out, last)
	}
	if names, _ := p2.ListAllNames(ctx); len(names) != 1 || names[0] != "outlive" {
		t.Fatalf("names %v", names)
	}
	// The next exec starts it again.
	res, err := p2.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"back"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "back\n" {
		t.Fatalf("exec after restart %q %v", res.Output, err)
	}
}

// heldOpen reports whether a process holds the file at path open.
func heldOpen(path string) bool {
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		if l, err := os.Readlink(fd); err == nil && l == path {
			return true
		}
	}
	return false
}

func waitFor(t *testing.T, f func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !f() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A limit the mechanism cannot enforce is refused at create, and nothing
// is left behind that ListAllNames would show.
func TestUnenforceableLimitRefused(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	_, err := p.Create(ctx, "limited", sandbox.CreateOptions{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || !strings.Contains(err.Error(), "memory_cap") {
		t.Fatalf("Create with a memory limit on trusted = %v, want Invalid naming memory_cap", err)
	}
	if names, _ := p.ListAllNames(ctx); len(names) != 0 {
		t.Fatalf("names after a refused create: %v", names)
	}
	if ents, _ := os.ReadDir(filepath.Join(p.StateDir(), "instances")); len(ents) != 0 {
		t.Fatalf("instances left after a refused create: %d", len(ents))
	}
	if _, err := p.Create(ctx, "neg", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: -1}}); !errors.As(err, &iv) {
		t.Fatalf("negative limit: %v", err)
	}
}

// Suspend stops the sessions' processes; Resume continues them.
// Suspend stops every process of the sandbox, and Resume continues them.
// On the jail that includes a process in a session of its own (setsid),
// which the cgroup freezer holds; trusted, without cgroups, can stop only
// the sessions' process groups.
func TestSuspendStopsProcesses(t *testing.T) {
	t.Run("trusted", func(t *testing.T) { testSuspend(t, newTrusted(t), false) })
	t.Run("jail", func(t *testing.T) { testSuspend(t, newJail(t), true) })
}

func testSuspend(t *testing.T, p *Provider, apart bool) {
	ctx := context.Background()
	h, _ := p.Create(ctx, "susp", sandbox.CreateOptions{})
	// Tickers append to files in the home (each ends by itself after a
	// minute or so, whatever happens to the test).
	tick := func(file string) string {
		return `i=0; while [ $i -lt 3000 ]; do echo x >> ` + file + `; i=$((i+1)); sleep 0.02; done`
	}
	script := `(` + tick("own") + `) & `
	if apart {
		script += `setsid sh -c '` + tick("apart") + `' & `
	}
	script += `echo ready; exec cat`
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	<-c.Events()
	size := func(name string) int {
		b, _ := p.ReadFile(ctx, h, name)
		return len(b)
	}
	files := []string{"own"}
	if apart {
		files = append(files, "apart")
	}
	sizes := func() []int {
		var s []int
		for _, f := range files {
			s = append(s, size(f))
		}
		return s
	}
	waitFor(t, func() bool { return !slices.Contains(sizes(), 0) })
	if err := p.Suspend(ctx, h); err != nil {
		t.Fatal(err)
	}
	if info, _ := p.Get(ctx, h); info.Status != sandbox.StatusSuspended {
		t.Fatalf("Get after Suspend = %v", info.Status)
	}
	time.Sleep(50 * time.Millisecond) // a write under way when the signal came
	before := sizes()
	time.Sleep(400 * time.Millisecond) // 20 ticks, were anything running
	if after := sizes(); !slices.Equal(before, after) {
		t.Fatalf("files %v grew from %v to %v while the sandbox was suspended", files, before, after)
	}
	if _, err := p.Resume(ctx, h); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		now := sizes()
		for i := range now {
			if now[i] <= before[i] {
				return false
			}
		}
		return true
	})
	if info, _ := p.Get(ctx, h); info.Status != sandbox.StatusRunning {
		t.Fatalf("Get after Resume = %v", info.Status)
	}
	// The session still answers.
	if err := c.WriteStdin(ctx, []byte("still here\n")); err != nil {
		t.Fatal(err)
	}
}

// A full state directory is a clear error, never a half-created sandbox.
func TestFullStateDir(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=2m"); err != nil {
		testenv.Require(t, false, "mount tmpfs: "+err.Error())
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	p, err := New(Config{StateDir: dir, MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := p.Create(ctx, "before", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Fill the disk.
	f, _ := os.Create(filepath.Join(dir, "filler"))
	f.Write(make([]byte, 4<<20))
	f.Close()
	// A session that cannot be recorded is an error, not an id nobody
	// can find again.
	if c, err := p.Spawn(ctx, before, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi"}}, sandbox.SpawnOptions{Detachable: true}); err == nil {
		c.Stop()
		t.Fatalf("Spawn on a full disk gave session %q", c.SessionID)
	} else {
		t.Logf("spawn on a full disk: %v", err)
	}
	if ss, err := p.ListSessions(ctx, before); err != nil || len(ss) != 0 {
		t.Fatalf("sessions after a failed spawn: %v %v", ss, err)
	}
	_ = p.Destroy(ctx, before)
	_, err = p.Create(ctx, "full", sandbox.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "no space") {
		t.Fatalf("Create on a full disk = %v, want a no-space error", err)
	}
	if names, _ := p.ListAllNames(ctx); len(names) != 0 {
		t.Fatalf("names after a failed create: %v", names)
	}
	if _, err := p.Get(ctx, sandbox.BuildHandle(Name, "full")); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get after a failed create: %v", err)
	}
}

// On the jail: after a kill -9 of the supervisor the sandbox runs on (its
// init and its background processes), so Get says running, with a new
// supervisor that adopted it (Get said stopped, a lie); the session's
// journal is whole, its orphaned process killed, and the next Exec works.
// A mechanism sandbox stopped behind a live supervisor is started again.
func TestJailKill9AndRestart(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	h, err := p.Create(ctx, "k9", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	<-c.Events()
	c.Stop()
	ms, _ := supervisor.ReadSessions(p.sandboxDir(h.Name))
	pid, _ := supervisorPid(ctx, p, h)
	if _, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "setsid sh -c 'while :; do echo t >> $HOME/ticks; sleep 0.1; done' </dev/null >/dev/null 2>&1 &"}}, sandbox.ExecOptions{}); err != nil {
		t.Fatal(err)
	}
	syscallKill(pid)
	waitFor(t, func() bool { return syscall.Kill(pid, 0) != nil })
	info, err := p.Get(ctx, h)
	if err != nil || info.Status != sandbox.StatusRunning || !strings.Contains(string(info.Raw), `"readopted":true`) {
		t.Fatalf("Get after kill -9 of the supervisor: %+v %s %v, want running, readopted", info, info.Raw, err)
	}
	if npid, err := supervisorPid(ctx, p, h); err != nil || npid == pid {
		t.Fatalf("no new supervisor: %d %v", npid, err)
	}
	r0, _, _ := p.load(h.Name)
	home := p.homeDir(r0.InstanceID)
	ticks := func() int { b, _ := os.ReadFile(filepath.Join(home, "ticks")); return len(b) }
	n := ticks()
	waitFor(t, func() bool { return ticks() > n }) // the background process runs on
	a, err := p.Attach(ctx, h, ms[0].ID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var last sandbox.Event
	for ev := range a.Events() {
		if ev.Kind == sandbox.Stdout {
			out += string(ev.Data)
		}
		last = ev
	}
	if out != "ready\n" || last.Kind != sandbox.Error {
		t.Fatalf("replay %q then %v", out, last.Kind)
	}
	if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"back"}}, sandbox.ExecOptions{}); err != nil || string(res.Output) != "back\n" {
		t.Fatalf("exec after kill -9: %q %v", res.Output, err)
	}
	waitFor(t, func() bool { return syscall.Kill(ms[0].Pid, 0) != nil })
	// The mechanism's sandbox stopped under a live supervisor.
	r, _, _ := p.load(h.Name)
	if err := p.mech.Stop(ctx, r.InstanceID); err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"again"}}, sandbox.ExecOptions{}); err != nil || string(res.Output) != "again\n" {
		t.Fatalf("exec after a mechanism stop: %q %v", res.Output, err)
	}
}

// TestConformanceOCI: the suite on mechanism/oci with runc (root only).
func TestConformanceOCI(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("runc")
	testenv.Require(t, err == nil, "runc is not installed")
	if testing.Short() {
		t.Skip("the suite on runc takes about 10 s; run without -short")
	}
	p, err := New(Config{StateDir: t.TempDir(), MechanismName: "oci"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	sandboxtest.Run(t, shortGrace{p}, fixtures(), sandboxtest.WithDir("/home/sprite"), sandboxtest.WithTimeout(5*time.Second))
}

// TestConformanceOCIRunsc: the suite on mechanism/oci with gVisor's runsc
// (ptrace platform), root only.
func TestConformanceOCIRunsc(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := exec.LookPath("runsc")
	testenv.Require(t, err == nil, "runsc is not installed (apt-get install runsc)")
	if testing.Short() {
		t.Skip("the suite on runsc takes about 30 s; run without -short")
	}
	p, err := New(Config{StateDir: t.TempDir(), MechanismName: "oci:runsc"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	sandboxtest.Run(t, shortGrace{p}, fixtures(), sandboxtest.WithDir("/home/sprite"), sandboxtest.WithTimeout(10*time.Second))
}

// Leftovers of a process killed mid-Create or mid-Destroy are swept once
// they are old enough; a live sandbox is never touched.
func TestSweep(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "live", sandbox.CreateOptions{})
	old := time.Now().Add(-2 * sweepAge)
	// An instance nobody refers to, a record under construction, a trash record.
	orphan := p.instanceDir("deadbeef00000000")
	os.MkdirAll(filepath.Join(orphan, "home"), 0o700)
	newRec := filepath.Join(p.StateDir(), "tmp", "new-0123456789abcdef")
	os.MkdirAll(newRec, 0o700)
	young := p.instanceDir("fedcba9876543210")
	os.MkdirAll(young, 0o700)
	for _, d := range []string{orphan, newRec} {
		os.Chtimes(d, old, old)
	}
	if err := p.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("orphan instance kept: %v", err)
	}
	if _, err := os.Stat(newRec); !os.IsNotExist(err) {
		t.Fatalf("old record under construction kept: %v", err)
	}
	if _, err := os.Stat(young); err != nil {
		t.Fatalf("young instance swept: %v", err)
	}
	if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("live sandbox harmed: %v %v", res, err)
	}
}

// TestSweepFollowsTheMarks: an instance a Create cut short left is found
// by the mark that Create makes first (tmp/new-<id>), even where counting
// instances against sandboxes would not show it (here a record whose
// instance went missing evens the count).
func TestSweepFollowsTheMarks(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	if _, err := p.Create(ctx, "live", sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * sweepAge)
	orphan := p.instanceDir("feedface00000000")
	mark := filepath.Join(p.StateDir(), "tmp", "new-feedface00000000")
	ghost := p.sandboxDir("ghost")
	rec, _ := json.Marshal(record{Name: "ghost", InstanceID: "0000000000000001", Mechanism: "trusted"})
	for _, d := range []string{filepath.Join(orphan, "home"), mark, ghost} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(ghost, "meta.json"), rec, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{orphan, mark} {
		os.Chtimes(d, old, old)
	}
	if err := p.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(orphan); !os.IsNotExist(err) {
		t.Fatalf("marked orphan instance kept: %v", err)
	}
	if _, err := os.Stat(mark); !os.IsNotExist(err) {
		t.Fatalf("old mark kept: %v", err)
	}
}

// TestSweepLeavesARunningCreate: a Create slower than a minute (an image
// pull, a first template) holds the lock on its mark, and Sweep leaves its
// mark and instance alone until it has let go.
func TestSweepLeavesARunningCreate(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	old := time.Now().Add(-2 * sweepAge)
	inst := p.instanceDir("abad1dea00000000")
	mark := filepath.Join(p.StateDir(), "tmp", "new-abad1dea00000000")
	for _, d := range []string{filepath.Join(inst, "home"), mark} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(d, old, old)
	}
	os.Chtimes(inst, old, old)
	unlock, err := flock.Lock(ctx, mark)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{inst, mark} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("a running Create's %s was swept: %v", d, err)
		}
	}
	unlock()
	if err := p.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{inst, mark} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Fatalf("an abandoned Create's %s was kept: %v", d, err)
		}
	}
}

// failingDestroy is a mechanism whose Destroy fails while fail is set.
type failingDestroy struct {
	mechanism.Mechanism
	fail atomic.Bool
}

func (f *failingDestroy) Destroy(ctx context.Context, id string) error {
	if f.fail.Load() {
		return errors.New("teardown interrupted")
	}
	return f.Mechanism.Destroy(ctx, id)
}

// TestDestroyLeavesWhatFailedToSweep: a Destroy whose mechanism teardown
// fails frees the name and leaves the record (its mark) and the instance
// for Sweep, which finishes the job.
func TestDestroyLeavesWhatFailedToSweep(t *testing.T) {
	state := t.TempDir()
	tr, err := OpenMechanism("trusted", state)
	if err != nil {
		t.Fatal(err)
	}
	m := &failingDestroy{Mechanism: tr}
	p, err := New(Config{StateDir: state, Mechanism: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	ctx := context.Background()
	h, err := p.Create(ctx, "leaky", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := p.load(h.Name)
	if err != nil {
		t.Fatal(err)
	}
	m.fail.Store(true)
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.load(h.Name); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the name is still taken: %v", err)
	}
	marks, _ := filepath.Glob(filepath.Join(state, "tmp", "trash-"+r.InstanceID+"-*"))
	if len(marks) != 1 {
		t.Fatalf("marks %v, want the record left in tmp", marks)
	}
	if _, err := os.Stat(p.instanceDir(r.InstanceID)); err != nil {
		t.Fatalf("the instance went before its sandbox: %v", err)
	}
	m.fail.Store(false)
	// The mark's supervisor may still be ending, writing its last state
	// file (a rename in the mark, which makes the mark young again): age
	// the mark and sweep until both are gone, bounded.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		old := time.Now().Add(-2 * sweepAge)
		os.Chtimes(marks[0], old, old)
		os.Chtimes(p.instanceDir(r.InstanceID), old, old)
		if err := p.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, d := range []string{marks[0], p.instanceDir(r.InstanceID)} {
			if _, err := os.Stat(d); !os.IsNotExist(err) {
				left = append(left, fmt.Sprintf("%s: %v", d, err))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sweep left %v", left)
		}
	}
	if st, err := tr.Status(ctx, r.InstanceID); err != nil || st != mechanism.StatusAbsent {
		t.Fatalf("mechanism sandbox after Sweep: %v %v", st, err)
	}
}

// TestConformanceTrustedLazy: the suite with Config.LazySupervisor.
func TestConformanceTrustedLazy(t *testing.T) {
	dir := t.TempDir()
	p, err := New(Config{StateDir: dir, MechanismName: "trusted", LazySupervisor: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	ctx := context.Background()
	h, err := p.Create(ctx, "lazy", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := supervisorPid(ctx, p, h); !errors.Is(err, supervisor.ErrNoSupervisor) {
		t.Fatalf("a lazy Create started a supervisor: %v", err)
	}
	if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %v", res, err)
	}
	if _, err := supervisorPid(ctx, p, h); !errors.Is(err, supervisor.ErrNoSupervisor) {
		t.Fatalf("a lazy Exec started a supervisor: %v", err)
	}
	if info, err := p.Get(ctx, h); err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get = %v %v", info, err)
	}
	// A non-detachable spawn takes the direct path (no session to attach),
	// so the suite asks for detachable spawns, as E2B's does.
	sandboxtest.Run(t, homeWriter{p}, fixtures(), sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}))
}

// Exec returns the whole output, past the mechanism's 1 MiB capture cap,
// in order with stderr when merged.
func TestExecLargeOutput(t *testing.T) {
	ps := trustedAndJail(t)
	for name, p := range ps {
		ctx := context.Background()
		h, err := p.Create(ctx, "big", sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "head -c 3000000 /dev/zero; echo end >&2"}}, sandbox.ExecOptions{StderrToStdout: true})
		// Two pipes: the order across stdout and stderr is the order the
		// chunks were read, which a scheduler may change.
		if err != nil || len(res.Output) != 3000004 || !bytes.Contains(res.Output, []byte("end\n")) {
			t.Fatalf("%s: exec output %d bytes, %v", name, len(res.Output), err)
		}
		var iv *sandbox.InvalidError
		if _, err := p.Exec(ctx, h, sandbox.Cmd{Name: "no-such-binary-xyz"}, sandbox.ExecOptions{}); !errors.As(err, &iv) {
			t.Fatalf("%s: exec of a missing binary = %v, want Invalid (never an exit code)", name, err)
		}
		if c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "no-such-binary-xyz"}, sandbox.SpawnOptions{}); !errors.As(err, &iv) {
			if c != nil {
				c.Stop()
			}
			t.Fatalf("%s: spawn of a missing binary = %v, want Invalid", name, err)
		}
		if ss, _ := p.ListSessions(ctx, h); len(ss) != 0 {
			t.Fatalf("%s: a session that never started is listed: %+v", name, ss)
		}
	}
}

// On trusted, /home/sprite in the command line means the sandbox's home,
// and PATH starts with the home's tool directories (runner spec §2.3, §2.4).
func TestTrustedCommandMapping(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "map", sandbox.CreateOptions{})
	home := p.HostPath(h, "/home/sprite")
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", `echo /home/sprite/x; echo "$PATH"; echo "$npm_config_prefix"`}}, sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(res.Output)), "\n")
	if len(lines) != 3 || lines[0] != home+"/x" || !strings.HasPrefix(lines[1], home+"/.local/bin:"+home+"/.npm-global/bin:"+home+"/.bun/bin:") || lines[2] != home+"/.npm-global" {
		t.Fatalf("output %q", res.Output)
	}
	res, err = p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", `echo "$PATH"`}}, sandbox.ExecOptions{Env: []string{"PATH=/bin"}})
	if err != nil || string(res.Output) != "/bin\n" {
		t.Fatalf("caller's PATH must win: %q %v", res.Output, err)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "ls", Args: []string{"/home/sprite"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for range c.Events() {
	}
	if ss, _ := p.ListSessions(ctx, h); len(ss) != 1 || ss[0].Command != "ls /home/sprite" {
		t.Fatalf("sessions %+v", ss)
	}
}

// A session's process starts with no signal ignored (the supervisor must
// not pass on its own dispositions): Ctrl-C and SIGTERM reach it.
func TestSessionSignalsNotIgnored(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "sig", sandbox.CreateOptions{})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "grep", Args: []string{"SigIgn", "/proc/self/status"}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	for ev := range c.Events() {
		out += string(ev.Data)
	}
	if out != "SigIgn:\t0000000000000000\n" {
		t.Fatalf("session's ignored signals: %q", out)
	}
}

// A TTY session runs on a pseudo-terminal of the asked size; its output
// (the terminal's, echo included) is stdout; CloseStdin is an EOT.
func TestTTY(t *testing.T) {
	ps := trustedAndJail(t)
	for name, p := range ps {
		ctx := context.Background()
		h, _ := p.Create(ctx, "tty", sandbox.CreateOptions{})
		c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "test -t 0 && test -t 1 && test -t 2 && echo isatty; stty size; echo err >&2"}},
			sandbox.SpawnOptions{TTY: true, TTYRows: 30, TTYCols: 100})
		if err != nil {
			t.Fatal(err)
		}
		var out string
		var last sandbox.Event
		for ev := range c.Events() {
			if ev.Kind == sandbox.Stderr {
				t.Errorf("%s: a stderr event in TTY mode", name)
			}
			out += string(ev.Data)
			last = ev
		}
		if out != "isatty\r\n30 100\r\nerr\r\n" || last.Kind != sandbox.Exit || last.Code != 0 {
			t.Fatalf("%s: tty output %q, last %v", name, out, last)
		}
		c, err = p.Spawn(ctx, h, sandbox.Cmd{Name: "cat"}, sandbox.SpawnOptions{TTY: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.WriteStdin(ctx, []byte("hi\n")); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseStdin(ctx); err != nil {
			t.Fatal(err)
		}
		out = ""
		for ev := range c.Events() {
			out += string(ev.Data)
			last = ev
		}
		if out != "hi\r\nhi\r\n" || last.Kind != sandbox.Exit || last.Code != 0 {
			t.Fatalf("%s: cat on a tty: %q, last %v", name, out, last)
		}
		if ss, _ := p.ListSessions(ctx, h); len(ss) != 2 || !ss[0].TTY {
			t.Fatalf("%s: sessions %+v", name, ss)
		}
	}
}

// envChild makes the test binary a short-lived client: it creates a
// sandbox, spawns a session, prints the session id and kills itself.
const envChild = "MANAGOAT_LOCAL_TEST_CHILD"

func childSpawnAndDie(stateDir string) {
	p, err := New(Config{StateDir: stateDir, MechanismName: "trusted"})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx := context.Background()
	h, err := p.Create(ctx, "child", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	<-c.Events()
	fmt.Println("session", c.SessionID)
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
}

// The process that spawned a session is killed with kill -9; another
// process attaches, replays from byte zero and talks to the session.
func TestSessionOutlivesKilledProcess(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+dir)
	out, _ := cmd.Output() // killed by SIGKILL: an error is expected
	id, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "session ")
	if !ok {
		t.Fatalf("child said %q", out)
	}
	p, err := New(Config{StateDir: dir, MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	ctx := context.Background()
	h := sandbox.BuildHandle(Name, "child")
	if info, err := p.Get(ctx, h); err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get after the creator died = %+v, %v", info, err)
	}
	a, err := p.Attach(ctx, h, id, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if err := a.WriteStdin(ctx, []byte("still here\n")); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	var got string
	var last sandbox.Event
	for ev := range a.Events() {
		got += string(ev.Data)
		last = ev
	}
	if got != "ready\nstill here\n" || last.Kind != sandbox.Exit || last.Code != 0 {
		t.Fatalf("attach after kill -9 of the creator: %q, last %v", got, last)
	}
}

// CreateCheckpointOnce makes one checkpoint per operation id.
func TestCreateCheckpointOnce(t *testing.T) {
	p := newTrusted(t)
	ctx := context.Background()
	h, _ := p.Create(ctx, "cpo", sandbox.CreateOptions{})
	p.WriteFile(ctx, h, "f", []byte("v1"), sandbox.WriteFileOptions{})
	id, err := p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op_1"})
	if err != nil || id == "" {
		t.Fatal(id, err)
	}
	again, err := p.CreateCheckpointOnce(ctx, h, sandbox.CheckpointOnceOptions{OperationID: "op_1"})
	if err != nil || again != id {
		t.Fatalf("same operation: %q %v, want %q", again, err, id)
	}
	ids, _ := p.Checkpoints(ctx, h)
	if len(ids) != 1 {
		t.Fatalf("checkpoints %v", ids)
	}
	p.WriteFile(ctx, h, "f", []byte("v2"), sandbox.WriteFileOptions{})
	if err := p.RestoreCheckpoint(ctx, h, id); err != nil {
		t.Fatal(err)
	}
	if b, _ := p.ReadFile(ctx, h, "f"); string(b) != "v1" {
		t.Fatalf("restored %q", b)
	}
	var iv *sandbox.InvalidError
	for _, o := range []sandbox.CheckpointOnceOptions{{OperationID: ""}, {OperationID: "a b"}, {OperationID: "x", Timeout: 121 * time.Second}, {OperationID: "x", Timeout: -1}} {
		if _, err := p.CreateCheckpointOnce(ctx, h, o); !errors.As(err, &iv) {
			t.Errorf("%+v: %v, want Invalid", o, err)
		}
	}
}

// countingSweeper is a mechanism whose orphan sweep counts its calls.
type countingSweeper struct {
	mechanism.Mechanism
	calls atomic.Int64
}

func (c *countingSweeper) SweepOrphans(context.Context) ([]string, error) {
	c.calls.Add(1)
	return nil, nil
}

// TestSweepOrphansEveryInterval: opening the provider has the mechanism
// sweep its orphans once, then not again until the stamp is older than
// orphanInterval.
func TestSweepOrphansEveryInterval(t *testing.T) {
	state := t.TempDir()
	tr, err := OpenMechanism("trusted", state)
	if err != nil {
		t.Fatal(err)
	}
	m := &countingSweeper{Mechanism: tr}
	open := func() {
		t.Helper()
		if _, err := New(Config{StateDir: state, Mechanism: m}); err != nil {
			t.Fatal(err)
		}
	}
	open()
	open()
	if n := m.calls.Load(); n != 1 {
		t.Fatalf("%d sweeps after two opens, want 1", n)
	}
	stamp := filepath.Join(state, "tmp", "orphans-swept")
	then := time.Now().Add(-orphanInterval - time.Second)
	if err := os.Chtimes(stamp, then, then); err != nil {
		t.Fatal(err)
	}
	open()
	if n := m.calls.Load(); n != 2 {
		t.Fatalf("%d sweeps after the stamp aged, want 2", n)
	}
	open()
	if n := m.calls.Load(); n != 2 {
		t.Fatalf("%d sweeps after the stamp was renewed, want 2", n)
	}
	// A stamp replaced by an old symlink is neither followed (no file is
	// made where it points) nor swept for on every command.
	target := filepath.Join(t.TempDir(), "made-by-root")
	if err := os.Remove(stamp); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, stamp); err != nil {
		t.Fatal(err)
	}
	ts := []unix.Timespec{unix.NsecToTimespec(then.UnixNano()), unix.NsecToTimespec(then.UnixNano())}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, stamp, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
	open()
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stamp's symlink was followed: %v", err)
	}
	if n := m.calls.Load(); n != 2 {
		t.Fatalf("%d sweeps with a symlinked stamp, want 2", n)
	}
}

// A sandbox that cannot start (a pids limit above the kernel's maximum is
// refused at launch) fails Create at once and leaves nothing: the undo
// once waited forever on the lock its own Create held.
func TestCreateThatCannotStartLeavesNothing(t *testing.T) {
	for _, lazy := range []bool{false, true} {
		t.Run(fmt.Sprint("lazy=", lazy), func(t *testing.T) {
			p := newLocal(t, "jail", lazy)
			done := make(chan error, 1)
			go func() {
				_, err := p.Create(context.Background(), "nostart", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 1 << 23}})
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatal("a sandbox over the kernel's pids maximum was created")
				}
				t.Logf("create: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("Create of a sandbox that cannot start did not return in 30 s")
			}
			if _, err := p.Get(context.Background(), sandbox.BuildHandle(Name, "nostart")); !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("after the failed create, Get = %v", err)
			}
		})
	}
}

// A frozen process takes no signal: terminating a session of a suspended
// sandbox thaws it for the kill and suspends it again, and a Destroy of a
// suspended sandbox does not wait on kills that cannot land.
func TestSuspendedSandboxStillTerminatesAndDestroys(t *testing.T) {
	for _, mech := range []string{"jail", "trusted"} {
		t.Run(mech, func(t *testing.T) {
			p := newLocal(t, mech, false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			h, err := p.Create(ctx, "frozen-ops", sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			spawn := func() *sandbox.Command {
				c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec sleep 100"}}, sandbox.SpawnOptions{Detachable: true})
				if err != nil {
					t.Fatal(err)
				}
				<-c.Events()
				return c
			}
			c := spawn()
			if err := p.Suspend(ctx, h); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if err := p.TerminateSession(ctx, h, c.SessionID, sandbox.TerminateOptions{}); err != nil {
				t.Fatalf("terminate in a suspended sandbox: %v", err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("terminate took %v", took)
			}
			if info, _ := p.Get(ctx, h); info.Status != sandbox.StatusSuspended {
				t.Errorf("after the terminate the sandbox is %s, want still suspended", info.Status)
			}
			c.Stop()
			if _, err := p.Resume(ctx, h); err != nil {
				t.Fatal(err)
			}
			c = spawn()
			defer c.Stop()
			if err := p.Suspend(ctx, h); err != nil {
				t.Fatal(err)
			}
			start = time.Now()
			if err := p.Destroy(ctx, h); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("destroy of a suspended sandbox took %v", took)
			}
		})
	}
}

// A Spawn racing a Suspend either runs (the suspended sandbox resumed for
// it) or fails and never runs: it does not wait on a frozen sandbox, fail,
// and run after the Resume.
func TestSpawnRacingSuspend(t *testing.T) {
	p := newJail(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h, err := p.Create(ctx, "race", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 12 {
		name := fmt.Sprintf("ran%d", i)
		type spawned struct {
			c   *sandbox.Command
			err error
		}
		done := make(chan spawned, 1)
		go func() {
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			defer scancel()
			c, err := p.Spawn(sctx, h, sandbox.Cmd{Name: "touch", Args: []string{name}}, sandbox.SpawnOptions{Detachable: true})
			done <- spawned{c, err}
		}()
		for range i % 4 {
			exec.Command("true").Run() // a short pause that is not a sleep
		}
		if err := p.Suspend(ctx, h); err != nil {
			t.Fatal(err)
		}
		sp := <-done
		serr := sp.err
		if _, err := p.Resume(ctx, h); err != nil {
			t.Fatal(err)
		}
		if serr == nil {
			// The command may have been frozen mid-way: it ends once resumed.
			_, _, term := events(t, sp.c)
			if term.Kind != sandbox.Exit || term.Code != 0 {
				t.Fatalf("round %d: the spawned command ended %+v", i, term)
			}
		}
		if serr != nil {
			mustNot := func() bool { _, err := p.ReadFile(ctx, h, name); return err == nil }
			if mustNot() {
				t.Fatalf("round %d: the spawn failed (%v), yet its command ran", i, serr)
			}
			t.Fatalf("round %d: spawn: %v", i, serr)
		}
	}
}

// TestDefaultLimits: a jail sandbox made without limits gets the
// provider's defaults for the caps the jail guarantees (a fork loop stops
// at the default pids cap), a create's own limits win, a trusted sandbox
// gets none (trusted guarantees no cap), and a zero DefaultLimits turns
// them off.
func TestDefaultLimits(t *testing.T) {
	testenv.RequireRoot(t)
	ctx := context.Background()
	if d := DefaultLimits(); d.Pids != 1024 || d.MemoryBytes <= 0 || d.MemoryBytes > 8<<30 {
		t.Fatalf("DefaultLimits() = %+v", d)
	}
	dir := t.TempDir()
	p, err := New(Config{StateDir: dir, MechanismName: "jail", DefaultLimits: &sandbox.Limits{Pids: 16, MemoryBytes: 512 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(p)
	h, err := p.Create(ctx, "defaults", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r, _, err := p.load("defaults")
	if err != nil || r.Limits.Pids != 16 || r.Limits.MemoryBytes != 512<<20 {
		t.Fatalf("record limits %+v %v, want the defaults", r, err)
	}
	script := "import os, time\nn = 0\nfor i in range(50):\n    try:\n        if os.fork() == 0:\n            time.sleep(2)\n            os._exit(0)\n        n += 1\n    except OSError:\n        pass\nprint('forked', n)\n"
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "python3", Args: []string{"-c", script}}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	if err == nil && strings.Contains(string(res.Output), "forked 50") {
		t.Fatalf("50 forks under a default pids cap of 16: %q", res.Output)
	}
	if _, err := p.Create(ctx, "own", sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 40}}); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := p.load("own"); r == nil || r.Limits.Pids != 40 || r.Limits.MemoryBytes != 512<<20 {
		t.Fatalf("own limits: %+v", r)
	}
	off, err := New(Config{StateDir: t.TempDir(), MechanismName: "jail", DefaultLimits: &sandbox.Limits{}})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(off)
	if _, err := off.Create(ctx, "none", sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r, _, _ := off.load("none"); r == nil || r.Limits != (sandbox.Limits{}) {
		t.Fatalf("defaults off: %+v", r)
	}
	tr, err := New(Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(tr)
	if _, err := tr.Create(ctx, "trusted", sandbox.CreateOptions{}); err != nil {
		t.Fatalf("a trusted sandbox without limits: %v", err)
	}
	if r, _, _ := tr.load("trusted"); r == nil || r.Limits != (sandbox.Limits{}) {
		t.Fatalf("trusted got limits: %+v", r)
	}
}

// TestFullDiskSessionsRecover: two sandboxes share a small state file
// system; one fills it with output. Neither command blocks on its pipe
// (the supervisor drops what the journal refuses instead of ceasing to
// read), and once space is freed the other's session journals again,
// after a line saying how much was lost; the filled sandbox runs a new
// command.
func TestFullDiskSessionsRecover(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=16m"); err != nil {
		testenv.Require(t, false, "mount tmpfs: "+err.Error())
	}
	defer syscall.Unmount(dir, syscall.MNT_DETACH)
	filler := filepath.Join(dir, "filler")
	if err := os.WriteFile(filler, make([]byte, 10<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{StateDir: dir, MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	defer destroyAll(p)
	ctx := context.Background()
	a, err := p.Create(ctx, "filla", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Create(ctx, "steady", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// B prints 4 KB for each line it reads, then acknowledges it in a
	// directory on another file system.
	ack := t.TempDir()
	cb, err := p.Spawn(ctx, b, sandbox.Cmd{Name: "sh", Args: []string{"-c", `while read x; do printf 'B %s %04000d\n' "$x" 0; touch "$ACK/$x"; done; echo B-END`}},
		sandbox.SpawnOptions{Stdin: true, Detachable: true, Env: []string{"ACK=" + ack}})
	if err != nil {
		t.Fatal(err)
	}
	say := func(lines ...string) {
		t.Helper()
		for _, l := range lines {
			if err := cb.WriteStdin(ctx, []byte(l+"\n")); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, func() bool {
			_, err := os.Stat(filepath.Join(ack, lines[len(lines)-1]))
			return err == nil
		})
	}
	say("1")
	ca, err := p.Spawn(ctx, a, sandbox.Cmd{Name: "sh", Args: []string{"-c", "head -c 30000000 /dev/zero; echo A-END"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	ca.Stop()
	ms, err := supervisor.ReadSessions(p.sandboxDir(a.Name))
	if err != nil || len(ms) != 1 || ms[0].Pid == 0 {
		t.Fatalf("A's session: %+v %v", ms, err)
	}
	// A's command writes 30 MB into a file system with 6 MB free: it ends
	// (its output read and dropped), never blocked on its pipe.
	deadline := time.Now().Add(30 * time.Second)
	for syscall.Kill(ms[0].Pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("A's command is blocked writing its output")
		}
		time.Sleep(20 * time.Millisecond) // polling the process
	}
	// A's supervisor is done with A's session (no process holds its
	// journal open), so it no longer frees space: an append that fails is
	// taken back, and that space would let B's output through.
	waitFor(t, func() bool { return !heldOpen(filepath.Join(p.sandboxDir(a.Name), "sessions", "s1", "journal")) })
	// The disk full to the last byte while B writes: B's output is lost.
	f, err := os.Create(filepath.Join(dir, "filler2"))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := f.Write(make([]byte, 4096)); err != nil {
			break
		}
	}
	f.Close()
	// B's stdout pipe, opened again (read side) through /proc, tells
	// when B's supervisor has read lines 2 to 4: it tries to journal
	// what it read at once, on the full disk.
	bs, err := supervisor.ReadSessions(p.sandboxDir(b.Name))
	if err != nil || len(bs) != 1 || bs[0].Pid == 0 {
		t.Fatalf("B's session: %+v %v", bs, err)
	}
	pipe, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/1", bs[0].Pid), os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer pipe.Close()
	say("2", "3", "4")
	waitFor(t, func() bool {
		n, err := unix.IoctlGetInt(int(pipe.Fd()), unix.TIOCINQ) // FIONREAD
		return err == nil && n == 0
	})
	time.Sleep(time.Second) // from its read to its write to the journal
	for _, n := range []string{filler, filepath.Join(dir, "filler2")} {
		if err := os.Remove(n); err != nil {
			t.Fatal(err)
		}
	}
	say("5")
	if err := cb.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	out, code := "", -1
	for ev := range cb.Events() {
		switch ev.Kind {
		case sandbox.Stdout, sandbox.Stderr:
			out += string(ev.Data)
		case sandbox.Exit:
			code = ev.Code
		case sandbox.Error:
			t.Fatalf("B's session: %v (output %q)", ev.Err, out)
		}
	}
	i := strings.Index(out, "bytes of this session's output were lost")
	if code != 0 || !strings.HasPrefix(out, "B 1 ") || i < 0 || !strings.Contains(out[i:], "\nB 5 ") || !strings.HasSuffix(out, "B-END\n") {
		t.Fatalf("B's session after the disk was freed: exit %d, output %q", code, out)
	}
	t.Logf("B: %s", strings.TrimSpace(out[strings.LastIndex(out[:i], "\n")+1:i+len("bytes of this session's output were lost")]))
	res, err := p.Exec(ctx, a, sandbox.Cmd{Name: "echo", Args: []string{"again"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "again\n" {
		t.Fatalf("A after the disk was freed: %+v %v", res, err)
	}
	log, _ := os.ReadFile(filepath.Join(p.sandboxDir(b.Name), supervisor.LogName))
	if !strings.Contains(string(log), "session output is journaled again") {
		t.Errorf("B's supervisor log does not say the output is journaled again:\n%s", log)
	}
}
