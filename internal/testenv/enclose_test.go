package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/oci"
)

func TestMain(m *testing.M) {
	Enclose()
	if dir := os.Getenv(leaverEnv); dir != "" {
		if err := leaver(dir); err != nil {
			fmt.Fprintln(os.Stderr, "leaver:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// leaverEnv, set to a directory, makes TestLeaver run: the tests below
// start this binary afresh with it, as go test would.
const leaverEnv = "TESTENV_LEAVER"

// leaver is the hostile test binary the tests below run in an enclosure
// of its own (this binary started afresh with leaverEnv, as go test would
// start it): it leaves behind a double-forked process in a session of its
// own that ignores SIGTERM and SIGHUP, and a tmpfs mount; it records its
// mount namespace and cgroups, then ends (mode "exit") or waits to be
// killed ("hang").
func leaver(dir string) error {
	sh := exec.Command("sh", "-c", `trap "" TERM HUP; setsid sh -c 'trap "" TERM HUP; sleep 600' </dev/null >/dev/null 2>&1 & sleep 600`)
	if err := sh.Start(); err != nil {
		return err
	}
	mnt := filepath.Join(os.TempDir(), "mnt") // the enclosure's directory
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		return err
	}
	ns, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	b, _ := os.ReadFile("/proc/self/cgroup")
	if err := os.WriteFile(filepath.Join(dir, "state"), []byte(ns+"\n"+mnt+"\n"+string(b)), 0o644); err != nil {
		return err
	}
	// Wait until the session's sleeper runs.
	for i := 0; i < 500 && len(sleepers()) < 2; i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if os.Getenv("TESTENV_LEAVER_RUNSC") != "" {
		// A gVisor sandbox whose processes ignore SIGTERM, one of them
		// in a session of its own.
		m, err := oci.New(oci.Config{Runtime: "runsc", StateDir: filepath.Join(os.TempDir(), "oci")})
		if err != nil {
			return err
		}
		ctx := context.Background()
		if err := m.Provision(ctx, "hostile", mechanism.Spec{}); err != nil {
			return err
		}
		if err := m.Start(ctx, "hostile"); err != nil {
			return err
		}
		c, err := m.Execute(ctx, "hostile", []string{"sh", "-c", `trap "" TERM HUP; setsid sh -c 'trap "" TERM HUP; sleep 600' </dev/null >/dev/null 2>&1 & echo started`}, mechanism.ExecOptions{})
		if err != nil || !strings.Contains(string(c.Stdout), "started") {
			return fmt.Errorf("runsc workload: %+v %v", c, err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), nil, 0o644); err != nil {
		return err
	}
	if os.Getenv("TESTENV_LEAVER_MODE") == "hang" {
		time.Sleep(time.Minute)
	}
	return nil
}

// sleepers lists the processes running "sleep 600" that are descendants of
// this process or in its cgroup: the leaver's.
func sleepers() []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && string(b) == "sleep\x00600\x00" {
			out = append(out, pid)
		}
	}
	return out
}

// runLeaver runs leaver in mode in a fresh enclosure (this binary
// started without the enclosure's environment, in a process group of its
// own) and returns the leaver's directory, its mount namespace and the
// enclosure's cgroup as seen from here, once it is ready; the process is
// returned running.
func runLeaver(t *testing.T, mode string, env ...string) (l *leaverRun, mnt, ns string, cgroup string) {
	t.Helper()
	RequireRoot(t)
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0])
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, envEnclosure) {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Env = append(append(cmd.Env, leaverEnv+"="+dir, "TESTENV_LEAVER_MODE="+mode), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	l = &leaverRun{pid: cmd.Process.Pid, exited: exited}
	t.Cleanup(func() { l.kill(); l.wait() })
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join(dir, "ready")); err == nil {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the leaver ended before it was ready: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if i > 6000 {
			t.Fatal("the leaver was not ready within 60 s")
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "state"))
	if err != nil {
		t.Fatal(err)
	}
	ns, rest, _ := strings.Cut(string(b), "\n")
	mnt, rest, _ = strings.Cut(rest, "\n")
	if !strings.Contains(rest, cgroupPrefix+strconv.Itoa(cmd.Process.Pid)+"-") {
		t.Fatalf("the leaver is not in its guard's enclosure: %s", rest)
	}
	if !strings.Contains(mnt, tempPrefix+strconv.Itoa(cmd.Process.Pid)+"-") {
		t.Fatalf("the leaver's temporary directory is not its enclosure's: %s", mnt)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); !strings.Contains(string(mi), mnt) {
		t.Fatalf("the leaver's mount %s does not show", mnt)
	}
	for _, own := range hierarchies() {
		ents, _ := os.ReadDir(own)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), cgroupPrefix+strconv.Itoa(cmd.Process.Pid)+"-") {
				cgroup = filepath.Join(own, e.Name())
			}
		}
	}
	if cgroup == "" {
		t.Fatal("no cgroup for the leaver's enclosure")
	}
	return l, mnt, ns, cgroup
}

// leaverRun is a running leaver: its guard's pid (and process group).
type leaverRun struct {
	pid    int
	exited chan error
	once   sync.Once
	err    error
}

func (l *leaverRun) kill() { _ = syscall.Kill(-l.pid, syscall.SIGKILL) }

func (l *leaverRun) wait() error {
	l.once.Do(func() { l.err = <-l.exited })
	return l.err
}

