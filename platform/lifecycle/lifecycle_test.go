package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisor() // provider/local's supervisors are this binary
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// flaky is provider/fake with faults on demand: Get and ListAllNames
// answer 503 while down; ListAllNames is ErrTruncated while truncated;
// CreateNew and DestroyOnce do their work and then report a transport
// failure while uncertain (the outcome a timeout leaves).
type flaky struct {
	*fake.Provider
	noSuspend           bool
	down, truncated     atomic.Bool
	uncertain           atomic.Bool // also: a Suspend is made, then answers a timeout
	suspendLost         atomic.Bool // a Suspend answers a timeout without suspending
	createNews, destroy atomic.Int32
	terms, checkpoints  atomic.Int32
	createDelay         atomic.Int64               // a Create or CreateNew takes this long first
	failCreate          atomic.Bool                // a Create answers unavailable, making nothing
	created             chan sandbox.CreateOptions // when set, gets every Create's options

	// The park race's hooks (park_race_test.go): each set one is called
	// once, by the first CapabilitiesOf, Suspend or Exec after it is set.
	hookMu                    sync.Mutex
	onCaps, onSuspend, onExec func()
	onCreate, onResume, onGet func() // review_test.go's: the first Create or Resume after it is set, or Get of onGetOf after its answer
	onGetOf                   string
	afterSuspend              func()       // run once after the next Suspend's work
	afterDestroy              func()       // run once after the next Destroy's work
	afterResume               func()       // run once after the next Resume's work
	suspending                atomic.Bool  // a Suspend is under way
	execOnParked              atomic.Int32 // Execs that met a sandbox suspended or being suspended
	suspends, resumes         atomic.Int32
}

func (f *flaky) delay(ctx context.Context) {
	if d := time.Duration(f.createDelay.Load()); d > 0 {
		select {
		case <-time.After(d):
		case <-ctx.Done():
		}
	}
}

func (f *flaky) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	f.delay(ctx)
	if f.created != nil {
		f.created <- o
	}
	f.takeHook(&f.onCreate)
	if f.failCreate.Load() {
		return nil, unavailable()
	}
	return f.Provider.Create(ctx, name, o)
}

func unavailable() error {
	return &sandbox.UnavailableError{Reason: sandbox.ReasonHTTP, HTTP: &sandbox.HTTPDetail{Status: 503}}
}

func (f *flaky) Capabilities() sandbox.Capabilities {
	c := f.Provider.Capabilities().With(sandbox.CapDestroyOnce, sandbox.CapCreateCheckpointOnce)
	if f.noSuspend {
		c = c.Without(sandbox.CapSuspend)
	}
	return c
}

func (f *flaky) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	if f.down.Load() {
		return sandbox.Info{}, unavailable()
	}
	info, err := f.Provider.Get(ctx, h)
	f.hookMu.Lock()
	mine := f.onGetOf == h.Name
	f.hookMu.Unlock()
	if mine {
		f.takeHook(&f.onGet)
	}
	return info, err
}

func (f *flaky) ListAllNames(ctx context.Context) ([]string, error) {
	switch {
	case f.down.Load():
		return nil, unavailable()
	case f.truncated.Load():
		return nil, sandbox.ErrTruncated
	}
	return f.Provider.ListAllNames(ctx)
}

func (f *flaky) CreateNew(ctx context.Context, name string, o sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	f.createNews.Add(1)
	f.delay(ctx)
	h, err := f.Provider.CreateNew(ctx, name, o)
	if err == nil && f.uncertain.Load() {
		return nil, sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	}
	return h, err
}

func (f *flaky) DestroyOnce(ctx context.Context, h *sandbox.Handle, _ sandbox.DestroyOnceOptions) error {
	f.destroy.Add(1)
	err := f.Provider.Destroy(ctx, h)
	if err == nil && f.uncertain.Load() {
		return sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	}
	return err
}

type env struct {
	t      *testing.T
	f      *flaky
	pl     *apitest.Platform
	key    string
	acct   store.Account
	m      *lifecycle.Manager
	offset atomic.Int64
}

