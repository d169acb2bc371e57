package api_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// intentless is a store whose AddIntent fails while failing is set (a
// database that refuses the write); everything else goes through.
type intentless struct {
	store.Store
	failing atomic.Bool
}

func (s *intentless) AddIntent(ctx context.Context, in store.Intent) (int64, error) {
	if s.failing.Load() {
		return 0, errors.New("database is locked")
	}
	return s.Store.AddIntent(ctx, in)
}

// bounded is provider/fake with the bounded writes it lacks, counting
// every bounded write that reaches it.
type bounded struct {
	*fake.Provider
	createNew, destroyOnce, checkpointOnce, terminate atomic.Int32
}

func (b *bounded) Capabilities() sandbox.Capabilities {
	return b.Provider.Capabilities().With(sandbox.CapDestroyOnce, sandbox.CapCreateCheckpointOnce)
}

func (b *bounded) CreateNew(ctx context.Context, name string, o sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	b.createNew.Add(1)
	return b.Provider.CreateNew(ctx, name, o)
}

func (b *bounded) DestroyOnce(ctx context.Context, h *sandbox.Handle, _ sandbox.DestroyOnceOptions) error {
	b.destroyOnce.Add(1)
	return b.Provider.Destroy(ctx, h)
}

func (b *bounded) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, o sandbox.CheckpointOnceOptions) (string, error) {
	b.checkpointOnce.Add(1)
	if _, err := b.Provider.Get(ctx, h); err != nil {
		return "", err
	}
	return "cp-" + o.OperationID, nil
}

func (b *bounded) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, o sandbox.TerminateOptions) error {
	b.terminate.Add(1)
	return b.Provider.TerminateSession(ctx, h, id, o)
}

// TestNoIntentNoBoundedWrite (issue 18 item 7): when the store cannot
// record the intent of create_new, destroy_once, create_checkpoint_once
// or terminate_session, the API answers 503 unavailable naming the store
// and the provider is not called: a bounded write is never made without
// its intent. Once the store records again, each goes through.
func TestNoIntentNoBoundedWrite(t *testing.T) {
	ctx := context.Background()
	sq, err := sqlite.Open(ctx, t.TempDir()+"/platform.db")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sq.Close() })
	st := &intentless{Store: sq}
	f := &bounded{Provider: fake.New()}
	t.Cleanup(func() { _ = f.Provider.Close() })
	pl := apitest.Start(t, apitest.Options{Store: st, Providers: map[string]sandbox.Provider{"fake": f},
		Env: map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"}})
	key := pl.Account(t, "alice")
	acct, _ := st.AccountByName(ctx, "alice")

	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "box"}`)); a.status != 201 {
		t.Fatalf("create: %d %s", a.status, a.body)
	}
	c, err := client.New(client.Options{URL: pl.URL, APIKey: key})
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

	unavailable := func(what string, a answer) {
		t.Helper()
		if a.status != 503 || a.err == nil || a.err.Kind != "unavailable" || !strings.Contains(a.err.Message, "intent") {
			t.Fatalf("%s with no intent recorded: %d %s, want 503 unavailable naming the intent", what, a.status, a.body)
		}
	}
	st.failing.Store(true)
	unavailable("create_new", call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "cn", "create_new": true}`)))
	unavailable("destroy_once", call(t, "DELETE", pl.URL+"/v1/sandboxes/box?once=true", key, nil))
	unavailable("create_checkpoint_once", call(t, "POST", pl.URL+"/v1/sandboxes/box/checkpoints", key, strings.NewReader(`{"operation_id": "op-1"}`)))
	unavailable("terminate_session", call(t, "POST", pl.URL+"/v1/sandboxes/box/sessions/"+cmd.SessionID+"/terminate", key, strings.NewReader(`{}`)))
	if n := [4]int32{f.createNew.Load(), f.destroyOnce.Load(), f.checkpointOnce.Load(), f.terminate.Load()}; n != [4]int32{} {
		t.Fatalf("bounded writes made with no intent (create_new, destroy_once, checkpoint_once, terminate): %v", n)
	}
	if _, err := st.GetSandbox(ctx, acct.ID, "cn"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused create_new left its record: %v", err)
	}
	if names, _ := f.Provider.ListAllNames(ctx); len(names) != 1 {
		t.Fatalf("the provider holds %v, want box alone", names)
	}
	if ss, err := f.Provider.ListSessions(ctx, sandbox.BuildHandle("fake", mustRec(t, st, acct.ID, "box").ProviderName)); err != nil || len(ss) != 1 {
		t.Fatalf("the session after a refused terminate: %+v %v", ss, err)
	}
	if open, _ := sq.OpenIntents(ctx); len(open) != 0 {
		t.Fatalf("intents: %+v", open)
	}

	st.failing.Store(false)
	for _, c := range []struct {
		what, method, path, body string
		want                     int
	}{
		{"create_new", "POST", "/v1/sandboxes", `{"name": "cn", "create_new": true}`, 201},
		{"create_checkpoint_once", "POST", "/v1/sandboxes/box/checkpoints", `{"operation_id": "op-1"}`, 201},
		{"terminate_session", "POST", "/v1/sandboxes/box/sessions/" + cmd.SessionID + "/terminate", `{}`, 204},
		{"destroy_once", "DELETE", "/v1/sandboxes/box?once=true", "", 204},
	} {
		if a := call(t, c.method, pl.URL+c.path, key, strings.NewReader(c.body)); a.status != c.want {
			t.Fatalf("%s once intents are recorded: %d %s", c.what, a.status, a.body)
		}
	}
	if n := [4]int32{f.createNew.Load(), f.destroyOnce.Load(), f.checkpointOnce.Load(), f.terminate.Load()}; n != [4]int32{1, 1, 1, 1} {
		t.Fatalf("bounded writes made (create_new, destroy_once, checkpoint_once, terminate): %v, want one each", n)
	}
}

func mustRec(t *testing.T, st store.Store, account, name string) store.Sandbox {
	t.Helper()
	rec, err := st.GetSandbox(context.Background(), account, name)
	if err != nil {
		t.Fatalf("record %s: %v", name, err)
	}
	return rec
}
