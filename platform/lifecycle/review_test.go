package lifecycle_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// hookStore is a store with a one-shot hook run before a DeleteSandbox
// or a DeleteSandboxIf (the instant after any check a caller made).
type hookStore struct {
	store.Store
	mu       sync.Mutex
	onDelete func()
}

func (s *hookStore) hook() {
	s.mu.Lock()
	fn := s.onDelete
	s.onDelete = nil
	s.mu.Unlock()
	if fn != nil {
		fn()
	}
}

func (s *hookStore) DeleteSandbox(ctx context.Context, accountID, name string) error {
	s.hook()
	return s.Store.DeleteSandbox(ctx, accountID, name)
}

func (s *hookStore) DeleteSandboxIf(ctx context.Context, rec store.Sandbox) error {
	s.hook()
	return s.Store.DeleteSandboxIf(ctx, rec)
}

// replicaB starts a second API server on e's store (another replica, as
// TestParkRaceSQLite does), over st when set.
func (e *env) replicaB(st store.Store) *apitest.Platform {
	if st == nil {
		st = e.pl.Store
	}
	return apitest.Start(e.t, apitest.Options{Store: st, Providers: map[string]sandbox.Provider{"fake": e.f},
		Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
		Configure: func(c *api.Config) { c.Now = e.now }})
}

// callOn sends a request to the platform pl and sends its answer.
func (e *env) callOn(pl *apitest.Platform, method, path, body string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(method, pl.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			ch <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		ch <- fmt.Sprint(resp.StatusCode, " ", string(b))
	}()
	return ch
}

// setGetHook sets f's one-shot hook run after the answer of a Get of
// the sandbox of provider name pname.
func (f *flaky) setGetHook(pname string, fn func()) {
	f.hookMu.Lock()
	defer f.hookMu.Unlock()
	f.onGetOf, f.onGet = pname, fn
}

// Destroy runs afterDestroy, when set, once after the provider's destroy.
func (f *flaky) Destroy(ctx context.Context, h *sandbox.Handle) error {
	err := f.Provider.Destroy(ctx, h)
	f.takeHook(&f.afterDestroy)
	return err
}

// onProvider reports whether the fake provider holds the sandbox of
// provider name pname.
func (e *env) onProvider(pname string) bool {
	_, err := e.f.Provider.Get(context.Background(), sandbox.BuildHandle("fake", pname))
	return err == nil
}

// TestGetDuringASlowCreateKeepsTheRecord: a GET of a sandbox whose create
// is still under way on its provider (more than 10 s: a hosted provider's
// create can take that) keeps the record. The provider says not found
// until its create lands; GET took that for a sandbox gone and deleted
// the record under the create, whose answer was then an error while the
// sandbox it made lived on the provider with no record.
func TestGetDuringASlowCreateKeepsTheRecord(t *testing.T) {
	e := setup(t, false)
	g := newGate(t)
	e.f.setHook(&e.f.onCreate, g.wait)
	created := e.callOn(e.pl, "POST", "/v1/sandboxes", `{"name": "slow"}`)
	await(t, g.in, "the create never reached its provider")
	e.later(11 * time.Second)
	code, body := e.call("GET", "/v1/sandboxes/slow", "")
	if code != 200 || !strings.Contains(body, `"state":"creating"`) {
		t.Errorf("GET during the create: %d %s; want 200, state creating", code, body)
	}
	g.open()
	if got := await(t, created, "the create never answered"); !strings.HasPrefix(got, "201 ") {
		t.Fatalf("the create: %s", got)
	}
	rec := e.rec("slow")
	if rec.State != store.StateRunning || !e.onProvider(rec.ProviderName) {
		t.Fatalf("after the create: record %+v, on the provider %v", rec, e.onProvider(rec.ProviderName))
	}
}

