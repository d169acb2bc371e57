package e2b_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkExec measures one Exec through both planes of the fake (name
// lookup, Start stream, envelopes, heartbeat) against running the same
// command directly with os/exec in the same run, and reports the ratio.
func BenchmarkExec(b *testing.B) {
	srv := e2btest.NewServer(e2btest.Options{})
	defer srv.Close()
	p, err := e2b.New(e2b.Config{APIKey: srv.APIKey(), APIURL: srv.APIURL(), SandboxURL: srv.SandboxURL()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	h, err := p.Create(ctx, "bench", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cmd := sandbox.Cmd{Name: "true"}
	const base = 20
	start := time.Now()
	for i := 0; i < base; i++ {
		if err := exec.Command(cmd.Name).Run(); err != nil {
			b.Fatal(err)
		}
	}
	direct := time.Since(start) / base
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := p.Exec(ctx, h, cmd, sandbox.ExecOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	per := b.Elapsed() / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(direct), "x_direct_exec")
}