func setup(t *testing.T, noSuspend bool) *env {
	f := &flaky{Provider: fake.New(), noSuspend: noSuspend}
	t.Cleanup(func() { _ = f.Provider.Close() })
	e := &env{t: t, f: f}
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f},
		Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
		Configure: func(c *api.Config) { c.Now = e.now }})
	e.pl, e.key = pl, pl.Account(t, "alice")
	e.acct, _ = pl.Store.AccountByName(context.Background(), "alice")
	e.m = lifecycle.New(lifecycle.Config{Store: pl.Store, API: pl.API, Idle: 15 * time.Minute, Grace: 10 * time.Minute, Now: e.now})
	return e
}

// now is the clock of the platform and the manager: real time plus what
// the test moved it on.
func (e *env) now() time.Time { return time.Now().Add(time.Duration(e.offset.Load())) }

func (e *env) later(d time.Duration) { e.offset.Add(int64(d)) }

func (e *env) call(method, path, body string) (int, string) {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.pl.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (e *env) create(name string) store.Sandbox {
	e.t.Helper()
	if code, body := e.call("POST", "/v1/sandboxes", `{"name": "`+name+`"}`); code != 201 {
		e.t.Fatalf("create %s: %d %s", name, code, body)
	}
	return e.rec(name)
}

func (e *env) rec(name string) store.Sandbox {
	e.t.Helper()
	r, err := e.pl.Store.GetSandbox(context.Background(), e.acct.ID, name)
	if err != nil {
		e.t.Fatalf("record %s: %v", name, err)
	}
	return r
}

func (e *env) exec(name, out string) {
	e.t.Helper()
	if code, body := e.call("POST", "/v1/sandboxes/"+name+"/exec", `{"cmd": "emit", "args": ["out:`+out+`"]}`); code != 200 || !strings.Contains(body, `"exit_code":0`) {
		e.t.Fatalf("exec in %s: %d %s", name, code, body)
	}
}

// TestIdleSuspendsAndWakes: an idle sandbox of a provider with suspend is
// suspended (the API shows it parked), and the next use resumes it there.
func TestIdleSuspendsAndWakes(t *testing.T) {
	e := setup(t, false)
	e.create("idle")
	e.create("busy")
	e.later(10 * time.Minute)
	if r := e.m.Pass(context.Background()); r.Parked != 0 {
		t.Fatalf("parked %d after 10 min, want 0", r.Parked)
	}
	e.exec("busy", "x")
	e.later(6 * time.Minute)
	if r := e.m.Pass(context.Background()); r.Parked != 1 {
		t.Fatalf("parked %d, want 1 (idle, not busy)", r.Parked)
	}
	rec := e.rec("idle")
	if rec.State != store.StateParked || rec.ParkedBy != store.ParkSuspend || rec.ParkedAt.IsZero() {
		t.Fatalf("record %+v", rec)
	}
	if info, err := e.f.Provider.Get(context.Background(), sandbox.BuildHandle("fake", rec.ProviderName)); err != nil || info.Status != sandbox.StatusSuspended {
		t.Fatalf("the provider says %v, %v; want suspended", info, err)
	}
	if _, body := e.call("GET", "/v1/sandboxes/idle", ""); !strings.Contains(body, `"state":"parked"`) || !strings.Contains(body, `"parked_by":"suspend"`) {
		t.Fatalf("the API shows %s", body)
	}
	if e.rec("busy").State != store.StateRunning {
		t.Fatal("a used sandbox was parked")
	}
	e.exec("idle", "awake")
	if rec := e.rec("idle"); rec.State != store.StateRunning || !rec.ParkedAt.IsZero() {
		t.Fatalf("after use: %+v", rec)
	}
	if info, _ := e.f.Provider.Get(context.Background(), sandbox.BuildHandle("fake", rec.ProviderName)); info.Status != sandbox.StatusRunning {
		t.Fatalf("the provider says %v after the wake", info.Status)
	}
}

// TestIdleWithoutSuspendDestroys: no suspend, so the idle sandbox is
// destroyed and recorded as parked by destroy; the next use creates it
// anew on the same provider under the same name there.
func TestIdleWithoutSuspendDestroys(t *testing.T) {
	e := setup(t, true)
	first := e.create("box")
	e.later(16 * time.Minute)
	if r := e.m.Pass(context.Background()); r.Parked != 1 {
		t.Fatalf("parked %d", r.Parked)
	}
	if names, _ := e.f.Provider.ListAllNames(context.Background()); len(names) != 0 {
		t.Fatalf("the provider still holds %v", names)
	}
	if rec := e.rec("box"); rec.State != store.StateParked || rec.ParkedBy != store.ParkDestroy {
		t.Fatalf("record %+v", rec)
	}
	// Reconciliation keeps a sandbox destroyed on purpose.
	e.later(2 * time.Minute)
	e.m.Pass(context.Background())
	e.rec("box")
	e.exec("box", "fresh")
	if rec := e.rec("box"); rec.State != store.StateRunning || rec.ProviderName != first.ProviderName || rec.Provider != "fake" {
		t.Fatalf("after the wake: %+v", rec)
	}
}

// TestTransientLosesNothing: a provider that answers 503 for two minutes
// of passes (and a truncated listing after) loses no record, parked or
// not, even one whose sandbox is really gone; once it answers, only the
// gone one is dropped.
func TestTransientLosesNothing(t *testing.T) {
	e := setup(t, false)
	e.create("parked")
	e.later(16 * time.Minute)
	e.m.Pass(context.Background())
	e.create("gone")
	e.create("kept")
	if err := e.f.Provider.Destroy(context.Background(), sandbox.BuildHandle("fake", e.rec("gone").ProviderName)); err != nil {
		t.Fatal(err)
	}
	e.f.down.Store(true)
	for range 3 { // two minutes of passes, a minute apart
		r := e.m.Pass(context.Background())
		if r.Gone != 0 || len(r.Skipped) == 0 {
			t.Fatalf("a pass while the provider is down: %+v", r)
		}
		e.later(time.Minute)
	}
	e.f.down.Store(false)
	e.f.truncated.Store(true)
	if r := e.m.Pass(context.Background()); r.Gone != 0 {
		t.Fatalf("a truncated listing reconciled: %+v", r)
	}
	for _, n := range []string{"parked", "gone", "kept"} {
		e.rec(n)
	}
	if e.rec("parked").State != store.StateParked {
		t.Fatal("the parked sandbox changed state")
	}
	e.f.truncated.Store(false)
	if r := e.m.Pass(context.Background()); r.Gone != 1 {
		t.Fatalf("after recovery: %+v, want one gone", r)
	}
	if _, err := e.pl.Store.GetSandbox(context.Background(), e.acct.ID, "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the gone sandbox's record: %v", err)
	}
	if e.rec("parked").State != store.StateParked {
		t.Fatal("the parked sandbox changed state")
	}
}