// TestWakeRaceAcrossReplicas: two replicas waking one parked sandbox at
// once both resume it (harmless), and the one whose record write comes
// second finds the other's: its call goes on, on the sandbox awake. It
// was answered 502 (the store's conflict) though the sandbox was running.
func TestWakeRaceAcrossReplicas(t *testing.T) {
	e := setup(t, false)
	b := e.replicaB(nil)
	e.create("box")
	e.later(20 * time.Minute)
	if _, err := e.pl.API.Park(context.Background(), e.rec("box"), e.now().Add(-15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	g := newGate(t)
	e.f.setHook(&e.f.onResume, g.wait)
	res := e.execOn(b, "box")
	await(t, g.in, "b's wake never resumed")
	e.exec("box", "on-a") // a wakes it meanwhile
	g.open()
	if got := await(t, res, "the exec on b never answered"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the exec on b, whose wake a overtook: %s", got)
	}
	if rec := e.rec("box"); rec.State != store.StateRunning {
		t.Fatalf("record %+v", rec)
	}
}

// TestDestroyDuringAWake: a sandbox parked by destroy, destroyed by its
// user while a wake (a call on another replica) creates it again, is not
// left running on its provider with no record (a runner's sandbox is never
// reaped as an orphan): whichever comes first, the sandbox ends destroyed.
func TestDestroyDuringAWake(t *testing.T) {
	// The destroy lands while the wake's create is under way.
	e := setup(t, true) // no suspend: parks destroy
	hs := &hookStore{Store: e.pl.Store}
	b := e.replicaB(hs)
	e.create("during")
	e.create("before")
	e.later(20 * time.Minute)
	for _, n := range []string{"during", "before"} {
		if _, err := e.pl.API.Park(context.Background(), e.rec(n), e.now().Add(-15*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	pname := e.rec("during").ProviderName
	g := newGate(t)
	e.f.setHook(&e.f.onCreate, g.wait)
	res := e.execOn(e.pl, "during")
	await(t, g.in, "a's wake never created")
	if got := await(t, e.callOn(b, "DELETE", "/v1/sandboxes/during", ""), "the destroy never answered"); !strings.HasPrefix(got, "204") {
		t.Fatalf("the destroy on b: %s", got)
	}
	g.open()
	if got := await(t, res, "the exec never answered"); !strings.HasPrefix(got, "404 ") {
		t.Errorf("the exec on a sandbox destroyed under its wake: %s", got)
	}
	if e.onProvider(pname) {
		t.Error("a wake's sandbox, destroyed by its user meanwhile, lives on on the provider with no record")
	}

	// The wake ends between the destroy's read of the record (parked by
	// destroy) and its delete.
	pname = e.rec("before").ProviderName
	woke := make(chan string, 1)
	hs.mu.Lock()
	hs.onDelete = func() { woke <- <-e.execOn(e.pl, "before") }
	hs.mu.Unlock()
	if got := await(t, e.callOn(b, "DELETE", "/v1/sandboxes/before", ""), "the destroy never answered"); !strings.HasPrefix(got, "204") {
		t.Fatalf("the destroy on b: %s", got)
	}
	if got := await(t, woke, "the wake never answered"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the exec that woke it: %s", got)
	}
	if _, err := e.pl.Store.GetSandbox(context.Background(), e.acct.ID, "before"); err == nil {
		t.Fatal("the record outlived its destroy")
	}
	if e.onProvider(pname) {
		t.Error("a sandbox woken as its destroy read the record lives on on the provider with no record")
	}
}

// TestDestroyDuringACreate: a sandbox destroyed by its user while its
// create is under way on the provider is not left there with no record
// once the create lands: the create, finding its record gone, destroys
// what it made and answers not_found. It lived on (a runner's for good:
// runner names are never reaped as orphans).
func TestDestroyDuringACreate(t *testing.T) {
	e := setup(t, false)
	g := newGate(t)
	e.f.setHook(&e.f.onCreate, g.wait)
	created := e.callOn(e.pl, "POST", "/v1/sandboxes", `{"name": "brief"}`)
	await(t, g.in, "the create never reached its provider")
	pname := e.rec("brief").ProviderName
	if code, body := e.call("DELETE", "/v1/sandboxes/brief", ""); code != 204 {
		t.Fatalf("the destroy during the create: %d %s", code, body)
	}
	g.open()
	if got := await(t, created, "the create never answered"); !strings.HasPrefix(got, "404 ") {
		t.Errorf("the create whose sandbox was destroyed under it: %s; want 404", got)
	}
	if e.onProvider(pname) {
		t.Error("the sandbox of a create destroyed under it lives on on the provider with no record")
	}
	if _, err := e.pl.Store.GetSandbox(context.Background(), e.acct.ID, "brief"); err == nil {
		t.Error("a record came back")
	}
}

// TestReapMeetsANewIncarnation: a pass that finds a sandbox gone from its
// provider, while its user destroys it and creates the name again (a new
// sandbox, a new record at the same Version), neither deletes nor
// rewrites the new record. The record's Version starts again at 1 with
// each insert, so the pass's check (same Version) took the new record for
// the one it read and deleted it, leaving the new sandbox running with no
// record (an orphan, destroyed after the grace period).
func TestReapMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	for _, n := range []string{"gone", "moved"} {
		e.create(n)
		e.exec(n, "x") // a second version, as the new one will have
	}
	// gone: its sandbox vanished from the provider; the pass asks Get.
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", e.rec("gone").ProviderName)); err != nil {
		t.Fatal(err)
	}
	e.f.setGetHook(e.rec("gone").ProviderName, func() {
		if code, body := e.call("DELETE", "/v1/sandboxes/gone", ""); code != 204 {
			t.Errorf("destroy: %d %s", code, body)
		}
		e.create("gone")
	})
	old := e.rec("gone").ProviderName
	e.m.Pass(ctx)
	rec, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "gone")
	if err != nil || rec.ProviderName == old || !e.onProvider(rec.ProviderName) {
		t.Fatalf("the new sandbox's record after the pass: %+v, %v (old provider name %s)", rec, err, old)
	}

	// moved: suspended on its provider behind the platform's back; the
	// pass would record that state over whatever record it finds.
	if err := e.f.Provider.Suspend(ctx, sandbox.BuildHandle("fake", e.rec("moved").ProviderName)); err != nil {
		t.Fatal(err)
	}
	e.f.setGetHook(e.rec("moved").ProviderName, func() {
		if code, body := e.call("DELETE", "/v1/sandboxes/moved", ""); code != 204 {
			t.Errorf("destroy: %d %s", code, body)
		}
		e.create("moved")
	})
	old = e.rec("moved").ProviderName
	e.m.Pass(ctx)
	rec = e.rec("moved")
	if rec.ProviderName == old || rec.State != store.StateRunning || !e.onProvider(rec.ProviderName) {
		t.Fatalf("the new sandbox's record after the pass: %+v (old provider name %s)", rec, old)
	}
}

// TestCreateIntentLeavesAParkedRecord: a create_new's intent still open
// when its sandbox has since been created, recorded and parked by destroy
// (its outcome never recorded: a store error leaves it pending; an idle
// bound shorter than the grace parks first) is settled as absent without
// dropping the parked record: the sandbox is absent from its provider on
// purpose. The record was deleted, and the sandbox with it.
func TestCreateIntentLeavesAParkedRecord(t *testing.T) {
	e := setup(t, true) // no suspend: parks destroy
	ctx := context.Background()
	rec := e.create("kept")
	if _, err := e.pl.Store.AddIntent(ctx, store.Intent{AccountID: e.acct.ID, Name: "kept", Op: store.OpCreateNew,
		Provider: "fake", ProviderName: rec.ProviderName}); err != nil {
		t.Fatal(err)
	}
	e.later(20 * time.Minute)
	if r := e.m.Pass(ctx); r.Parked != 1 || r.Intents != 1 {
		t.Fatalf("%+v, want the idle sandbox parked and the intent, past its grace, settled", r)
	}
	ins, err := e.pl.Store.OpenIntents(ctx)
	if err != nil || len(ins) != 0 {
		t.Fatalf("open intents after the pass: %v, %v", ins, err)
	}
	got, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "kept")
	if err != nil || got.State != store.StateParked {
		t.Fatalf("the parked record after its create's intent was settled: %+v, %v", got, err)
	}
	e.exec("kept", "woken")
}

// TestGetMeetsANewIncarnation: a GET that finds its sandbox gone from the
// provider drops that record only, not the record of a sandbox its user
// made again under the name since the GET read it.
func TestGetMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	old := e.create("again").ProviderName
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", old)); err != nil {
		t.Fatal(err)
	}
	e.f.setGetHook(old, func() {
		if code, body := e.call("DELETE", "/v1/sandboxes/again", ""); code != 204 {
			t.Errorf("destroy: %d %s", code, body)
		}
		e.create("again")
	})
	if code, body := e.call("GET", "/v1/sandboxes/again", ""); code != 404 {
		t.Fatalf("GET of the gone sandbox: %d %s", code, body)
	}
	rec, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "again")
	if err != nil || rec.ProviderName == old || !e.onProvider(rec.ProviderName) {
		t.Fatalf("the new sandbox's record after the GET: %+v, %v", rec, err)
	}
}

