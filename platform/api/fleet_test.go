package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/provider/fake"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

const gibi = int64(1) << 30

// fleetRunner starts a daemon serving a fake provider with labels and a
// reported memory; stop ends it early (the runner vanishes).
func fleetRunner(t *testing.T, url, key, name string, mem int64, labels map[string]string) (f *fake.Provider, stop func()) {
	t.Helper()
	f = fake.New()
	t.Cleanup(func() { _ = f.Close() })
	d, err := runner.New(runner.Config{URL: url, Token: key, Name: name, Root: t.TempDir(), Provider: f, Logger: slog.New(slog.DiscardHandler),
		BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PingInterval: -1,
		Labels: labels, CapacityMemory: mem, CapacityCPUs: 4})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			d.Close()
		})
	}
	t.Cleanup(stop)
	return f, stop
}

// waitCapacity waits until n runners are online with a capacity report.
func waitCapacity(t *testing.T, pl *apitest.Platform, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		k := 0
		for _, i := range pl.Relay.Host().Online() {
			if i.Capacity != nil {
				k++
			}
		}
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d runners report capacity, want %d", k, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runnerOf(t *testing.T, pl *apitest.Platform, key, name string) string {
	t.Helper()
	a := call(t, "GET", pl.URL+"/v1/sandboxes/"+name, key, nil)
	var v api.Sandbox
	if json.Unmarshal(a.body, &v) != nil || v.Name != name {
		t.Fatalf("GET %s = %d %s", name, a.status, a.body)
	}
	recs, err := pl.Store.ListSandboxes(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if r.Name == name {
			id, _ := runnerprov.Parse(r.ProviderName)
			for _, i := range pl.Relay.Host().Online() {
				if i.ID == id {
					return i.Name
				}
			}
			return id
		}
	}
	t.Fatalf("no record of %s", name)
	return ""
}

func runnerViews(t *testing.T, pl *apitest.Platform, key string) map[string]api.RunnerView {
	t.Helper()
	a := call(t, "GET", pl.URL+"/v1/runners", key, nil)
	var out struct{ Data []api.RunnerView }
	if a.status != 200 || json.Unmarshal(a.body, &out) != nil {
		t.Fatalf("GET /v1/runners = %d %s", a.status, a.body)
	}
	m := map[string]api.RunnerView{}
	for _, v := range out.Data {
		m[v.Name] = v
	}
	return m
}

