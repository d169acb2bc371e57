package lifecycle_test

import (
	"context"
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
	r := &replicas{env: env{t: t, f: f}}
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
