package lifecycle_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// setupRunner is a platform whose only provider is the runner provider,
// with one runner daemon of alice's (authenticated with her API key)
// serving provider/local (trusted mechanism: no root needed) in this
// process.
func setupRunner(t *testing.T) *env {
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		names, _ := p.ListAllNames(ctx)
		for _, n := range names {
			_ = p.Destroy(ctx, sandbox.BuildHandle(local.Name, n))
		}
	})
	e := &env{t: t}
	pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "runner"},
		Configure: func(c *api.Config) { c.Now = e.now }})
	e.pl, e.key = pl, pl.Account(t, "alice")
	e.acct, _ = pl.Store.AccountByName(context.Background(), "alice")
	e.m = lifecycle.New(lifecycle.Config{Store: pl.Store, API: pl.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: e.now})

	d, err := runner.New(runner.Config{URL: pl.URL, Token: e.key, Name: "alice-box", Root: "/nowhere", Provider: p,
		Logger: slog.New(slog.DiscardHandler), BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		d.Close()
	})
	deadline := time.Now().Add(10 * time.Second)
	for len(pl.Relay.Host().Online()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the runner did not come online")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return e
}

// TestRunningRunnerSessionIsNotIdle is TestRunningSessionIsNotIdle on a
// runner sandbox: a detached `sleep` that writes nothing keeps the sandbox
// from being parked, because the daemon's list_sessions says it runs (the
// state extension; without it the session looked idle and the sandbox was
// parked after --idle); once it has ended, the sandbox is parked.
func TestRunningRunnerSessionIsNotIdle(t *testing.T) {
	e := setupRunner(t)
	ctx := context.Background()
	if code, body := e.call("POST", "/v1/sandboxes", `{"name": "quiet", "provider": "runner"}`); code != 201 {
		t.Fatalf("create: %d %s", code, body)
	}
	if rec := e.rec("quiet"); rec.Provider != "runner" {
		t.Fatalf("record %+v", rec)
	}
	c, err := client.New(client.Options{URL: e.pl.URL, APIKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := sandbox.BuildHandle(client.Name, "quiet")
	cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"3600"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil || cmd.SessionID == "" {
		t.Fatalf("spawn: %v %v", cmd, err)
	}
	_ = cmd.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for e.pl.API.Active(e.acct.ID, "quiet") {
		if time.Now().After(deadline) {
			t.Fatal("the detached spawn's stream stayed open")
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.later(20 * time.Minute)
	if r := e.m.Pass(ctx); r.Parked != 0 {
		t.Fatalf("parked a runner sandbox whose session runs: %+v", r)
	}
	if st := e.rec("quiet").State; st != store.StateRunning {
		t.Fatalf("state %s", st)
	}
	if err := c.TerminateSession(ctx, h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force}); err != nil {
		t.Fatal(err)
	}
	// The API's session list says no state: ask the runner provider, as
	// the lifecycle does.
	rp, err := e.pl.API.ProviderFor(e.acct.ID, "runner")
	if err != nil {
		t.Fatal(err)
	}
	rec := e.rec("quiet")
	rh := sandbox.BuildHandle(rec.Provider, rec.ProviderName)
	rh.InstanceID = rec.InstanceID
	deadline = time.Now().Add(10 * time.Second)
	for {
		ss, err := rp.ListSessions(ctx, rh)
		if err != nil {
			t.Fatal(err)
		}
		if len(ss) == 1 && ss[0].State == sandbox.SessionExited {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the session still runs after its termination: %+v", ss)
		}
		time.Sleep(10 * time.Millisecond)
	}
	e.later(20 * time.Minute)
	if r := e.m.Pass(ctx); r.Parked != 1 {
		t.Fatalf("an idle runner sandbox whose session ended was not parked: %+v", r)
	}
	if rec := e.rec("quiet"); rec.State != store.StateParked || rec.ParkedBy != store.ParkSuspend {
		t.Fatalf("after the pass: %+v", rec)
	}
}
