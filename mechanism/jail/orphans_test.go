package jail_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
	"github.com/managoat/managoat/mechanism/jail"
)

// TestSweepOrphans leaves on the host what sandboxes whose state is gone
// leave (cgroups, one with a process in it, and dead control sockets),
// next to what must survive: a running sandbox's cgroups and socket,
// another jail's populated cgroup, a listening socket, and files that only
// look like sockets. The sweep takes exactly the orphans, and nothing
// younger than orphanAge.
func TestSweepOrphans(t *testing.T) {
	testenv.RequireRoot(t)
	l, err := mechanism.CgroupLayout()
	testenv.Require(t, err == nil && l.Mode != cgroups.ModeNone, "no cgroup hierarchy to make cgroups in")
	parent := l.V2
	if parent == "" {
		parent = l.V1["pids"]
	}
	testenv.Require(t, parent != "", "neither a unified nor a pids hierarchy")
	runDir := t.TempDir()
	j, err := jail.New(jail.Config{StateDir: t.TempDir(), RunDir: runDir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	started(t, j, "live", mechanism.Spec{})

	// cgroup makes a cgroup under parent, with a sleeping process in it
	// when populated; the process is returned, reaped when t ends.
	cgroup := func(name string, populated bool) *exec.Cmd {
		t.Helper()
		dir := filepath.Join(parent, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for range 100 {
				if err := unix.Rmdir(dir); err == nil || errors.Is(err, unix.ENOENT) {
					return
				}
				killAll(dir)
				time.Sleep(10 * time.Millisecond)
			}
		})
		if !populated {
			return nil
		}
		c := exec.Command("sleep", "600")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(c.Process.Pid)), 0); err != nil {
			t.Fatal(err)
		}
		return c
	}
	mine := jail.CgroupName(j, "0123456789abcdef") // no such sandbox
	mineProc := cgroup(mine, true)
	foreignEmpty := "managoat-jail-00000000-gone"
	cgroup(foreignEmpty, false)
	foreignBusy := "managoat-jail-00000000-busy"
	busyProc := cgroup(foreignBusy, true)
	unrelated := "not-managoat-orphan-test"
	cgroup(unrelated, false)

	// Sockets: one nobody listens on, one listening, and look-alikes.
	dead := filepath.Join(runDir, "00000000000000aa.sock")
	bindUnix(t, dead, false)
	listening := filepath.Join(runDir, "00000000000000bb.sock")
	bindUnix(t, listening, true)
	misnamed := filepath.Join(runDir, "dead.sock")
	bindUnix(t, misnamed, false)
	regular := filepath.Join(runDir, "00000000000000cc.sock")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "target.sock")
	bindUnix(t, outside, false)
	link := filepath.Join(runDir, "00000000000000dd.sock")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}

	ours := []string{filepath.Join(parent, mine), filepath.Join(parent, foreignEmpty), dead,
		filepath.Join(parent, foreignBusy), filepath.Join(parent, unrelated), listening, misnamed, regular, link, outside}
	jail.SetOrphanScope(t, mine, foreignEmpty, foreignBusy, unrelated, jail.CgroupName(j, "live"))
	// Young: none of them goes.
	removed, err := j.SweepOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range removed {
		if slices.Contains(ours, p) || filepath.Base(p) == mine {
			t.Fatalf("a sweep of leftovers younger than a minute removed %s", p)
		}
	}
	if err := mineProc.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("a sweep of leftovers younger than a minute killed the orphan's process: %v", err)
	}

	jail.SetOrphanAge(t, 0)
	removed, err = j.SweepOrphans(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("removed %v", removed)
	gone := func(p string) bool { _, err := os.Lstat(p); return errors.Is(err, os.ErrNotExist) }
	for _, p := range []string{filepath.Join(parent, mine), filepath.Join(parent, foreignEmpty), dead} {
		if !gone(p) {
			t.Errorf("orphan %s is still there", p)
		}
	}
	for _, p := range []string{filepath.Join(parent, foreignBusy), filepath.Join(parent, unrelated), listening, misnamed, regular, link, outside} {
		if gone(p) {
			t.Errorf("%s was removed", p)
		}
	}
	if err := mineProc.Wait(); err == nil || mineProc.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the orphan cgroup's process ended with %v, want SIGKILL", err)
	}
	if err := busyProc.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("another jail's process was hurt: %v", err)
	}
	// The running sandbox kept its cgroup and its socket: it still runs
	// commands, and a Destroy still finds everything it made.
	if c := run(t, j, "live", "echo alive"); string(c.Stdout) != "alive\n" {
		t.Fatalf("the running sandbox after the sweep: %+v", c)
	}
	if slices.ContainsFunc(removed, func(p string) bool { return filepath.Base(p) == jail.CgroupName(j, "live") }) {
		t.Errorf("the running sandbox's cgroup was removed")
	}
}

// bindUnix makes a unix socket at path that listens until t ends, or is
// bound and closed (a dead socket, as an init killed without a Destroy
// leaves).
func bindUnix(t *testing.T, path string, listen bool) {
	t.Helper()
	fd := jail.BindTestSocket(t, path, listen)
	if !listen {
		unix.Close(fd)
		return
	}
	t.Cleanup(func() { unix.Close(fd) })
}

// killAll kills every process in the cgroup at dir.
func killAll(dir string) {
	b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