// TestFleetPlacement: sandboxes spread over the account's runners by
// what their records ask against each runner's reported memory; a
// selector picks by labels; a create that fits nowhere is 403 naming what
// did not fit; a cordoned runner takes nothing (and says so) until
// uncordoned; a runner that vanishes lists its sandboxes runner_offline,
// calls on them fail at once with unavailable, nothing is placed on it,
// and all is as before when it is back.
func TestFleetPlacement(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	key := pl.Account(t, "alice")
	fleetRunner(t, pl.URL, key, "eu1", 4*gibi, map[string]string{"zone": "eu"})
	fleetRunner(t, pl.URL, key, "eu2", 4*gibi, map[string]string{"zone": "eu", "gpu": "h100"})
	_, stopUS := fleetRunner(t, pl.URL, key, "us1", 4*gibi, map[string]string{"zone": "us"})
	waitCapacity(t, pl, 3)
	create := func(name, extra string) answer {
		return call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+name+`", "provider": "runner", "limits": {"memory_bytes": `+fmt.Sprint(gibi)+`}`+extra+`}`))
	}
	// Spread: three sandboxes of 1 GiB, one on each runner.
	seen := map[string]int{}
	for i := range 3 {
		name := fmt.Sprintf("s%d", i)
		if a := create(name, ""); a.status != 201 {
			t.Fatalf("create %s = %d %s", name, a.status, a.body)
		}
		seen[runnerOf(t, pl, key, name)]++
	}
	if seen["eu1"] != 1 || seen["eu2"] != 1 || seen["us1"] != 1 {
		t.Fatalf("three creates placed %v; want one on each runner (spread)", seen)
	}
	// Selectors.
	if a := create("g", `, "runner_selector": "gpu=h100"`); a.status != 201 || runnerOf(t, pl, key, "g") != "eu2" {
		t.Fatalf("gpu=h100: %d %s", a.status, a.body)
	}
	if a := create("z", `, "runner_selector": "zone in (us, ap)"`); a.status != 201 || runnerOf(t, pl, key, "z") != "us1" {
		t.Fatalf("zone in (us,ap): %d %s", a.status, a.body)
	}
	if a := create("none", `, "runner_selector": "gpu=a100"`); a.status != 403 || a.err == nil || a.err.Reason != "no_runner_fits" ||
		!strings.Contains(a.err.Message, "labels do not match gpu=a100") {
		t.Fatalf("gpu=a100 = %d %s, want 403 no_runner_fits", a.status, a.body)
	}
	if a := create("bad", `, "runner_selector": "zone in eu"`); a.status != 400 || a.err == nil || a.err.Field != "runner_selector" {
		t.Fatalf("a malformed selector = %d %s, want 400 naming runner_selector", a.status, a.body)
	}
	// Capacity: eu2 holds 2 GiB of 4; 3 GiB more fits nowhere in eu.
	big := `{"name": "big", "provider": "runner", "runner_selector": "gpu", "limits": {"memory_bytes": ` + fmt.Sprint(3*gibi) + `}}`
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(big)); a.status != 403 || a.err == nil || a.err.Reason != "resource_exhausted" ||
		!strings.Contains(a.err.Message, "eu2: memory: 3.0 GiB asked, 2.0 GiB left of 4.0 GiB") {
		t.Fatalf("3 GiB on eu2 = %d %s, want 403 resource_exhausted naming eu2's memory", a.status, a.body)
	}
	if _, err := pl.Store.GetSandbox(context.Background(), mustAcct(t, pl, "alice"), "big"); err == nil {
		t.Fatal("a refused create left a record")
	}
	// Cordon: eu1 and us1 cordoned, a create goes to eu2; the listing says so.
	for _, r := range []string{"eu1", "us1"} {
		if a := call(t, "POST", pl.URL+"/v1/runners/"+r+"/cordon", key, nil); a.status != 200 || !strings.Contains(string(a.body), `"schedule":"cordoned"`) {
			t.Fatalf("cordon %s = %d %s", r, a.status, a.body)
		}
	}
	if a := create("c1", ""); a.status != 201 || runnerOf(t, pl, key, "c1") != "eu2" {
		t.Fatalf("with eu1 and us1 cordoned: %d %s", a.status, a.body)
	}
	vs := runnerViews(t, pl, key)
	if vs["eu1"].Schedule != "cordoned" || vs["eu2"].Schedule != "" || vs["eu2"].Used.MemoryBytes != 3*gibi || vs["eu2"].Used.Sandboxes != 3 ||
		vs["eu2"].Labels["gpu"] != "h100" || vs["eu2"].Capacity == nil || vs["eu2"].Capacity.MemoryBytes != 4*gibi || !vs["eu2"].Online {
		t.Fatalf("runners: %+v", vs)
	}
	// eu2 is full for 2 GiB, the others cordoned.
	two := `{"name": "two", "provider": "runner", "limits": {"memory_bytes": ` + fmt.Sprint(2*gibi) + `}}`
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(two)); a.status != 403 || !strings.Contains(a.err.Message, "eu1: cordoned") {
		t.Fatalf("2 GiB with eu2 full and the rest cordoned = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/runners/eu1/uncordon", key, nil); a.status != 200 {
		t.Fatalf("uncordon = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(two)); a.status != 201 || runnerOf(t, pl, key, "two") != "eu1" {
		t.Fatalf("2 GiB after eu1's uncordon = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/runners/nosuch/cordon", key, nil); a.status != 404 {
		t.Fatalf("cordon of an unknown runner = %d %s", a.status, a.body)
	}
	// us1 vanishes: its sandboxes list runner_offline, calls fail fast.
	call(t, "POST", pl.URL+"/v1/runners/us1/uncordon", key, nil)
	stopUS()
	deadline := time.Now().Add(10 * time.Second)
	for len(pl.Relay.Host().Online()) != 2 {
		if time.Now().After(deadline) {
			t.Fatal("us1 still online")
		}
		time.Sleep(5 * time.Millisecond)
	}
	l := call(t, "GET", pl.URL+"/v1/sandboxes", key, nil)
	var list struct{ Data []api.Sandbox }
	_ = json.Unmarshal(l.body, &list)
	states := map[string]string{}
	for _, v := range list.Data {
		states[v.Name] = v.State
	}
	offline := 0
	for name, st := range states {
		if st == api.StateRunnerOffline {
			offline++
			start := time.Now()
			a := call(t, "POST", pl.URL+"/v1/sandboxes/"+name+"/exec", key, strings.NewReader(`{"cmd": "true"}`))
			if a.status != 503 || a.err == nil || a.err.Reason != runnerprov.ReasonOffline || time.Since(start) > 5*time.Second {
				t.Fatalf("exec on %s with its runner gone = %d %s after %v, want 503 runner_offline at once", name, a.status, a.body, time.Since(start))
			}
		}
	}
	if offline != 2 || states["z"] != api.StateRunnerOffline {
		t.Fatalf("states with us1 gone: %v; want z and one more runner_offline", states)
	}
	// A GET (what managoat ls asks of each sandbox, through the Go
	// client) answers the record at once with state runner_offline, not
	// 503 (ls showed status unknown and no state).
	start := time.Now()
	if a := call(t, "GET", pl.URL+"/v1/sandboxes/z", key, nil); a.status != 200 || !strings.Contains(string(a.body), `"state":"runner_offline"`) || time.Since(start) > 5*time.Second {
		t.Fatalf("GET z with us1 gone = %d %s after %v, want 200 state runner_offline at once", a.status, a.body, time.Since(start))
	}
	cl, err := client.New(client.Options{URL: pl.URL, APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	info, err := cl.Get(context.Background(), sandbox.BuildHandle(client.Name, "z"))
	var raw struct{ State string }
	if err != nil || info.Status != sandbox.StatusUnknown || json.Unmarshal(info.Raw, &raw) != nil || raw.State != api.StateRunnerOffline {
		t.Fatalf("client Get z with us1 gone = %+v %s, %v; want status unknown, state runner_offline", info, info.Raw, err)
	}
	if v := runnerViews(t, pl, key)["us1"]; v.Online || v.Used.Sandboxes != 2 {
		t.Fatalf("us1 gone: %+v, want listed offline with its 2 sandboxes", v)
	}
	if a := create("after", `, "runner_selector": "zone=us"`); a.status != 403 || a.err.Reason != "no_runner_fits" {
		t.Fatalf("zone=us with us1 gone = %d %s, want 403 no_runner_fits", a.status, a.body)
	}
	// Back: as before.
	fleetRunner(t, pl.URL, key, "us1", 4*gibi, map[string]string{"zone": "us"})
	waitCapacity(t, pl, 3)
	l = call(t, "GET", pl.URL+"/v1/sandboxes", key, nil)
	if strings.Contains(string(l.body), api.StateRunnerOffline) {
		t.Fatalf("with us1 back: %s", l.body)
	}
	if a := create("after", `, "runner_selector": "zone=us"`); a.status != 201 {
		t.Fatalf("zone=us with us1 back = %d %s", a.status, a.body)
	}
}

func mustAcct(t *testing.T, pl *apitest.Platform, name string) string {
	a, err := pl.Store.AccountByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// TestFleetRacesNeverOvercommit: 24 creates at once through two API
// servers (two replicas over one store) onto two runners of 4 GiB: each
// runner ends holding at most 4 GiB of records, and exactly 8 creates of
// 1 GiB win; the others are 403 resource_exhausted.
func TestFleetRacesNeverOvercommit(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	key := pl.Account(t, "alice")
	// A second API server over the same store and relay: another replica.
	pl2 := apitest.Start(t, apitest.Options{Store: pl.Store, Configure: func(c *api.Config) { c.Runners = pl.Relay }})
	fleetRunner(t, pl.URL, key, "a", 4*gibi, nil)
	fleetRunner(t, pl.URL, key, "b", 4*gibi, nil)
	waitCapacity(t, pl, 2)
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, full := 0, 0
	for i := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			url := pl.URL
			if i%2 == 1 {
				url = pl2.URL
			}
			a := call(t, "POST", url+"/v1/sandboxes", key, strings.NewReader(fmt.Sprintf(`{"name": "r%d", "provider": "runner", "limits": {"memory_bytes": %d}}`, i, gibi)))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case a.status == 201:
				won++
			case a.status == 403 && a.err != nil && a.err.Reason == "resource_exhausted":
				full++
			default:
				t.Errorf("create r%d = %d %s", i, a.status, a.body)
			}
		}()
	}
	wg.Wait()
	vs := runnerViews(t, pl, key)
	if won != 8 || full != 16 || vs["a"].Used.MemoryBytes != 4*gibi || vs["b"].Used.MemoryBytes != 4*gibi {
		t.Fatalf("24 racing creates of 1 GiB on 2×4 GiB: %d won, %d refused; a holds %d, b %d", won, full, vs["a"].Used.MemoryBytes, vs["b"].Used.MemoryBytes)
	}
}

// TestFleetDrain: drain cordons the runner, parks its sandboxes (the fake
// suspends) pass by pass, and answers the progress; the schedule is in
// the store, so a new API server over it (a restart, another replica)
// still places nothing there.
func TestFleetDrain(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	key := pl.Account(t, "alice")
	fleetRunner(t, pl.URL, key, "old", 8*gibi, nil)
	waitCapacity(t, pl, 1)
	for _, n := range []string{"a", "b"} {
		if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+n+`", "provider": "runner"}`)); a.status != 201 {
			t.Fatalf("create %s = %d %s", n, a.status, a.body)
		}
	}
	fleetRunner(t, pl.URL, key, "new", 8*gibi, nil)
	waitCapacity(t, pl, 2)
	var st api.DrainStatus
	for i := 0; ; i++ {
		a := call(t, "POST", pl.URL+"/v1/runners/old/drain", key, strings.NewReader(`{}`))
		if a.status != 200 || json.Unmarshal(a.body, &st) != nil {
			t.Fatalf("drain = %d %s", a.status, a.body)
		}
		if st.Remaining == 0 || i == 20 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st.Remaining != 0 || len(st.Sandboxes) != 2 || st.Runner.Schedule != "draining" {
		t.Fatalf("drain: %+v", st)
	}
	for _, n := range []string{"a", "b"} {
		rec, err := pl.Store.GetSandbox(context.Background(), mustAcct(t, pl, "alice"), n)
		if err != nil || rec.State != "parked" || rec.ParkedBy != "suspend" {
			t.Fatalf("%s after drain: %+v %v, want parked by suspend", n, rec, err)
		}
	}
	pl2 := apitest.Start(t, apitest.Options{Store: pl.Store, Configure: func(c *api.Config) { c.Runners = pl.Relay }})
	for i := range 3 {
		n := fmt.Sprintf("n%d", i)
		if a := call(t, "POST", pl2.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+n+`", "provider": "runner"}`)); a.status != 201 || runnerOf(t, pl, key, n) != "new" {
			t.Fatalf("create %s through another server with old draining = %d %s", n, a.status, a.body)
		}
	}
	if v := runnerViews(t, pl2, key)["old"]; v.Schedule != "draining" {
		t.Fatalf("old through another server: %+v", v)
	}
	// A parked sandbox of the drained runner wakes there on use.
	if a := call(t, "POST", pl.URL+"/v1/sandboxes/a/exec", key, strings.NewReader(`{"cmd": "true"}`)); a.status != 200 {
		t.Fatalf("exec on a drained runner's parked sandbox = %d %s", a.status, a.body)
	}
}

