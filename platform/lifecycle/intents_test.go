package lifecycle_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
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

// TestCrashedIntentsSettle: intents a crashed process left pending (its
// call made or not, no outcome written) are left alone for the grace
// period (the call may be under way), then settled by looking: the
// create_new that went through is confirmed present and its record
// running, the destroy_once that went through is confirmed absent and its
// record dropped; neither write is made again.
func TestCrashedIntentsSettle(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	now := e.now().UTC()
	// The create_new went through, then the process died.
	if err := e.pl.Store.InsertSandbox(ctx, store.Sandbox{AccountID: e.acct.ID, Name: "cn", Provider: "fake", ProviderName: "mgp-00000000000000000001",
		State: store.StateCreating, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.Provider.CreateNew(ctx, "mgp-00000000000000000001", sandbox.CreateNewOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pl.Store.AddIntent(ctx, store.Intent{AccountID: e.acct.ID, Name: "cn", Op: store.OpCreateNew, Provider: "fake", ProviderName: "mgp-00000000000000000001"}); err != nil {
		t.Fatal(err)
	}
	// The destroy_once went through, then the process died.
	gone := e.create("gone")
	if _, err := e.pl.Store.AddIntent(ctx, store.Intent{AccountID: e.acct.ID, Name: "gone", Op: store.OpDestroyOnce, Provider: "fake", ProviderName: gone.ProviderName}); err != nil {
		t.Fatal(err)
	}
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", gone.ProviderName)); err != nil {
		t.Fatal(err)
	}
	if r := e.m.Pass(ctx); r.Intents != 0 {
		t.Fatalf("pending intents settled within their grace: %+v", r)
	}
	e.later(11 * time.Minute)
	if r := e.m.Pass(ctx); r.Intents != 2 {
		t.Fatalf("%+v, want both intents settled", r)
	}
	if open, _ := e.pl.Store.OpenIntents(ctx); len(open) != 0 {
		t.Fatalf("left open: %+v", open)
	}
	if rec := e.rec("cn"); rec.State != store.StateRunning {
		t.Fatalf("the created sandbox's record: %+v", rec)
	}
	if _, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "gone"); err == nil {
		t.Fatal("the destroyed sandbox's record is still there")
	}
	if e.f.createNews.Load() != 0 || e.f.destroy.Load() != 0 {
		t.Fatalf("writes repeated: %d create_new, %d destroy_once", e.f.createNews.Load(), e.f.destroy.Load())
	}
}

// CreateCheckpointOnce stands for a provider's bounded checkpoint: it
// counts the calls, and reports a transport failure while uncertain.
func (f *flaky) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, o sandbox.CheckpointOnceOptions) (string, error) {
	f.checkpoints.Add(1)
	if _, err := f.Provider.Get(ctx, h); err != nil {
		return "", err
	}
	if f.uncertain.Load() {
		return "", sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	}
	return "cp-" + o.OperationID, nil
}

// TestUncertainCheckpointIsNotRepeated: a create_checkpoint_once whose
// outcome was uncertain cannot be looked at through the contract (no
// listing of checkpoints): it is resolved as unverifiable, and never sent
// again.
func TestUncertainCheckpointIsNotRepeated(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	e.create("box")
	e.f.uncertain.Store(true)
	if code, body := e.call("POST", "/v1/sandboxes/box/checkpoints", `{"operation_id": "op-1"}`); code != 503 {
		t.Fatalf("uncertain checkpoint: %d %s", code, body)
	}
	open, _ := e.pl.Store.OpenIntents(ctx)
	if len(open) != 1 || open[0].Op != store.OpCheckpointOnce || open[0].Arg != "op-1" || open[0].State != store.IntentUncertain {
		t.Fatalf("intents: %+v", open)
	}
	e.f.uncertain.Store(false)
	if r := e.m.Pass(ctx); r.Intents != 1 {
		t.Fatalf("%+v", r)
	}
	if open, _ := e.pl.Store.OpenIntents(ctx); len(open) != 0 {
		t.Fatalf("left open: %+v", open)
	}
	if n := e.f.checkpoints.Load(); n != 1 {
		t.Fatalf("checkpoint sent %d times", n)
	}
}

// TestSettledCreateReadsAsCreated (issue 18 items 7 and 8): a create the
// provider made but whose outcome the platform never heard (an uncertain
// create_new settled by its intent; a plain create whose process died,
// settled by reconciliation after the grace period) answers GET with the
// url and instance id a create answers with: the provider's public URL,
// and the instance id the provider gives the sandbox.
func TestSettledCreateReadsAsCreated(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	view := func(name string) api.Sandbox {
		t.Helper()
		code, body := e.call("GET", "/v1/sandboxes/"+name, "")
		var v api.Sandbox
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			t.Fatalf("GET %s: %d %s", name, code, body)
		}
		return v
	}
	// want checks a view against what the provider says of the sandbox.
	want := func(name string, createNew bool) {
		t.Helper()
		v, rec := view(name), e.rec(name)
		h := sandbox.BuildHandle("fake", rec.ProviderName)
		u, err := e.f.Provider.PublicURL(ctx, h)
		if err != nil || u == "" {
			t.Fatalf("the provider's url of %s: %q %v", name, u, err)
		}
		info, _ := e.f.Provider.Get(ctx, h)
		var raw struct{ ID string }
		_ = json.Unmarshal(info.Raw, &raw)
		if createNew && raw.ID == "" {
			t.Fatalf("the provider has no instance id for %s: %s", name, info.Raw)
		}
		if v.State != store.StateRunning || v.URL != u || v.InstanceID != raw.ID || rec.URL != u || rec.InstanceID != raw.ID {
			t.Fatalf("%s reads state %q url %q instance %q (record %q %q), want running, %q, %q", name, v.State, v.URL, v.InstanceID, rec.URL, rec.InstanceID, u, raw.ID)
		}
	}
	if code, body := e.call("POST", "/v1/sandboxes", `{"name": "made", "create_new": true}`); code != 201 {
		t.Fatalf("create_new: %d %s", code, body)
	}
	want("made", true) // the rule the settled ones must meet
	e.f.uncertain.Store(true)
	if code, body := e.call("POST", "/v1/sandboxes", `{"name": "cn", "create_new": true}`); code != 503 {
		t.Fatalf("uncertain create_new: %d %s", code, body)
	}
	e.f.uncertain.Store(false)
	// A plain create that went through, then its process died.
	now := e.now().UTC()
	if err := e.pl.Store.InsertSandbox(ctx, store.Sandbox{AccountID: e.acct.ID, Name: "crashed", Provider: "fake", ProviderName: "mgp-00000000000000000002",
		State: store.StateCreating, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.f.Provider.Create(ctx, "mgp-00000000000000000002", sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := e.m.Pass(ctx); r.Intents != 1 {
		t.Fatalf("%+v, want the uncertain create_new settled", r)
	}
	want("cn", true)
	if rec := e.rec("crashed"); rec.State != store.StateCreating {
		t.Fatalf("a create within its grace period was settled: %+v", rec)
	}
	e.later(11 * time.Minute)
	if r := e.m.Pass(ctx); r.Updated != 1 {
		t.Fatalf("%+v, want the crashed create settled", r)
	}
	want("crashed", false)
	if e.f.createNews.Load() != 2 {
		t.Fatalf("create_new sent %d times, want 2", e.f.createNews.Load())
	}
}
