package client_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// BenchmarkStream500 streams N bytes (500 MiB unless
// MANAGOAT_BENCH_STREAM_BYTES) of a session's stdout, read as fast as
// the reader can, through serve (the API's WebSocket and the Go client)
// and from the local provider's own spawn on the jail (the baseline, what
// `managoat exec` reads), alternated in each iteration; pct-local is the
// platform's throughput as a percentage of the local one (issue 31's
// target: at least 85).
func BenchmarkStream500(b *testing.B) {
	n := int64(500 << 20)
	if s := os.Getenv("MANAGOAT_BENCH_STREAM_BYTES"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			b.Fatalf("MANAGOAT_BENCH_STREAM_BYTES=%q", s)
		}
		n = v
	}
	p, hd, c, ha := localPair(b)
	ctx := context.Background()
	one := func(p sandbox.Provider, h *sandbox.Handle) time.Duration {
		start := time.Now()
		cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "head", Args: []string{"-c", strconv.FormatInt(n, 10), "/dev/zero"}}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		var got int64
		for ev := range cmd.Events() {
			switch ev.Kind {
			case sandbox.Stdout:
				got += int64(len(ev.Data))
			case sandbox.Error:
				b.Fatal(ev.Err)
			}
		}
		if got != n {
			b.Fatalf("got %d bytes, want %d", got, n)
		}
		return time.Since(start)
	}
	one(p, hd)
	one(c, ha)
	var local, viaAPI time.Duration
	b.ResetTimer()
	for b.Loop() {
		local += one(p, hd)
		viaAPI += one(c, ha)
	}
	b.StopTimer()
	mibs := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mibs(viaAPI), "MiB/s-api")
	b.ReportMetric(mibs(local), "MiB/s-local")
	b.ReportMetric(100*float64(local)/float64(viaAPI), "pct-local")
}
