package local

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// BenchmarkExecTrue: /bin/true in a running sandbox, through Spawn (the
// CLI's exec: the supervisor, its journal, the follow) and through Exec,
// against a plain fork+exec of true by this process, in turn in the same
// run (issue 32's target: ≤ 1.3× fork+exec). Medians are not kept here:
// each figure is a mean over b.N, so run it with -benchtime 50x or more.
//
//	go test -run XXX -bench ExecTrue -benchtime 50x ./provider/local/
func BenchmarkExecTrue(b *testing.B) {
	for name, p := range benchProviders(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			h, err := p.Create(ctx, "exectrue-"+name, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			defer p.Destroy(ctx, h)
			var base, spawn, ex time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if err := exec.Command("true").Run(); err != nil {
					b.Fatal(err)
				}
				base += time.Since(start)
				start = time.Now()
				c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
				if err != nil {
					b.Fatal(err)
				}
				drain(b, c)
				spawn += time.Since(start)
				start = time.Now()
				if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
				ex += time.Since(start)
			}
			ms := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(b.N) }
			b.ReportMetric(ms(base), "forkexec-ms")
			b.ReportMetric(ms(spawn), "spawn-ms")
			b.ReportMetric(ms(ex), "exec-ms")
			b.ReportMetric(float64(spawn)/float64(base), "spawn-ratio")
			b.ReportMetric(float64(ex)/float64(base), "exec-ratio")
		})
	}
}
