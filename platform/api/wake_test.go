package api_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// noSuspend is provider/fake without suspend.
type noSuspend struct{ *fake.Provider }

func (p noSuspend) Capabilities() sandbox.Capabilities {
	return p.Provider.Capabilities().Without(sandbox.CapSuspend)
}

// TestWakeGoesWhereItLives: a parked sandbox on a provider other than the
// default is woken where it lives, and the default provider is never
// asked: by Resume on its own runner where it was suspended (though a newer
// runner of the account came online since, where a new sandbox would go),
// and by a Create of its very name on its own provider where it was
// destroyed (a provider without suspend, while the default is the runner).
func TestWakeGoesWhereItLives(t *testing.T) {
	ctx := context.Background()
	exec := func(t *testing.T, pl *apitest.Platform, key, name string) store.Sandbox {
		t.Helper()
		if a := call(t, "POST", pl.URL+"/v1/sandboxes/"+name+"/exec", key, strings.NewReader(`{"cmd": "emit", "args": ["out:awake"]}`)); a.status != 200 || !strings.Contains(string(a.body), `"exit_code":0`) {
			t.Fatalf("exec in parked %s = %d %s", name, a.status, a.body)
		}
		acct, _ := pl.Store.AccountByName(ctx, "alice")
		rec, err := pl.Store.GetSandbox(ctx, acct.ID, name)
		if err != nil || rec.State != store.StateRunning {
			t.Fatalf("%s after the wake: %+v %v", name, rec, err)
		}
		return rec
	}
	park := func(t *testing.T, pl *apitest.Platform, key, name, pin, by string) {
		t.Helper()
		if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+name+`", "provider": "`+pin+`"}`)); a.status != 201 {
			t.Fatalf("create %s = %d %s", name, a.status, a.body)
		}
		acct, _ := pl.Store.AccountByName(ctx, "alice")
		rec, err := pl.Store.GetSandbox(ctx, acct.ID, name)
		if err != nil {
			t.Fatal(err)
		}
		if rec, err = pl.API.Park(ctx, rec, time.Now().Add(time.Hour)); err != nil || rec.State != store.StateParked || rec.ParkedBy != by {
			t.Fatalf("park %s: %+v %v, want parked by %s", name, rec, err, by)
		}
	}
	holds := func(t *testing.T, who string, p *fake.Provider, want ...string) {
		t.Helper()
		names, _ := p.ListAllNames(ctx)
		if strings.Join(names, ",") != strings.Join(want, ",") {
			t.Fatalf("%s holds %v, want %v", who, names, want)
		}
	}
	t.Run("SuspendedOnItsRunner", func(t *testing.T) {
		def, mine, newer := fake.New(), fake.New(), fake.New()
		for _, f := range []*fake.Provider{def, mine, newer} {
			t.Cleanup(func() { _ = f.Close() })
		}
		pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "fake"}, Providers: map[string]sandbox.Provider{"fake": def}})
		key := pl.Account(t, "alice")
		startRunner(t, pl.URL, key, "mine", mine)
		waitOnline(t, pl, 1)
		park(t, pl, key, "s", "runner", store.ParkSuspend)
		startRunner(t, pl.URL, key, "newer", newer)
		waitOnline(t, pl, 2)
		rec := exec(t, pl, key, "s")
		holds(t, "its runner", mine, rec.ProviderName)
		if info, err := mine.Get(ctx, sandbox.BuildHandle("fake", rec.ProviderName)); err != nil || info.Status != sandbox.StatusRunning {
			t.Fatalf("on its runner after the wake: %v %v", info, err)
		}
		holds(t, "the newer runner", newer)
		holds(t, "the default provider", def)
	})
	t.Run("DestroyedOnItsProvider", func(t *testing.T) {
		own, onRunner := fake.New(), fake.New()
		for _, f := range []*fake.Provider{own, onRunner} {
			t.Cleanup(func() { _ = f.Close() })
		}
		pl := apitest.Start(t, apitest.Options{Env: map[string]string{"SANDBOX_PROVIDER": "runner"}, Providers: map[string]sandbox.Provider{"fake": noSuspend{own}}})
		key := pl.Account(t, "alice")
		startRunner(t, pl.URL, key, "default", onRunner)
		waitOnline(t, pl, 1)
		park(t, pl, key, "p", "fake", store.ParkDestroy)
		holds(t, "its provider, parked by destroy", own)
		rec := exec(t, pl, key, "p")
		holds(t, "its provider", own, rec.ProviderName)
		holds(t, "the default (runner) provider", onRunner)
	})
}