// TestParkWithAnUncertainSuspend: a park whose suspend the provider made
// but whose answer timed out (a pause of a large sandbox can outlast the
// park's bound) looks before it withdraws its claim: the sandbox is
// suspended, so the record is parked and the next call wakes it. The
// claim was withdrawn: the record said running on a suspended sandbox,
// and calls went to it as it was (or, once a pass saw it, it read as
// suspended by its user, which no call wakes).
func TestParkWithAnUncertainSuspend(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	e.create("paused")
	e.create("refused")
	e.later(20 * time.Minute)
	e.f.uncertain.Store(true)
	rec, err := e.pl.API.Park(ctx, e.rec("paused"), e.now().Add(-15*time.Minute))
	e.f.uncertain.Store(false)
	if err != nil || rec.State != store.StateParked || e.rec("paused").State != store.StateParked || e.rec("paused").ParkedBy != store.ParkSuspend {
		t.Fatalf("a park whose suspend was made but timed out: %+v, %v; record %+v; want parked by suspend", rec, err, e.rec("paused"))
	}
	e.exec("paused", "woken")
	if e.f.resumes.Load() != 1 || e.f.execOnParked.Load() != 0 {
		t.Fatalf("%d resumes, %d execs on a suspended sandbox; want 1 (the exec woke it), 0", e.f.resumes.Load(), e.f.execOnParked.Load())
	}

	// A suspend that timed out before it reached the sandbox (still
	// running) is withdrawn at once: the record is running again.
	e.f.suspendLost.Store(true)
	_, err = e.pl.API.Park(ctx, e.rec("refused"), e.now().Add(-15*time.Minute))
	e.f.suspendLost.Store(false)
	if rec := e.rec("refused"); err == nil || rec.State != store.StateRunning || rec.ParkedBy != "" {
		t.Fatalf("a park whose suspend timed out unmade: %v; record %+v; want an error, running", err, rec)
	}
	e.exec("refused", "fine")
}