// TestOpenAPIFleetSchemas: the fleet's schemas have exactly the JSON
// fields of their Go types (embedded structs flattened).
func TestOpenAPIFleetSchemas(t *testing.T) {
	var doc struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(api.OpenAPI, &doc); err != nil {
		t.Fatal(err)
	}
	var fields func(reflect.Type) []string
	fields = func(typ reflect.Type) []string {
		var out []string
		for i := range typ.NumField() {
			f := typ.Field(i)
			tag := strings.Split(f.Tag.Get("json"), ",")[0]
			if f.Anonymous && tag == "" {
				out = append(out, fields(f.Type)...)
				continue
			}
			if tag != "" && tag != "-" {
				out = append(out, tag)
			}
		}
		return out
	}
	for name, v := range map[string]any{"Runner": api.RunnerView{}, "Capacity": wire.Capacity{}, "DrainRequest": api.DrainRequest{},
		"DrainStatus": api.DrainStatus{}, "LabelsRequest": api.LabelsRequest{}} {
		s, ok := doc.Components.Schemas[name]
		if !ok {
			t.Errorf("no schema %s", name)
			continue
		}
		var documented []string
		for p := range s.Properties {
			documented = append(documented, p)
		}
		got := fields(reflect.TypeOf(v))
		slices.Sort(documented)
		slices.Sort(got)
		if !slices.Equal(documented, got) {
			t.Errorf("schema %s documents %v; the type has %v", name, documented, got)
		}
	}
}
