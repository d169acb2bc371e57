package supervisor

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// wakeups is the number of context switches of every thread of process
// pid: each time one of them slept and was woken, or was preempted.
func wakeups(t *testing.T, pid int) int {
	t.Helper()
	tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	if err != nil || len(tasks) == 0 {
		t.Fatalf("no threads of %d: %v", pid, err)
	}
	n := 0
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue // a thread that just ended
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 2 && strings.HasSuffix(f[0], "ctxt_switches:") {
				v, _ := strconv.Atoi(f[1])
				n += v
			}
		}
	}
	return n
}

// TestIdleSupervisorSleeps: a supervisor with nothing to do is not woken
// by a timer (it watched its directory on a 2 s poll, which with 1,000
// idle sandboxes was a quarter of a core): once quiet, none of its threads
// runs over longer than two of the old polls, nor when a sibling is
// destroyed. Removing its directory
// still ends it (TestDirRemovedSupervisorExits).
func TestIdleSupervisorSleeps(t *testing.T) {
	c := newSandbox(t)
	ctx := context.Background()
	pid, err := c.Ping(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Start-up's work (its GC, the runtime's monitor backing off) ends:
	// wait for one quiet second, ten at most.
	quiet := false
	for range 10 {
		before := wakeups(t, pid)
		time.Sleep(time.Second)
		if wakeups(t, pid) == before {
			quiet = true
			break
		}
	}
	if !quiet {
		t.Fatal("the idle supervisor never stayed asleep for a second")
	}
	before := wakeups(t, pid)
	// A sibling sandbox destroyed (its directory renamed away and
	// removed) does not wake it either: with a watch on the parent, each
	// destroy woke every supervisor.
	sibling := filepath.Join(filepath.Dir(c.Dir), "sibling")
	if err := os.Mkdir(sibling, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(sibling, sibling+".trash"); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(sibling + ".trash"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(4500 * time.Millisecond)
	if n := wakeups(t, pid) - before; n != 0 {
		t.Errorf("an idle supervisor was woken %d times in 4.5 s", n)
	}
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("the supervisor does not answer after sleeping: %v", err)
	}
}
