package local

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkColdStartDiskQuota is what the default home quota costs a
// sandbox's cold start: `managoat run -- true`'s path in the provider
// (create without a supervisor, exec true, destroy), on the jail, with the
// default home quota (a loop-mounted image on a host without project
// quotas) and without any, the two in turn in each iteration. It reports
// the medians and their ratio:
//
//	go test -run XXX -bench ColdStartDiskQuota ./provider/local/
func BenchmarkColdStartDiskQuota(b *testing.B) {
	testenv.RequireRoot(b)
	open := func(disk int64) *Provider {
		l := DefaultLimits()
		l.DiskBytes = disk
		p, err := New(Config{StateDir: b.TempDir(), LazySupervisor: true, Ephemeral: true, DefaultLimits: &l})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { destroyAll(p) })
		return p
	}
	quota, none := open(DefaultDiskBytes()), open(0)
	method, why := DiskQuotaMethod(quota.Mechanism())
	testenv.Require(b, method != "", "a home quota on this host: "+why)
	ctx := context.Background()
	once := func(p *Provider) time.Duration {
		start := time.Now()
		h, err := p.Create(ctx, "cold", sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if r, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil || r.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", r, err)
		}
		if err := p.Destroy(ctx, h); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	once(quota) // warm up: probes, templates
	once(none)
	var q, n []time.Duration
	for b.Loop() {
		q = append(q, once(quota))
		n = append(n, once(none))
	}
	median := func(d []time.Duration) time.Duration { slices.Sort(d); return d[len(d)/2] }
	mq, mn := median(q), median(n)
	b.ReportMetric(float64(mq.Microseconds())/1e3, "quota-ms")
	b.ReportMetric(float64(mn.Microseconds())/1e3, "none-ms")
	b.ReportMetric(float64(mq)/float64(mn), "ratio")
	b.Logf("method %s: median %v with the default home quota, %v without", method, mq, mn)
}