// TestSettledIntentsArePruned: every bounded write adds an intent, so a
// client sending terminations of sessions that do not exist grew the
// intents table for as long as the platform ran. A pass removes the
// settled ones older than IntentRetention (24 h), at most once an hour,
// and never an open one.
func TestSettledIntentsArePruned(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	e.create("box")
	for range 3 {
		if code, body := e.call("POST", "/v1/sandboxes/box/sessions/nosuch/terminate", `{}`); code != 204 && code != 404 {
			t.Fatalf("terminate: %d %s", code, body)
		}
	}
	// An intent that stays open (its provider is no longer enabled: it
	// cannot be settled) is kept however old.
	if _, err := e.pl.Store.AddIntent(ctx, store.Intent{AccountID: e.acct.ID, Name: "old", Op: store.OpCreateNew,
		Provider: "retired", ProviderName: "mgp-old", State: store.IntentUncertain}); err != nil {
		t.Fatal(err)
	}
	if r := e.m.Pass(ctx); r.Pruned != 0 {
		t.Fatalf("%+v: pruned intents younger than the retention", r)
	}
	e.later(25 * time.Hour)
	if r := e.m.Pass(ctx); r.Pruned != 3 {
		t.Fatalf("%+v, want the 3 settled terminations pruned", r)
	}
	if open, err := e.pl.Store.OpenIntents(ctx); err != nil || len(open) != 1 || open[0].Provider != "retired" {
		t.Fatalf("open intents after the prune: %+v, %v; want the open one kept", open, err)
	}
	if code, body := e.call("POST", "/v1/sandboxes/box/sessions/nosuch/terminate", `{}`); code != 204 && code != 404 {
		t.Fatalf("terminate: %d %s", code, body)
	}
	if r := e.m.Pass(ctx); r.Pruned != 0 {
		t.Fatalf("%+v: a prune within the hour of the last", r)
	}
	e.later(time.Hour) // the test's clock is a day ahead of the store's: the new one counts as old
	if r := e.m.Pass(ctx); r.Pruned != 1 {
		t.Fatalf("%+v: want the next hour's prune", r)
	}
}

