package lifecycle_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/managoat/managoat/internal/pgtest"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/postgres"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// replicas are two platforms (API servers, each with its own connection
// pool) on one PostgreSQL database and one provider, as two `managoat
// serve --db postgres://...` behind a load balancer.
type replicas struct {
	env
	a, b *apitest.Platform
	pg   *pgtest.Server
}

func startReplicas(t *testing.T) *replicas {
	srv := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE platform"); err != nil {
		t.Fatal(err)
	}
	_ = conn.Close(ctx)
	f := &flaky{Provider: fake.New()}
	t.Cleanup(func() { _ = f.Provider.Close() })
	r := &replicas{env: env{t: t, f: f}, pg: srv}
	start := func() *apitest.Platform {
		st, err := postgres.Open(ctx, srv.DSN("platform"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() }) // after the platform's own cleanup
		return apitest.Start(t, apitest.Options{Store: st, Providers: map[string]sandbox.Provider{"fake": f},
			Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
			Configure: func(c *api.Config) { c.Now = r.now }})
	}
	r.a, r.b = start(), start()
	r.pl, r.key = r.a, r.a.Account(t, "alice")
	r.acct, _ = r.a.Store.AccountByName(ctx, "alice")
	return r
}

// TestBusyOnAnotherReplicaIsNotIdle (issue 19): a stream open on replica
// b (a spawn attended for longer than the idle bound) keeps its sandbox
// from being parked by the manager of replica a, which holds the lease and
// sees only its own calls: every replica's manager marks the activity of
// the calls it serves at each tick, lease or not.
func TestBusyOnAnotherReplicaIsNotIdle(t *testing.T) {
	r := startReplicas(t)
	ctx := context.Background()
	r.create("long")
	c, err := client.New(client.Options{URL: r.b.URL, APIKey: r.key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cmd, err := c.Spawn(ctx, sandbox.BuildHandle(client.Name, "long"), sandbox.Cmd{Name: "emit", Args: []string{"out:ready", "stay"}}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.CloseStdin(ctx)
		for range cmd.Events() {
		}
	}()
	if ev := <-cmd.Events(); string(ev.Data) != "ready" {
		t.Fatalf("first event %+v", ev)
	}
	if !r.b.API.Active(r.acct.ID, "long") {
		t.Fatal("the attended spawn does not show as active on b")
	}
	r.later(20 * time.Minute)
	// b's manager does not hold the lease: it only ticks.
	mb := lifecycle.New(lifecycle.Config{Store: r.b.Store, API: r.b.API, Idle: 15 * time.Minute, Interval: 20 * time.Millisecond, Now: r.now,
		Lease: func(context.Context) bool { return false }})
	mctx, cancel := context.WithCancel(ctx)
	stopped := make(chan struct{})
	go func() { _ = mb.Run(mctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	deadline := time.Now().Add(10 * time.Second)
	for r.rec("long").LastActivity.Before(r.now().Add(-time.Minute)) {
		if time.Now().After(deadline) {
			t.Fatal("replica b never marked the activity of the stream it serves")
		}
		time.Sleep(10 * time.Millisecond)
	}
	ma := lifecycle.New(lifecycle.Config{Store: r.a.Store, API: r.a.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: r.now})
	if rep := ma.Pass(ctx); rep.Parked != 0 {
		t.Fatalf("replica a parked a sandbox with a stream open on b: %+v", rep)
	}
	if st := r.rec("long").State; st != store.StateRunning {
		t.Fatalf("state %s", st)
	}
}

// TestLeaseTakeover (issue 19): two replicas' managers, each with its
// store's lease holder, run side by side: one holds the lease and parks;
// when it dies (its work stops, its database connection ends), the other
// takes the lease at its next retry and passes at once, though its
// Interval is an hour.
func TestLeaseTakeover(t *testing.T) {
	r := startReplicas(t)
	ctx := context.Background()
	r.create("one")
	r.later(20 * time.Minute)
	type replica struct {
		name   string
		h      *postgres.Holder
		held   atomic.Bool
		cancel context.CancelFunc
		done   chan struct{}
	}
	var both atomic.Bool
	var reps [2]*replica
	for i, pl := range []*apitest.Platform{r.a, r.b} {
		rep := &replica{name: string(rune('a' + i)), h: pl.Store.(*postgres.Store).Holder("lifecycle"), done: make(chan struct{})}
		reps[i] = rep
		t.Cleanup(rep.h.Close)
	}
	for i, pl := range []*apitest.Platform{r.a, r.b} {
		rep, other := reps[i], reps[1-i]
		m := lifecycle.New(lifecycle.Config{Store: pl.Store, API: pl.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: r.now,
			Interval: time.Hour, LeaseRetry: 20 * time.Millisecond,
			Lease: func(ctx context.Context) bool {
				held := rep.h.Held(ctx)
				rep.held.Store(held)
				if held && other.held.Load() {
					both.Store(true)
				}
				return held
			}})
		var mctx context.Context
		mctx, rep.cancel = context.WithCancel(ctx)
		go func() { _ = m.Run(mctx); close(rep.done) }()
		t.Cleanup(func() { rep.cancel(); <-rep.done })
	}
	deadline := time.Now().Add(20 * time.Second)
	for r.rec("one").State != store.StateParked {
		if time.Now().After(deadline) {
			t.Fatal("no replica parked the idle sandbox")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // ten retries of the other replica
	if both.Load() {
		t.Fatal("both replicas held the lease at once")
	}
	var dead, live *replica
	switch {
	case reps[0].held.Load() && !reps[1].held.Load():
		dead, live = reps[0], reps[1]
	case reps[1].held.Load() && !reps[0].held.Load():
		dead, live = reps[1], reps[0]
	default:
		t.Fatalf("holders: a %v, b %v; want exactly one", reps[0].held.Load(), reps[1].held.Load())
	}
	// The holder dies: its work stops and the database sees its
	// connections end, as a killed process's would.
	dead.cancel()
	<-dead.done
	r.create("two")
	r.later(20 * time.Minute)
	if live.held.Load() || r.rec("two").State == store.StateParked {
		t.Fatal("the lease moved before its holder's connection ended")
	}
	terminateLeaseHolders(t, r)
	start := time.Now()
	deadline = start.Add(20 * time.Second)
	for r.rec("two").State != store.StateParked {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s never took over from dead replica %s (live held %v; two: %+v)", live.name, dead.name, live.held.Load(), r.rec("two"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !live.held.Load() {
		t.Fatal("the sandbox was parked by a replica without the lease")
	}
	t.Logf("replica %s took over from %s and parked in %v", live.name, dead.name, time.Since(start).Round(time.Millisecond))
}

// terminateLeaseHolders ends the backends holding advisory locks on the
// replicas' database.
func terminateLeaseHolders(t *testing.T, r *replicas) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, r.pg.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted`); err != nil {
		t.Fatal(err)
	}
}

// TestDatabaseOutage (issue 19, bad input): while the database is down a
// replica answers 503 (kind unavailable), a pass changes nothing and
// returns, and the lease is not held; when the database is back, the same
// replica answers again, takes the lease and parks what is idle, nothing
// lost.
func TestDatabaseOutage(t *testing.T) {
	r := startReplicas(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.create("box")
	r.later(20 * time.Minute)
	h := r.a.Store.(*postgres.Store).Holder("lifecycle")
	defer h.Close()
	m := lifecycle.New(lifecycle.Config{Store: r.a.Store, API: r.a.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: r.now})
	r.pg.Stop()
	if h.Held(ctx) {
		t.Fatal("the lease is held with the database down")
	}
	if rep := m.Pass(ctx); rep.Parked+rep.Gone+rep.Updated+rep.Orphans+rep.Intents != 0 {
		t.Fatalf("a pass with the database down did %+v", rep)
	}
	for _, path := range []string{"/v1/sandboxes", "/v1/sandboxes/box"} {
		if code, body := r.call("GET", path, ""); code != 503 || !strings.Contains(body, `"unavailable"`) {
			t.Fatalf("GET %s with the database down: %d %s, want 503 unavailable", path, code, body)
		}
	}
	r.pg.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body := r.call("GET", "/v1/sandboxes", "")
		if code == 200 && strings.Contains(body, `"box"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the database came back: %d %s", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !h.Held(ctx) {
		t.Fatal("the lease was not taken once the database was back")
	}
	if rep := m.Pass(ctx); rep.Parked != 1 {
		t.Fatalf("the first pass after the outage: %+v, want the idle sandbox parked", rep)
	}
}

// TestReplicasCreateOneNameOnPostgres (issue 19 item 1): creates of one
// name sent at once to two replicas on one PostgreSQL database (each its
// own pool) make one record and one sandbox: the winner answers 201, the
// others adopt it (200); create_new instead refuses the losers with 409
// already_exists and is sent to the provider once.
func TestReplicasCreateOneNameOnPostgres(t *testing.T) {
	r := startReplicas(t)
	r.f.createDelay.Store(int64(200 * time.Millisecond)) // the creates overlap
	for _, c := range []struct {
		name, body string
		loser      int
	}{
		{"shared", `{"name": "shared"}`, 200},
		{"uniq", `{"name": "uniq", "create_new": true}`, 409},
	} {
		codes := make([]int, 8)
		var wg sync.WaitGroup
		for i := range codes {
			pl := r.a
			if i%2 == 1 {
				pl = r.b
			}
			wg.Go(func() {
				req, _ := http.NewRequest("POST", pl.URL+"/v1/sandboxes", strings.NewReader(c.body))
				req.Header.Set("Authorization", "Bearer "+r.key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				codes[i] = resp.StatusCode
				if resp.StatusCode == 409 && !strings.Contains(string(b), "already_exists") {
					t.Errorf("a losing create_new: %s", b)
				}
			})
		}
		wg.Wait()
		won := 0
		for _, code := range codes {
			switch code {
			case 201:
				won++
			case c.loser:
			default:
				t.Errorf("%s: a create answered %d (all: %v)", c.name, code, codes)
			}
		}
		if won != 1 {
			t.Fatalf("%s: %d creates won (%v), want 1", c.name, won, codes)
		}
		if rec := r.rec(c.name); rec.State != store.StateRunning {
			t.Fatalf("%s: record %+v", c.name, rec)
		}
	}
	names, _ := r.f.Provider.ListAllNames(context.Background())
	if len(names) != 2 {
		t.Fatalf("the provider holds %v, want two sandboxes", names)
	}
	if n := r.f.createNews.Load(); n != 1 {
		t.Fatalf("create_new sent to the provider %d times, want 1", n)
	}
}
