package cgroups

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// TestWarmAttachMovesNothing: WarmAttach leaves the calling thread and the
// process in the cgroups they were in (it only takes the kernel's lock),
// and a placement after it still lands and verifies.
func TestWarmAttachMovesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	l, err := Detect()
	testenv.Require(t, err == nil, fmt.Sprintf("no cgroups: %v", err))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	read := func(p string) string {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	thread, proc := read("/proc/thread-self/cgroup"), read("/proc/self/cgroup")
	l.WarmAttach()
	if got := read("/proc/thread-self/cgroup"); got != thread {
		t.Fatalf("WarmAttach moved the thread:\n%s\nwas\n%s", got, thread)
	}
	if got := read("/proc/self/cgroup"); got != proc {
		t.Fatalf("WarmAttach moved the process:\n%s\nwas\n%s", got, proc)
	}
	testenv.Require(t, len(l.V1) > 0 || l.V2 != "", "no cgroup hierarchy to place a process in")
	lim := Limits{Pids: 64}
	name := "managoat-test-warm-" + strconv.Itoa(os.Getpid())
	g, err := l.Create(name, lim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Kill(); _ = g.Remove(context.Background()) })
	if len(g.V1) == 0 {
		return // placed at clone time on v2: nothing for the warm-up to speed
	}
	sleep := exec.Command("sleep", "30")
	fd, err := g.V2FD() // on the hybrid tree, placed in v2 at clone as the jail does
	if err != nil {
		t.Fatal(err)
	}
	if fd >= 0 {
		defer syscall.Close(fd)
		sleep.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleep.Process.Kill(); _ = sleep.Wait() })
	warmed := make(chan struct{})
	go func() { defer close(warmed); l.WarmAttach() }()
	err = g.AddProc(sleep.Process.Pid)
	<-warmed
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Verify(lim, sleep.Process.Pid); err != nil {
		t.Fatal(err)
	}
}