// TestSuspendMeetsANewIncarnation: a suspend by its user whose record
// changed while the provider suspended the sandbox (its user destroyed it
// and made the name again) does not write "suspended" over the record of
// the new sandbox, which runs (it read suspended until a pass saw it
// running).
func TestSuspendMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	old := e.create("twice").ProviderName
	e.f.setHook(&e.f.afterSuspend, func() {
		if code, body := e.call("DELETE", "/v1/sandboxes/twice", ""); code != 204 {
			t.Errorf("destroy: %d %s", code, body)
		}
		e.create("twice")
	})
	code, body := e.call("POST", "/v1/sandboxes/twice/suspend", "")
	t.Logf("the suspend: %d %s", code, body)
	rec := e.rec("twice")
	if rec.ProviderName == old || rec.State != store.StateRunning {
		t.Fatalf("the new sandbox's record after the old one's suspend: %+v", rec)
	}
}

// TestDestroyMeetsANewIncarnation: a destroy whose record was destroyed
// by another call and the name made again (through another replica) (a new sandbox) while it
// destroyed its own sandbox does not delete the new record: it did, and
// the new sandbox, which its create had answered 201 for, ran with no
// record until it was destroyed as an orphan.
func TestDestroyMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	b := e.replicaB(nil) // the other destroy and the create come through another replica
	old := e.create("twice").ProviderName
	e.f.setHook(&e.f.afterDestroy, func() {
		if got := <-e.callOn(b, "DELETE", "/v1/sandboxes/twice", ""); !strings.HasPrefix(got, "204") {
			t.Errorf("the other destroy: %s", got)
		}
		if got := <-e.callOn(b, "POST", "/v1/sandboxes", `{"name": "twice"}`); !strings.HasPrefix(got, "201 ") {
			t.Errorf("the create: %s", got)
		}
	})
	if code, body := e.call("DELETE", "/v1/sandboxes/twice", ""); code != 204 {
		t.Fatalf("destroy: %d %s", code, body)
	}
	rec, err := e.pl.Store.GetSandbox(context.Background(), e.acct.ID, "twice")
	if err != nil || rec.ProviderName == old || !e.onProvider(rec.ProviderName) {
		t.Fatalf("the new sandbox's record after the old one's destroy: %+v, %v", rec, err)
	}
}

// TestWakeOutlivedByAnotherPark: a wake whose resume outlasts another
// replica's wake and a new park of the sandbox (idle again) does not
// write "running" over the new park (the sandbox suspended again): the
// call is answered unavailable, and the next one wakes it.
func TestWakeOutlivedByAnotherPark(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	b := e.replicaB(nil)
	e.create("box")
	e.later(20 * time.Minute)
	if _, err := e.pl.API.Park(ctx, e.rec("box"), e.now().Add(-15*time.Minute)); err != nil {
		t.Fatal(err)
	}
	g := newGate(t)
	e.f.setHook(&e.f.afterResume, g.wait)
	res := e.execOn(b, "box")
	await(t, g.in, "b's wake never resumed")
	e.exec("box", "on-a") // a finds it resumed (by b) and records it running
	e.later(20 * time.Minute)
	if _, err := e.pl.API.Park(ctx, e.rec("box"), e.now().Add(-15*time.Minute)); err != nil {
		t.Fatalf("the second park: %v", err)
	}
	g.open() // b's wake, its resume done before the new park, goes on to write
	got := await(t, res, "the exec on b never answered")
	if rec := e.rec("box"); rec.State != store.StateParked {
		t.Fatalf("after b's late wake (answered %s): record %+v, want still parked (the sandbox is suspended)", got, rec)
	}
	if !strings.HasPrefix(got, "503 ") {
		t.Errorf("b's exec, whose wake a newer park overtook: %s; want 503", got)
	}
	e.exec("box", "again")
}

