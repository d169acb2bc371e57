package mechanism_test

import (
	"context"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// TestCPURate: the rate is the CPU time taken over the window per second
// of wall clock, in millicores; a counter that cannot be read is no rate;
// a cancelled ctx cuts the window short.
func TestCPURate(t *testing.T) {
	start := time.Now()
	// Two cores busy: the counter advances twice as fast as the clock.
	twoCores := func() (time.Duration, bool) { return 2 * time.Since(start), true }
	rate, total, err := mechanism.CPURate(context.Background(), twoCores)
	if err != nil || rate < 1900 || rate > 2100 || total < 2*mechanism.UsageWindow {
		t.Fatalf("CPURate of two busy cores = %d millicores (total %v), %v; want about 2000", rate, total, err)
	}
	if rate, _, err := mechanism.CPURate(context.Background(), func() (time.Duration, bool) { return time.Second, true }); rate != 0 || err != nil {
		t.Fatalf("CPURate of an idle counter = %d, %v", rate, err)
	}
	if rate, total, err := mechanism.CPURate(context.Background(), func() (time.Duration, bool) { return 0, false }); rate != 0 || total != 0 || err != nil {
		t.Fatalf("CPURate of an unreadable counter = %d %v %v", rate, total, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	t0 := time.Now()
	_, _, _ = mechanism.CPURate(ctx, twoCores)
	if d := time.Since(t0); d >= mechanism.UsageWindow {
		t.Fatalf("a cancelled ctx waited the window out: %v", d)
	}
}
