package lifecycle_test

import (
	"context"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// TestRestartLosesNothing: a platform on its SQLite file is stopped and
// started again on the same file (a restarted `managoat serve`): the
// account's key still works, every record is listed as it was (a parked
// one parked, by the same method), the uncertain intent is still open and
// is settled by the new process, and the parked sandbox wakes on its
// provider, created again with the limits it was created with.
func TestRestartLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "platform.db")
	f := &flaky{Provider: fake.New(), noSuspend: true, created: make(chan sandbox.CreateOptions, 8)}
	limits := sandbox.Limits{MemoryBytes: 1 << 30, Pids: 100, DiskBytes: 1 << 30}
	t.Cleanup(func() { _ = f.Provider.Close() })
	e := &env{t: t, f: f}
	start := func(t *testing.T) {
		st, err := sqlite.Open(context.Background(), path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		e.t = t
		e.pl = apitest.Start(t, apitest.Options{Store: st, Providers: map[string]sandbox.Provider{"fake": f},
			Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
			Configure: func(c *api.Config) { c.Now = e.now }})
		e.m = lifecycle.New(lifecycle.Config{Store: st, API: e.pl.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: e.now})
	}
	var before []store.Sandbox
	t.Run("before", func(t *testing.T) {
		start(t)
		e.key = e.pl.Account(t, "alice")
		e.acct, _ = e.pl.Store.AccountByName(context.Background(), "alice")
		if code, body := e.call("POST", "/v1/sandboxes", `{"name": "parked", "limits": {"memory_bytes": 1073741824, "pids": 100, "disk_bytes": 1073741824}}`); code != 201 {
			t.Fatalf("create: %d %s", code, body)
		}
		if o := <-f.created; o.Limits != limits {
			t.Fatalf("created with %+v, want %+v", o.Limits, limits)
		}
		e.later(16 * time.Minute)
		if r := e.m.Pass(context.Background()); r.Parked != 1 {
			t.Fatalf("%+v", r)
		}
		e.create("kept")
		<-f.created
		f.uncertain.Store(true)
		if code, body := e.call("POST", "/v1/sandboxes", `{"name": "cn", "create_new": true}`); code != 503 {
			t.Fatalf("uncertain create_new: %d %s", code, body)
		}
		f.uncertain.Store(false)
		before, _ = e.pl.Store.ListSandboxes(context.Background(), "")
	}) // the platform and its store are closed here
	t.Run("after", func(t *testing.T) {
		start(t)
		ctx := context.Background()
		after, err := e.pl.Store.ListSandboxes(ctx, "")
		if err != nil || len(after) != 3 || len(before) != 3 {
			t.Fatalf("records after the restart: %+v, %v (before: %+v)", after, err, before)
		}
		for i := range after {
			if !reflect.DeepEqual(after[i], before[i]) {
				t.Errorf("record changed by the restart:\n got %+v\nwant %+v", after[i], before[i])
			}
		}
		code, body := e.call("GET", "/v1/sandboxes", "")
		if code != 200 || !strings.Contains(body, `"state":"parked"`) || !strings.Contains(body, `"parked_by":"destroy"`) || !strings.Contains(body, `"kept"`) {
			t.Fatalf("the list after the restart: %d %s", code, body)
		}
		open, _ := e.pl.Store.OpenIntents(ctx)
		if len(open) != 1 || open[0].Op != store.OpCreateNew || open[0].State != store.IntentUncertain {
			t.Fatalf("intents after the restart: %+v", open)
		}
		if r := e.m.Pass(ctx); r.Intents != 1 {
			t.Fatalf("the new process's pass: %+v", r)
		}
		e.exec("parked", "awake")
		if o := <-f.created; o.Limits != limits {
			t.Fatalf("woken with %+v, want %+v (its limits when it was created)", o.Limits, limits)
		}
		if rec := e.rec("parked"); rec.State != store.StateRunning || rec.Provider != "fake" || rec.ProviderName != before[2].ProviderName {
			t.Fatalf("after the wake: %+v (before %+v)", rec, before[2])
		}
		if n := f.createNews.Load(); n != 1 {
			t.Fatalf("create_new sent %d times", n)
		}
	})
}
