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
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// setHook sets one of flaky's one-shot hooks.
func (f *flaky) setHook(h *func(), fn func()) {
	f.hookMu.Lock()
	defer f.hookMu.Unlock()
	*h = fn
}

// takeHook runs and clears a hook, if set.
func (f *flaky) takeHook(h *func()) {
	f.hookMu.Lock()
	fn := *h
	*h = nil
	f.hookMu.Unlock()
	if fn != nil {
		fn()
	}
}

func (f *flaky) CapabilitiesOf(ctx context.Context, h *sandbox.Handle) (sandbox.Capabilities, error) {
	f.takeHook(&f.onCaps)
	return f.Capabilities(), nil
}

func (f *flaky) Suspend(ctx context.Context, h *sandbox.Handle) error {
	f.suspends.Add(1)
	f.suspending.Store(true)
	defer f.suspending.Store(false)
	f.takeHook(&f.onSuspend)
	if f.suspendLost.Load() {
		return sandbox.Unavailable(sandbox.ReasonTimeout, nil) // timed out before it reached the sandbox
	}
	err := f.Provider.Suspend(ctx, h)
	f.takeHook(&f.afterSuspend)
	if err == nil && f.uncertain.Load() {
		return sandbox.Unavailable(sandbox.ReasonTimeout, nil) // done, but the answer timed out
	}
	return err
}

func (f *flaky) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	f.resumes.Add(1)
	f.takeHook(&f.onResume)
	nh, err := f.Provider.Resume(ctx, h)
	f.takeHook(&f.afterResume)
	return nh, err
}

// Exec counts the commands that reach a sandbox suspended or being
// suspended (what a park racing a call does to it).
func (f *flaky) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if info, err := f.Provider.Get(ctx, h); f.suspending.Load() || err == nil && info.Status == sandbox.StatusSuspended {
		f.execOnParked.Add(1)
	}
	f.takeHook(&f.onExec)
	return f.Provider.Exec(ctx, h, c, o)
}

// gate stops a hook's caller until opened; in is closed when one arrives.
type gate struct {
	in, out       chan struct{}
	arrived, done sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{in: make(chan struct{}), out: make(chan struct{})}
	t.Cleanup(g.open) // nothing a test starts outlives it
	return g
}

func (g *gate) wait() { g.arrived.Do(func() { close(g.in) }); <-g.out }
func (g *gate) open() { g.done.Do(func() { close(g.out) }) }

func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatal(what)
		panic("unreachable")
	}
}

