package client_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// localPair is a local provider (the jail, as serve runs it) and a
// platform client over a serve of it, each with a sandbox.
func localPair(b *testing.B) (direct sandbox.Provider, hd *sandbox.Handle, viaAPI sandbox.Provider, ha *sandbox.Handle) {
	testenv.RequireRoot(b)
	p, err := local.New(local.Config{StateDir: b.TempDir(), MechanismName: "jail"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(b, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}})
	c := newClient(b, pl.URL, pl.Account(b, "bench"), "local")
	ctx := context.Background()
	hd, err = p.Create(ctx, "direct", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	ha, err = c.Create(ctx, "via-api", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return p, hd, c, ha
}

// BenchmarkExecTrue is exec of `true` through serve (HTTP, the records,
// the local provider) against the local provider called directly, in the
// same run, alternated; x-direct is the ratio (target: at most 1.3).
func BenchmarkExecTrue(b *testing.B) {
	p, hd, c, ha := localPair(b)
	ctx := context.Background()
	one := func(p sandbox.Provider, h *sandbox.Handle) time.Duration {
		start := time.Now()
		res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", res, err)
		}
		return time.Since(start)
	}
	one(p, hd)
	one(c, ha)
	// Alternated, so a load swing on a shared machine hits both alike;
	// the ratio is of the medians, which one stalled call does not move.
	direct := make([]time.Duration, 0, b.N)
	viaAPI := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct = append(direct, one(p, hd))
		viaAPI = append(viaAPI, one(c, ha))
	}
	b.StopTimer()
	md, ma := median(direct), median(viaAPI)
	b.ReportMetric(float64(ma.Nanoseconds()), "api-median-ns")
	b.ReportMetric(float64(md.Nanoseconds()), "direct-median-ns")
	b.ReportMetric(float64(ma)/float64(md), "x-direct")
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkSessionOutput streams 32 MiB of a session's stdout through
// serve (one WebSocket) and from the local provider's own spawn, in the
// same run; pct-direct is the platform's throughput as a percentage of the
// direct one (target: at least 50).
func BenchmarkSessionOutput(b *testing.B) {
	const total = 32 << 20
	p, hd, c, ha := localPair(b)
	ctx := context.Background()
	one := func(p sandbox.Provider, h *sandbox.Handle) time.Duration {
		start := time.Now()
		cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "head", Args: []string{"-c", "33554432", "/dev/zero"}}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ev := range cmd.Events() {
			switch ev.Kind {
			case sandbox.Stdout:
				n += len(ev.Data)
			case sandbox.Error:
				b.Fatal(ev.Err)
			}
		}
		if n != total {
			b.Fatalf("got %d bytes, want %d", n, total)
		}
		return time.Since(start)
	}
	one(p, hd)
	one(c, ha)
	var direct, viaAPI time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct += one(p, hd)
		viaAPI += one(c, ha)
	}
	b.StopTimer()
	b.SetBytes(total)
	b.ReportMetric(float64(total)*float64(b.N)/viaAPI.Seconds()/(1<<20), "api-MiB/s")
	b.ReportMetric(float64(total)*float64(b.N)/direct.Seconds()/(1<<20), "direct-MiB/s")
	b.ReportMetric(100*float64(direct)/float64(viaAPI), "pct-direct")
}