// TestStateFollowsProvider: a sandbox suspended behind the platform's
// back is recorded suspended after one pass.
func TestStateFollowsProvider(t *testing.T) {
	e := setup(t, false)
	rec := e.create("box")
	if err := e.f.Provider.Suspend(context.Background(), sandbox.BuildHandle("fake", rec.ProviderName)); err != nil {
		t.Fatal(err)
	}
	if r := e.m.Pass(context.Background()); r.Updated != 1 {
		t.Fatalf("%+v", r)
	}
	if e.rec("box").State != store.StateSuspended {
		t.Fatalf("state %s", e.rec("box").State)
	}
}

// TestOrphansAfterGrace: a platform-made name with no record is destroyed
// once it has been seen unrecorded for the grace period; other names are
// never touched.
func TestOrphansAfterGrace(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	for _, n := range []string{"mgp-00112233445566778899", "users-own"} {
		if _, err := e.f.Provider.Create(ctx, n, sandbox.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.create("recorded")
	if r := e.m.Pass(ctx); r.Orphans != 0 {
		t.Fatalf("first sight: %+v", r)
	}
	e.later(9 * time.Minute)
	if r := e.m.Pass(ctx); r.Orphans != 0 {
		t.Fatalf("within grace: %+v", r)
	}
	e.later(2 * time.Minute)
	e.f.truncated.Store(true) // a listing that is not the whole view destroys nothing
	if r := e.m.Pass(ctx); r.Orphans != 0 || len(r.Skipped) != 1 {
		t.Fatalf("after grace, on a truncated listing: %+v", r)
	}
	e.f.truncated.Store(false)
	if r := e.m.Pass(ctx); r.Orphans != 1 {
		t.Fatalf("after grace: %+v", r)
	}
	names, _ := e.f.Provider.ListAllNames(ctx)
	if len(names) != 2 || !strings.Contains(strings.Join(names, ","), "users-own") || !strings.Contains(strings.Join(names, ","), e.rec("recorded").ProviderName) {
		t.Fatalf("left: %v", names)
	}
}

// TestUncertainIntentsSettleWithoutRepeating: a create_new and a
// destroy_once whose outcome was uncertain are settled by looking; neither
// write is made twice.
func TestUncertainIntentsSettleWithoutRepeating(t *testing.T) {
	e := setup(t, false)
	ctx := context.Background()
	e.f.uncertain.Store(true)
	if code, body := e.call("POST", "/v1/sandboxes", `{"name": "cn", "create_new": true}`); code != 503 {
		t.Fatalf("uncertain create_new: %d %s", code, body)
	}
	if rec := e.rec("cn"); rec.State != store.StateCreating {
		t.Fatalf("record after an uncertain create_new: %+v", rec)
	}
	open, _ := e.pl.Store.OpenIntents(ctx)
	if len(open) != 1 || open[0].Op != store.OpCreateNew || open[0].State != store.IntentUncertain {
		t.Fatalf("intents: %+v", open)
	}
	e.f.uncertain.Store(false)
	e.later(11 * time.Minute)
	if r := e.m.Pass(ctx); r.Intents != 1 {
		t.Fatalf("%+v", r)
	}
	if rec := e.rec("cn"); rec.State != store.StateRunning {
		t.Fatalf("after settling: %+v", rec)
	}
	e.f.uncertain.Store(true)
	if code, body := e.call("DELETE", "/v1/sandboxes/cn?once=true", ""); code != 503 {
		t.Fatalf("uncertain destroy_once: %d %s", code, body)
	}
	e.rec("cn") // kept while uncertain
	e.f.uncertain.Store(false)
	if r := e.m.Pass(ctx); r.Intents != 1 {
		t.Fatalf("%+v", r)
	}
	if _, err := e.pl.Store.GetSandbox(ctx, e.acct.ID, "cn"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record after the settled destroy: %v", err)
	}
	if open, _ := e.pl.Store.OpenIntents(ctx); len(open) != 0 {
		t.Fatalf("open intents left: %+v", open)
	}
	if e.f.createNews.Load() != 1 || e.f.destroy.Load() != 1 {
		t.Fatalf("writes repeated: %d create_new, %d destroy_once", e.f.createNews.Load(), e.f.destroy.Load())
	}
}

// TestBusyIsNotIdle: a sandbox with a call in flight (a long exec) or an
// attached stream is not parked, however long ago the call began.
func TestBusyIsNotIdle(t *testing.T) {
	e := setup(t, false)
	e.create("long")
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.call("POST", "/v1/sandboxes/long/exec", `{"cmd": "emit", "args": ["sleep:4s", "out:done"]}`)
	}()
	deadline := time.Now().Add(5 * time.Second)
	for !e.pl.API.Active(e.acct.ID, "long") {
		if time.Now().After(deadline) {
			t.Fatal("the exec never showed as active")
		}
		time.Sleep(5 * time.Millisecond)
	}
	e.later(20 * time.Minute)
	if r := e.m.Pass(context.Background()); r.Parked != 0 {
		t.Fatalf("parked a sandbox with an exec in flight: %+v", r)
	}
	<-done
	if e.rec("long").State != store.StateRunning {
		t.Fatalf("state %s", e.rec("long").State)
	}
	// Its activity is the end of the exec: idle only from then.
	e.later(10 * time.Minute)
	if r := e.m.Pass(context.Background()); r.Parked != 0 {
		t.Fatalf("parked 10 minutes after the exec ended: %+v", r)
	}
}

// TestLeaseGatesPasses (issue 19): a Manager whose Lease is held by
// another replica makes no pass, so an idle sandbox stays as it is; once
// it holds the lease, its next pass parks it.
func TestLeaseGatesPasses(t *testing.T) {
	e := setup(t, false)
	e.create("idle")
	e.later(20 * time.Minute)
	var held, asked atomic.Bool
	m := lifecycle.New(lifecycle.Config{Store: e.pl.Store, API: e.pl.API, Idle: 15 * time.Minute, Interval: 10 * time.Millisecond, Now: e.now,
		Lease: func(context.Context) bool { asked.Store(true); return held.Load() }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = m.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for !asked.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the manager never asked for its lease")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // ten intervals without the lease
	if rec := e.rec("idle"); rec.State == store.StateParked {
		t.Fatal("a manager without the lease parked a sandbox")
	}
	held.Store(true)
	for e.rec("idle").State != store.StateParked {
		if time.Now().After(deadline) {
			t.Fatal("the manager holding the lease never parked the idle sandbox")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
