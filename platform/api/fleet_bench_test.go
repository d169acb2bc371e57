package api_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/fake"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/runner"
)

// BenchmarkFleetPlacement places sandboxes among 10, 100 and 1,000
// simulated runners (runner daemons in this process, each serving a fake
// provider over the real wire protocol to the platform's relay, each
// reporting capacity and labels) with 100,000 sandbox records of the
// account spread over them. One placement is what a create does before
// the provider's create: the policy over the presence, the schedules and
// the per-runner usage, then the record's insert within the chosen
// runner's room (the store's count and insert under the runner's lock).
// It reports p50-ms and p99-ms of a placement, and x-mint: the p50 over
// that of Fountain's placement measured in the same run (take the
// most recently connected runner and mint a name on it: no fit, no
// count, no reservation).
//
//	go test -run '^$' -bench FleetPlacement -benchtime 2000x ./platform/api/
func BenchmarkFleetPlacement(b *testing.B) {
	for _, n := range []int{10, 100, 1000} {
		b.Run(fmt.Sprintf("runners=%d", n), func(b *testing.B) { benchFleet(b, n, 100_000) })
	}
}

func benchFleet(b *testing.B, runners, records int) {
	pl := apitest.Start(b, apitest.Options{RunnerAuth: func(a *api.RunnerAuth) { a.MaxRunners = runners + 10 }})
	key := pl.Account(b, "alice")
	acct, err := pl.Store.AccountByName(context.Background(), "alice")
	if err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	zones := []string{"eu", "us", "ap"}
	for i := range runners {
		f := fake.New()
		b.Cleanup(func() { _ = f.Close() })
		d, err := runner.New(runner.Config{URL: pl.URL, Token: key, Name: fmt.Sprintf("r%04d", i), Root: b.TempDir(), Provider: f, Logger: quiet,
			BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PingInterval: -1,
			Labels: map[string]string{"zone": zones[i%3]}, CapacityMemory: 1 << 40, CapacityCPUs: 64})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		b.Cleanup(func() { cancel(); <-done; d.Close() })
	}
	deadline := time.Now().Add(2 * time.Minute)
	var online []runnerprov.Info
	for {
		online = online[:0]
		for _, i := range pl.Relay.Host().Online() {
			if i.Capacity != nil {
				online = append(online, i)
			}
		}
		if len(online) == runners {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d runners online with capacity", len(online), runners)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ctx := context.Background()
	now := time.Now().UTC()
	for i := range records {
		pname, err := runnerprov.For(online[i%runners].ID)
		if err != nil {
			b.Fatal(err)
		}
		rec := store.Sandbox{AccountID: acct.ID, Name: fmt.Sprintf("seed-%d", i), Provider: runnerprov.Name, ProviderName: pname,
			State: store.StateRunning, CreatedAt: now, LastActivity: now}
		rec.Limits.MemoryBytes = 1 << 20
		if err := pl.Store.InsertSandbox(ctx, rec); err != nil {
			b.Fatal(err)
		}
	}
	p, err := pl.API.ProviderFor(acct.ID, runnerprov.Name)
	if err != nil {
		b.Fatal(err)
	}
	rp := p.(*runnerprov.Provider)
	sel, err := runnerprov.ParseSelector("zone in (eu,us)")
	if err != nil {
		b.Fatal(err)
	}
	acctRunners := api.AccountRunners(pl.Relay, acct.ID)
	// Fountain's placement, the baseline.
	mint := make([]time.Duration, 0, 2000)
	for range 2000 {
		t0 := time.Now()
		rs, err := acctRunners.Runners(ctx)
		if err != nil || len(rs) == 0 {
			b.Fatal(err)
		}
		if _, err := runnerprov.For(rs[0].ID); err != nil {
			b.Fatal(err)
		}
		mint = append(mint, time.Since(t0))
	}
	lat := make([]time.Duration, 0, b.N)
	ins := make([]time.Duration, 0, b.N) // the store's part: the room's check and the insert
	var inIns time.Duration
	insert := func(ctx context.Context, rec store.Sandbox, room store.Room) error {
		t0 := time.Now()
		err := pl.Store.InsertSandboxWithin(ctx, rec, room)
		inIns += time.Since(t0)
		return err
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		rec := store.Sandbox{AccountID: acct.ID, Name: fmt.Sprintf("b-%d", i), Provider: runnerprov.Name, State: store.StateCreating,
			CreatedAt: now, LastActivity: now}
		rec.Limits.MemoryBytes, rec.Limits.CPUMillis = 64<<20, 100
		inIns = 0
		t0 := time.Now()
		if _, err := api.PlaceWithForTest(ctx, pl.API, rec, rp, api.Placement{Selector: sel}, insert); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		ins = append(ins, inIns)
	}
	b.StopTimer()
	slices.Sort(lat)
	slices.Sort(ins)
	slices.Sort(mint)
	q := func(d []time.Duration, f float64) float64 {
		return float64(d[min(len(d)-1, int(f*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(lat, 0.50), "p50-ms")
	b.ReportMetric(q(lat, 0.99), "p99-ms")
	b.ReportMetric(q(ins, 0.50), "store-p50-ms")
	b.ReportMetric(q(ins, 0.99), "store-p99-ms")
	b.ReportMetric(q(lat, 0.50)/max(q(mint, 0.50), 0.001), "x-mint")
}