// gone checks that nothing of a leaver is left: no process in its
// cgroup, no cgroup, no mount, no temporary directory.
func gone(t *testing.T, mnt, ns, cgroup string, pids []int) {
	t.Helper()
	for _, p := range pids {
		if err := syscall.Kill(p, 0); err == nil && !zombie(p) {
			t.Errorf("process %d survives", p)
		}
	}
	if _, err := os.Stat(cgroup); err == nil {
		t.Errorf("cgroup %s is left", cgroup)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), mnt) {
		t.Errorf("the leaver's mount %s is left", mnt)
	}
	if _, err := os.Stat(filepath.Dir(mnt)); err == nil {
		t.Errorf("the leaver's temporary directory %s is left", filepath.Dir(mnt))
	}
}

func zombie(pid int) bool {
	f := stat(pid)
	return len(f) > 0 && f[0] == "Z"
}

// TestKilledGuard kills a leaver's whole process group with SIGKILL, its
// guard included, as a killed go test would be: the double-forked
// process in its own session survives that, and Sweep then ends it, its
// cgroup and its mount namespace.
func TestKilledGuard(t *testing.T) {
	l, mnt, ns, cgroup := runLeaver(t, "hang")
	pids := procsBelow(cgroup)
	if len(pids) < 3 {
		t.Fatalf("the enclosure holds %v", pids)
	}
	l.kill()
	_ = l.wait()
	// The session's sleeper is not in the process group: it survives.
	var left []int
	for i := 0; i < 100; i++ {
		left = slices.DeleteFunc(procsBelow(cgroup), zombie)
		if len(left) > 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if len(left) == 0 {
		t.Fatal("nothing survived the guard's death: the test shows nothing")
	}
	removed, err := Sweep()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(removed, cgroup) || !slices.Contains(removed, filepath.Dir(mnt)) {
		t.Errorf("Sweep removed %v, not %s and %s", removed, cgroup, filepath.Dir(mnt))
	}
	gone(t, mnt, ns, cgroup, pids)
}

// TestKilledGuardRunsc is TestKilledGuard with a gVisor sandbox among the
// leftovers, whose processes ignore SIGTERM: Sweep ends runsc's host
// processes too.
func TestKilledGuardRunsc(t *testing.T) {
	_, err := exec.LookPath("runsc")
	Require(t, err == nil, "runsc is not installed (apt-get install runsc)")
	l, mnt, ns, cgroup := runLeaver(t, "hang", "TESTENV_LEAVER_RUNSC=1")
	pids := procsBelow(cgroup)
	runsc := 0
	for _, p := range pids {
		if b, err := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline"); err == nil && strings.Contains(string(b), "runsc") {
			runsc++
		}
	}
	if runsc == 0 {
		t.Fatalf("no runsc process in the enclosure: %v", pids)
	}
	l.kill()
	_ = l.wait()
	if left := slices.DeleteFunc(procsBelow(cgroup), zombie); len(left) == 0 {
		t.Fatal("nothing survived the guard's death: the test shows nothing")
	}
	if _, err := Sweep(); err != nil {
		t.Fatal(err)
	}
	gone(t, mnt, ns, cgroup, pids)
}

// TestGuardEndsLeftovers: a leaver whose test passes and leaves its
// processes running; its guard kills them and removes its cgroup before
// it exits, and its mount namespace goes with them.
func TestGuardEndsLeftovers(t *testing.T) {
	l, mnt, ns, cgroup := runLeaver(t, "exit")
	pids := procsBelow(cgroup)
	if err := l.wait(); err != nil {
		t.Fatalf("the leaver's run: %v", err)
	}
	gone(t, mnt, ns, cgroup, pids)
}

// TestEnclosed: as root, this test binary runs in an enclosure.
func TestEnclosed(t *testing.T) {
	RequireRoot(t)
	if os.Getenv(envEnclosure) == "" {
		t.Fatal("not enclosed")
	}
	id := cgroupPrefix + strconv.Itoa(os.Getppid()) + "-"
	if !strings.HasPrefix(filepath.Base(os.TempDir()), tempPrefix+strconv.Itoa(os.Getppid())+"-") {
		t.Errorf("TMPDIR %s is not the guard's", os.TempDir())
	}
	if b, _ := os.ReadFile("/proc/self/cgroup"); hierarchiesOK() && !strings.Contains(string(b), id) {
		t.Errorf("not in the guard's cgroup: %s", b)
	}
}

// TestLiveNames: the sweep takes only the enclosures of dead guards, never
// a name it did not make.
func TestLiveNames(t *testing.T) {
	self := cgroupPrefix + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(startTime(os.Getpid()), 10)
	for name, want := range map[string]bool{
		self:                                   true,
		cgroupPrefix + "1-1":                   false, // pid 1 did not start at tick 1
		cgroupPrefix + "999999999-5":           false, // no such pid
		"managoat-test-freeze-123":             true,  // not ours
		cgroupPrefix + "freeze-123":            true,
		cgroupPrefix + "12-34-56":              true,
		tempPrefix + "999999999-5":             false,
		"mge-x":                                true,
		cgroupPrefix + "-5":                    true,
		"managoat-jail-0e2493de8f87-mt-cpu-17": true,
	} {
		if got := live(name); got != want {
			t.Errorf("live(%q) = %v, want %v", name, got, want)
		}
	}
}
