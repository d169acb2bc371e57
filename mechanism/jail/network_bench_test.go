package jail_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// BenchmarkColdStartEgress: provision + start + first execute of
// /bin/true with egress on (the default) against the same with network
// none, interleaved; the metric is the ratio of the medians (the issue
// asks at most 1.5).
func BenchmarkColdStartEgress(b *testing.B) {
	j := newJail(b)
	ctx := context.Background()
	start := func(id string, spec mechanism.Spec) time.Duration {
		began := time.Now()
		if err := j.Provision(ctx, id, spec); err != nil {
			b.Fatal(err)
		}
		if err := j.Start(ctx, id); err != nil {
			b.Fatal(err)
		}
		if c, err := j.Execute(ctx, id, []string{"/bin/true"}, mechanism.ExecOptions{}); err != nil || c.ExitStatus != 0 {
			b.Fatalf("true: %+v %v", c, err)
		}
		d := time.Since(began)
		if err := j.Destroy(ctx, id); err != nil {
			b.Fatal(err)
		}
		return d
	}
	start("warm-e", mechanism.Spec{Network: mechanism.NetworkEgress})
	start("warm-n", mechanism.Spec{Network: mechanism.NetworkNone})
	var on, off []time.Duration
	b.ResetTimer()
	for i := range b.N {
		on = append(on, start(fmt.Sprintf("e%d", i), mechanism.Spec{Network: mechanism.NetworkEgress}))
		off = append(off, start(fmt.Sprintf("n%d", i), mechanism.Spec{Network: mechanism.NetworkNone}))
	}
	b.ReportMetric(float64(median(on))/float64(median(off)), "egress/none-start")
	b.ReportMetric(float64(median(on).Microseconds()), "egress-start-µs")
	b.ReportMetric(float64(median(off).Microseconds()), "none-start-µs")
}
