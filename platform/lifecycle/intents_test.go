package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// TerminateSession terminates, then reports a transport failure while
// uncertain.
func (f *flaky) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, o sandbox.TerminateOptions) error {
	f.terms.Add(1)
	err := f.Provider.TerminateSession(ctx, h, id, o)
	if err == nil && f.uncertain.Load() {
		return sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	}
	return err
}

// TestUncertainTerminationSettles: a terminate_session whose outcome was
// uncertain is settled by listing the sessions, and never sent again.
func TestUncertainTerminationSettles(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	e.create("box")
	c, err := client.New(client.Options{URL: e.pl.URL, APIKey: e.key})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	h := sandbox.BuildHandle(client.Name, "box")
	cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:ready", "stay"}}, sandbox.SpawnOptions{Detachable: true, Stdin: true})
	if err != nil || cmd.SessionID == "" {
		t.Fatalf("spawn: %v %v", cmd, err)
	}
	_ = cmd.Stop()
	e.f.uncertain.Store(true)
	if code, body := e.call("POST", "/v1/sandboxes/box/sessions/"+cmd.SessionID+"/terminate", `{}`); code != 503 {
		t.Fatalf("uncertain terminate: %d %s", code, body)
	}
	open, _ := e.pl.Store.OpenIntents(ctx)
	if len(open) != 1 || open[0].Op != store.OpTerminateSession || open[0].Arg != cmd.SessionID || open[0].State != store.IntentUncertain {
		t.Fatalf("intents: %+v", open)
	}
	e.f.uncertain.Store(false)
	e.later(time.Minute)
	if r := e.m.Pass(ctx); r.Intents != 1 {
		t.Fatalf("%+v", r)
	}
	if open, _ := e.pl.Store.OpenIntents(ctx); len(open) != 0 {
		t.Fatalf("left open: %+v", open)
	}
	if n := e.f.terms.Load(); n != 1 {
		t.Fatalf("terminate sent %d times", n)
	}
}
