package jail_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// Freeze holds every process of the sandbox, a daemon in a session of its
// own included, while Status still answers at once; Thaw lets them go on;
// a frozen sandbox can still be stopped.
func TestFreezeHoldsEveryProcess(t *testing.T) {
	j := newJail(t)
	ctx := context.Background()
	home := t.TempDir()
	os.Chown(home, 1000, 1000)
	started(t, j, "fz", mechanism.Spec{HomeDir: home})
	run(t, j, "fz", `setsid sh -c 'i=0; while [ $i -lt 3000 ]; do echo x >> $HOME/tick; i=$((i+1)); sleep 0.02; done' >/dev/null 2>&1 &`)
	size := func() int64 {
		fi, err := os.Stat(filepath.Join(home, "tick"))
		if err != nil {
			return 0
		}
		return fi.Size()
	}
	waitUntil(t, func() bool { return size() > 0 })
	if err := j.Freeze(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if s, err := j.Status(sctx, "fz"); s != mechanism.StatusRunning || err != nil {
		t.Fatalf("status of a frozen sandbox = %s, %v", s, err)
	}
	before := size()
	time.Sleep(300 * time.Millisecond) // 15 ticks, were it running
	if after := size(); after != before {
		t.Fatalf("a frozen sandbox's daemon wrote: %d -> %d bytes", before, after)
	}
	if err := j.Thaw(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool { return size() > before })
	run(t, j, "fz", "true")
	if err := j.Thaw(ctx, "fz"); err != nil {
		t.Fatalf("thaw of a thawed sandbox: %v", err)
	}

	if err := j.Freeze(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	if err := j.Stop(ctx, "fz"); err != nil {
		t.Fatalf("stop of a frozen sandbox: %v", err)
	}
	if err := j.Freeze(ctx, "fz"); !errors.Is(err, mechanism.ErrNotRunning) {
		t.Fatalf("freeze of a stopped sandbox: %v", err)
	}
	if err := j.Start(ctx, "fz"); err != nil {
		t.Fatal(err)
	}
	run(t, j, "fz", "true") // not frozen by the last life's freeze
}

func waitUntil(t *testing.T, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}
