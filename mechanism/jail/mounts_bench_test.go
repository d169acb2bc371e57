package jail_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// BenchmarkColdStartMounts: provision + start + first execute of
// /bin/true with two host mounts (one read-write, one read-only),
// against the same without mounts, interleaved; the ratio is of the
// medians. A sandbox with mounts builds its own tree rather than cloning
// the template (mounts.go): that, and the mounts, are the difference.
func BenchmarkColdStartMounts(b *testing.B) {
	j := newJail(b)
	src := b.TempDir()
	mounts := []mechanism.Mount{{Source: src, Target: "/data"}, {Source: src, Target: mechanism.Home + "/ro", ReadOnly: true}}
	n := 0
	once := func(spec mechanism.Spec) time.Duration {
		n++
		return coldStart(b, j, fmt.Sprintf("m%d", n), spec)
	}
	// Untimed: the gate's probes, and two plain starts (the template is
	// built after the second).
	for range 3 {
		once(mechanism.Spec{})
	}
	once(mechanism.Spec{Mounts: mounts})
	var with, without []time.Duration
	for b.Loop() {
		without = append(without, once(mechanism.Spec{}))
		with = append(with, once(mechanism.Spec{Mounts: mounts}))
	}
	b.ReportMetric(float64(median(with).Microseconds()), "µs/coldstart-mounts")
	b.ReportMetric(float64(median(without).Microseconds()), "µs/coldstart")
	b.ReportMetric(float64(median(with))/float64(median(without)), "x-no-mounts")
}
