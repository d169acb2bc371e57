package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// setupLocal is setup on provider/local (trusted mechanism: no root
// needed), whose sessions say whether they run and when they last wrote.
func setupLocal(t *testing.T) (*env, *local.Provider) {
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
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p},
		Env:       map[string]string{"SANDBOX_PROVIDER": "local", "SANDBOX_RUNNERS_ENABLED": "false"},
		Configure: func(c *api.Config) { c.Now = e.now }})
	e.pl, e.key = pl, pl.Account(t, "alice")
	e.acct, _ = pl.Store.AccountByName(context.Background(), "alice")
	e.m = lifecycle.New(lifecycle.Config{Store: pl.Store, API: pl.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: e.now})
	return e, p
}

// TestRunningSessionIsNotIdle: a detached session that runs on without a
// word (sleep) keeps its sandbox from being parked, however long since it
// last wrote; once it has ended, the sandbox is idle and parked.
func TestRunningSessionIsNotIdle(t *testing.T) {
	e, _ := setupLocal(t)
	ctx := context.Background()
	e.create("quiet")
	c, err := client.New(client.Options{URL: e.pl.URL, APIKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := sandbox.BuildHandle(client.Name, "quiet")
	cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"300"}}, sandbox.SpawnOptions{Detachable: true})
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
		t.Fatalf("parked a sandbox whose session runs: %+v", r)
	}
	if st := e.rec("quiet").State; st != store.StateRunning {
		t.Fatalf("state %s", st)
	}
	if ss, err := c.ListSessions(ctx, h); err != nil || len(ss) != 1 || ss[0].State != sandbox.SessionRunning {
		t.Fatalf("the API's sessions: %+v %v, want one running", ss, err)
	}
	if err := c.TerminateSession(ctx, h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force}); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		ss, err := c.ListSessions(ctx, h)
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
		t.Fatalf("an idle sandbox whose session ended was not parked: %+v", r)
	}
	if rec := e.rec("quiet"); rec.State != store.StateParked {
		t.Fatalf("after the pass: %+v", rec)
	}
}