// execOn runs an exec through the platform pl and sends its answer.
func (e *env) execOn(pl *apitest.Platform, name string) <-chan string {
	ch := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", pl.URL+"/v1/sandboxes/"+name+"/exec", strings.NewReader(`{"cmd": "emit", "args": ["out:hi"]}`))
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

// parkRace interleaves, with hooks, a park of replica a (what its
// lifecycle manager calls) with an exec sent to replica b, both ways:
//
//   - the exec starts between the park's check and its provider call: the
//     park must see it and give up (not suspend a sandbox a call is in);
//   - the exec starts while the park's suspend is under way: the exec must
//     wait for the park and wake the sandbox, never run on it suspended;
//   - so must a create that adopts the sandbox.
func parkRace(t *testing.T, e *env, a, b *apitest.Platform) {
	ctx := context.Background()
	e.create("early")
	e.create("late")
	e.create("adopted")
	e.later(20 * time.Minute)
	idleSince := e.now().Add(-15 * time.Minute)
	providerStatus := func(name string) sandbox.Status {
		info, err := e.f.Provider.Get(ctx, sandbox.BuildHandle("fake", e.rec(name).ProviderName))
		if err != nil {
			t.Fatal(err)
		}
		return info.Status
	}

	// The exec starts between the park's check and its suspend.
	caps, exec := newGate(t), newGate(t)
	e.f.setHook(&e.f.onCaps, caps.wait)
	e.f.setHook(&e.f.onExec, exec.wait)
	parked := make(chan error, 1)
	go func() { _, err := a.API.Park(ctx, e.rec("early"), idleSince); parked <- err }()
	await(t, caps.in, "the park never reached its provider")
	res := e.execOn(b, "early")
	await(t, exec.in, "the exec on b never reached its provider")
	caps.open()
	err := await(t, parked, "the park never ended")
	if e.f.suspends.Load() != 0 || err == nil {
		t.Fatalf("the park suspended a sandbox with an exec in flight on b (started after the park's check): %v, %d suspends", err, e.f.suspends.Load())
	}
	exec.open()
	if got := await(t, res, "the exec never answered"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the exec on b: %s", got)
	}
	if rec := e.rec("early"); rec.State != store.StateRunning || providerStatus("early") != sandbox.StatusRunning {
		t.Fatalf("after the park gave up: record %s, provider %s", rec.State, providerStatus("early"))
	}

	// The exec starts while the suspend is under way.
	suspend := newGate(t)
	e.f.setHook(&e.f.onSuspend, suspend.wait)
	go func() { _, err := a.API.Park(ctx, e.rec("late"), idleSince); parked <- err }()
	await(t, suspend.in, "the park never suspended")
	res = e.execOn(b, "late")
	// b's call has begun once its activity is marked in the store.
	deadline := time.Now().Add(20 * time.Second)
	for !e.rec("late").LastActivity.After(idleSince) {
		if time.Now().After(deadline) {
			t.Fatal("the exec on b never marked its activity")
		}
		time.Sleep(5 * time.Millisecond)
	}
	suspend.open()
	if err := await(t, parked, "the park never ended"); err != nil {
		t.Fatalf("the park: %v", err)
	}
	if got := await(t, res, "the exec never answered"); !strings.HasPrefix(got, "200 ") {
		t.Fatalf("the exec on b: %s", got)
	}
	if n := e.f.execOnParked.Load(); n != 0 {
		t.Fatalf("%d exec(s) ran on a sandbox suspended or being suspended", n)
	}
	if rec := e.rec("late"); rec.State != store.StateRunning || providerStatus("late") != sandbox.StatusRunning || e.f.resumes.Load() != 1 {
		t.Fatalf("after the exec: record %s, provider %s, %d resumes; want running, running, 1 (woken)", rec.State, providerStatus("late"), e.f.resumes.Load())
	}

	// A create adopting the sandbox starts while the suspend is under way.
	suspend = newGate(t)
	e.f.setHook(&e.f.onSuspend, suspend.wait)
	go func() { _, err := a.API.Park(ctx, e.rec("adopted"), idleSince); parked <- err }()
	await(t, suspend.in, "the park never suspended")
	adopt := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("POST", b.URL+"/v1/sandboxes", strings.NewReader(`{"name": "adopted"}`))
		req.Header.Set("Authorization", "Bearer "+e.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			adopt <- err.Error()
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		adopt <- fmt.Sprint(resp.StatusCode, " ", string(body))
	}()
	for !e.rec("adopted").LastActivity.After(idleSince) {
		if time.Now().After(deadline) {
			t.Fatal("the create on b never marked its activity")
		}
		time.Sleep(5 * time.Millisecond)
	}
	suspend.open()
	if err := await(t, parked, "the park never ended"); err != nil {
		t.Fatalf("the park: %v", err)
	}
	if got := await(t, adopt, "the create never answered"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, `"state":"running"`) {
		t.Fatalf("the adopting create on b: %s", got)
	}
	if rec := e.rec("adopted"); rec.State != store.StateRunning || providerStatus("adopted") != sandbox.StatusRunning || e.f.resumes.Load() != 2 {
		t.Fatalf("after the adopting create: record %s, provider %s, %d resumes; want running, running, 2 (woken)", rec.State, providerStatus("adopted"), e.f.resumes.Load())
	}
}

// TestParkRaceSQLite (issue 18 item 5): the park race on the embedded
// store, with two API servers on it (the race is the same within one).
func TestParkRaceSQLite(t *testing.T) {
	e := setup(t, false)
	b := apitest.Start(t, apitest.Options{Store: e.pl.Store, Providers: map[string]sandbox.Provider{"fake": e.f},
		Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
		Configure: func(c *api.Config) { c.Now = e.now }})
	parkRace(t, e, e.pl, b)
}

// TestParkRacePostgres (issues 18 item 5, 19): the park race across two
// replicas on one PostgreSQL database.
func TestParkRacePostgres(t *testing.T) {
	r := startReplicas(t)
	parkRace(t, &r.env, r.a, r.b)
}

// TestDeadParkSettles: a park that died between its claim and its record's
// last write (the record left "parking") holds its sandbox's calls for
// api.ParkingStale at most (then 503 unavailable, not a call on a sandbox
// in doubt), and the next pass after that settles it from the provider:
// parked when the provider suspended or destroyed it, running when the
// park never reached it.
func TestDeadParkSettles(t *testing.T) {
	e := setup(t, true) // no suspend: parks destroy
	ctx := context.Background()
	for _, n := range []string{"destroyed", "untouched"} {
		rec := e.create(n)
		rec.State, rec.ParkedAt, rec.ParkedBy = store.StateParking, e.now().UTC(), store.ParkDestroy
		if _, err := e.pl.Store.UpdateSandbox(ctx, rec); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.f.Provider.Destroy(ctx, sandbox.BuildHandle("fake", e.rec("destroyed").ProviderName)); err != nil {
		t.Fatal(err)
	}
	if r := e.m.Pass(ctx); r.Updated+r.Gone != 0 {
		t.Fatalf("a pass settled parks still under way: %+v", r)
	}
	e.later(api.ParkingStale)
	if code, body := e.call("POST", "/v1/sandboxes/untouched/exec", `{"cmd": "emit", "args": ["out:x"]}`); code != 503 || !strings.Contains(body, `"unavailable"`) || !strings.Contains(body, "parked") {
		t.Fatalf("an exec on a sandbox a dead park holds: %d %s", code, body)
	}
	if r := e.m.Pass(ctx); r.Updated != 2 || r.Gone != 0 {
		t.Fatalf("%+v, want both dead parks settled", r)
	}
	if rec := e.rec("destroyed"); rec.State != store.StateParked || rec.ParkedBy != store.ParkDestroy {
		t.Fatalf("the destroyed one: %+v", rec)
	}
	if rec := e.rec("untouched"); rec.State != store.StateRunning || rec.ParkedBy != "" || !rec.ParkedAt.IsZero() {
		t.Fatalf("the one the park never reached: %+v", rec)
	}
	e.exec("destroyed", "woken") // the next use creates it anew
	e.exec("untouched", "fine")
	if e.f.execOnParked.Load() != 0 {
		t.Fatal("an exec met a suspended sandbox")
	}
}
