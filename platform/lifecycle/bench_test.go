package lifecycle_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/pgtest"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/postgres"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkReapPass10k is one reconciliation pass over 10,000 records,
// each a sandbox of provider/fake (listed, then looked at with Get), with
// nothing to change; cpu-ms/pass is the process's CPU time of the pass
// (target: under 1 s). sqlite is the embedded store; postgres the records
// on a throwaway PostgreSQL (the database server's own CPU not counted).
func BenchmarkReapPass10k(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) { reapPass(b, nil) })
	b.Run("postgres", func(b *testing.B) {
		srv := pgtest.Start(b)
		st, err := postgres.Open(context.Background(), srv.DSN("postgres"))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		reapPass(b, st)
	})
}

func reapPass(b *testing.B, st store.Store) {
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(b, apitest.Options{Store: st, Providers: map[string]sandbox.Provider{"fake": f},
		Env: map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"}})
	ctx := context.Background()
	a, err := pl.Store.CreateAccount(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	for i := range 10000 {
		pn := fmt.Sprintf("%s%020d", api.NamePrefix, i)
		if _, err := f.Create(ctx, pn, sandbox.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		if err := pl.Store.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: fmt.Sprintf("sb-%05d", i), Provider: "fake",
			ProviderName: pn, State: store.StateRunning, CreatedAt: now, LastActivity: now}); err != nil {
			b.Fatal(err)
		}
	}
	m := lifecycle.New(lifecycle.Config{Store: pl.Store, API: pl.API, Idle: -1})
	var cpu time.Duration
	b.ResetTimer()
	for b.Loop() {
		c0 := cpuTime()
		r := m.Pass(ctx)
		cpu += cpuTime() - c0
		if r.Gone+r.Updated+r.Orphans+r.Parked != 0 || len(r.Skipped) != 0 {
			b.Fatalf("a pass with nothing to do did %+v", r)
		}
	}
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/pass")
}