// TestDeleteMeetsANewIncarnation: a record deleted after a check (a pass
// finding its sandbox gone from the provider, a destroy, a GET finding it
// gone) is not the name's next sandbox when the name is destroyed and made
// again through another replica in the instant between the check and the
// delete. Each path re-read the record, then deleted it by name: the new
// record went, and its sandbox ran with no record until it was destroyed
// as an orphan. Each is now one conditional delete (DeleteSandboxIf).
func TestDeleteMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	hs := &hookStore{Store: e.pl.Store}
	b := e.replicaB(hs) // the path under test runs on b, over hs
	// again destroys the name and makes it again through e.pl, the other
	// replica, in the instant before b's (or the pass's) delete.
	again := func(name string) {
		hs.mu.Lock()
		hs.onDelete = func() {
			if code, body := e.call("DELETE", "/v1/sandboxes/"+name, ""); code != 204 {
				t.Errorf("the other destroy of %s: %d %s", name, code, body)
			}
			e.create(name)
		}
		hs.mu.Unlock()
	}
	check := func(path, name, old string) {
		t.Helper()
		rec, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, name)
		if err != nil || rec.ProviderName == old || !e.onProvider(rec.ProviderName) {
			t.Errorf("%s: the name's next sandbox after the old one's delete: %+v, %v (old provider name %s)", path, rec, err, old)
		}
	}

	// A pass finds the sandbox gone from its provider.
	old := e.create("reaped").ProviderName
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", old)); err != nil {
		t.Fatal(err)
	}
	m := lifecycle.New(lifecycle.Config{Store: hs, API: b.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: e.now})
	again("reaped")
	m.Pass(ctx)
	check("a pass", "reaped", old)

	// A destroy on b.
	old = e.create("destroyed").ProviderName
	again("destroyed")
	if got := await(t, e.callOn(b, "DELETE", "/v1/sandboxes/destroyed", ""), "the destroy never answered"); !strings.HasPrefix(got, "204") {
		t.Fatalf("the destroy on b: %s", got)
	}
	check("a destroy", "destroyed", old)

	// A GET on b finds the sandbox gone from its provider.
	old = e.create("got").ProviderName
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", old)); err != nil {
		t.Fatal(err)
	}
	again("got")
	if got := await(t, e.callOn(b, "GET", "/v1/sandboxes/got", ""), "the GET never answered"); !strings.HasPrefix(got, "404 ") {
		t.Fatalf("the GET on b of a sandbox gone from its provider: %s", got)
	}
	check("a GET", "got", old)
}

// TestFailedCreateMeetsANewIncarnation: a create whose provider call fails
// deletes its own record, never the name's next: when the name's record
// is removed and made again through another replica in the instant before
// that delete, the new record stays. The delete was by name.
func TestFailedCreateMeetsANewIncarnation(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	hs := &hookStore{Store: e.pl.Store}
	b := e.replicaB(hs)
	var next string
	hs.mu.Lock()
	hs.onDelete = func() {
		// Another replica's destroy of the failed create's record (nothing
		// on the provider), then a create of the name that succeeds.
		if err := e.pl.Store.DeleteSandbox(ctx, e.acct.ID, "flop"); err != nil {
			t.Error(err)
		}
		e.f.failCreate.Store(false)
		next = e.create("flop").ProviderName
	}
	hs.mu.Unlock()
	e.f.failCreate.Store(true)
	if got := await(t, e.callOn(b, "POST", "/v1/sandboxes", `{"name": "flop"}`), "the create never answered"); !strings.HasPrefix(got, "503 ") {
		t.Fatalf("the create whose provider call failed: %s; want 503", got)
	}
	if next == "" {
		t.Fatal("the failed create deleted nothing: the hook never ran")
	}
	rec, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "flop")
	if err != nil || rec.ProviderName != next || !e.onProvider(next) {
		t.Fatalf("the name's next sandbox after a failed create's delete: %+v, %v (want provider name %s)", rec, err, next)
	}
}
