package sprites_test

import (
	"context"
	"os/exec"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkExecOverhead measures one Exec through the provider (HTTP
// upgrade, WebSocket frames, the fake's process) against running the same
// command with os/exec in the same run, and reports the ratio.
func BenchmarkExecOverhead(b *testing.B) {
	_, p := newFakeB(b)
	ctx := context.Background()
	h, err := p.Create(ctx, "bench", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	cmd := sandbox.Cmd{Name: "true"}
	base := time.Now()
	const baseN = 50
	for range baseN {
		if err := exec.Command("true").Run(); err != nil {
			b.Fatal(err)
		}
	}
	perBase := time.Since(base) / baseN
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		if res, err := p.Exec(ctx, h, cmd, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(perBase), "x-os/exec")
}

// BenchmarkStreamThroughput measures output bytes per second through a
// spawned command's event stream, against reading the same process's
// stdout directly, and reports the ratio.
func BenchmarkStreamThroughput(b *testing.B) {
	_, p := newFakeB(b)
	ctx := context.Background()
	h, err := p.Create(ctx, "bench", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	const size = 8 << 20
	script := "head -c 8388608 /dev/zero"
	direct := time.Now()
	for range 5 {
		if out, err := exec.Command("sh", "-c", script).Output(); err != nil || len(out) != size {
			b.Fatal(err)
		}
	}
	directD := time.Since(direct) / 5
	b.SetBytes(size)
	b.ResetTimer()
	start := time.Now()
	for b.Loop() {
		c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ev := range c.Events() {
			n += len(ev.Data)
			if ev.Terminal() && (ev.Kind != sandbox.Exit || ev.Code != 0) {
				b.Fatal(ev)
			}
		}
		if n != size {
			b.Fatalf("%d bytes", n)
		}
	}
	per := time.Since(start) / time.Duration(b.N)
	b.ReportMetric(float64(per)/float64(directD), "x-direct")
}

func newFakeB(b *testing.B) (*spritestest.Server, *sprites.Provider) {
	b.Helper()
	srv := spritestest.NewServer(spritestest.Options{})
	b.Cleanup(srv.Close)
	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		b.Fatal(err)
	}
	return srv, p
}
