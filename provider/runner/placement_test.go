package runner_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

func TestParseSelector(t *testing.T) {
	for _, c := range []struct {
		in, out string
		match   map[string]string
		miss    map[string]string
	}{
		{"gpu=h100", "gpu=h100", map[string]string{"gpu": "h100"}, map[string]string{"gpu": "a10"}},
		{"gpu==h100", "gpu=h100", map[string]string{"gpu": "h100"}, nil},
		{"zone in (eu,us)", "zone in (eu,us)", map[string]string{"zone": "us"}, map[string]string{"zone": "ap"}},
		{"zone in (eu, us), gpu", "zone in (eu,us),gpu", map[string]string{"zone": "eu", "gpu": "x"}, map[string]string{"zone": "eu"}},
		{"zone notin (ap),!spot", "zone notin (ap),!spot", map[string]string{}, map[string]string{"spot": "1"}},
		{"zone!=us", "zone!=us", map[string]string{"zone": "eu"}, map[string]string{"zone": "us"}},
	} {
		s, err := prov.ParseSelector(c.in)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", c.in, err)
		}
		if s.String() != c.out {
			t.Errorf("ParseSelector(%q) = %q, want %q", c.in, s, c.out)
		}
		if !s.Matches(c.match) {
			t.Errorf("%q does not match %v", c.in, c.match)
		}
		if c.miss != nil && s.Matches(c.miss) {
			t.Errorf("%q matches %v", c.in, c.miss)
		}
	}
	for _, bad := range []string{"zone in eu", "gpu=h100,", "=x", "Zone=eu", "a=b=c", "zone in (eu,US/x)", strings.Repeat("a", 5000)} {
		if _, err := prov.ParseSelector(bad); err == nil {
			t.Errorf("ParseSelector(%q) accepted", bad)
		}
	}
}

func gib(n float64) int64 { return int64(n * (1 << 30)) }

// TestPlacePolicy: spread (least loaded first), selectors, capacity
// refusals naming what did not fit, cordon, and the preference for a
// runner when it fits.
func TestPlacePolicy(t *testing.T) {
	rs := []prov.Info{
		{ID: "a", Name: "big", Labels: map[string]string{"zone": "eu"}, Capacity: &wire.Capacity{CPUs: 8, MemoryBytes: gib(32), MemoryAvailable: gib(30)}},
		{ID: "b", Name: "small", Labels: map[string]string{"zone": "us"}, Capacity: &wire.Capacity{CPUs: 2, MemoryBytes: gib(4), MemoryAvailable: gib(4)}},
		{ID: "c", Name: "gpu", Labels: map[string]string{"zone": "eu", "gpu": "h100"}, Capacity: &wire.Capacity{CPUs: 4, MemoryBytes: gib(16), MemoryAvailable: gib(16), Load1: 8}},
	}
	used := map[string]prov.Used{"a": {MemoryBytes: gib(24)}}
	req := prov.PlaceRequest{Limits: sandbox.Limits{MemoryBytes: gib(2)}, Used: func(id string) prov.Used { return used[id] }}
	order := func(cs []prov.Candidate) string {
		var ids []string
		for _, c := range cs {
			ids = append(ids, c.Info.ID)
		}
		return strings.Join(ids, "")
	}
	cs, err := prov.Place(rs, req)
	// a: 26/32 = .81; b: 2/4 = .5; c: 2/16 + 8/4/4 = .625.
	if err != nil || order(cs) != "bca" {
		t.Fatalf("Place = %s, %v; want the least loaded first: bca", order(cs), err)
	}
	req.Selector, _ = prov.ParseSelector("zone in (eu)")
	if cs, err = prov.Place(rs, req); err != nil || order(cs) != "ca" {
		t.Fatalf("zone in (eu): %s, %v; want ca", order(cs), err)
	}
	req.Prefer = "a"
	if cs, err = prov.Place(rs, req); err != nil || order(cs) != "ac" {
		t.Fatalf("prefer a: %s, %v; want ac", order(cs), err)
	}
	req.Prefer = ""
	req.Limits.MemoryBytes = gib(12)
	cs, err = prov.Place(rs, req)
	var nf *prov.NoFitError
	if err == nil && order(cs) == "c" {
		// c fits 12 GiB; cordon it.
		req.Schedule = func(id string) string {
			if id == "c" {
				return "cordoned"
			}
			return ""
		}
		_, err = prov.Place(rs, req)
	}
	if !errors.As(err, &nf) || !errors.Is(err, prov.ErrNoFit) || nf.Reason != "resource_exhausted" ||
		!strings.Contains(err.Error(), "big: memory: 12.0 GiB asked, 8.0 GiB left of 32.0 GiB") || !strings.Contains(err.Error(), "gpu: cordoned") {
		t.Fatalf("12 GiB in eu with gpu cordoned: %v; want resource_exhausted naming big's memory and gpu's cordon", err)
	}
	req.Selector, _ = prov.ParseSelector("gpu=a100")
	if _, err = prov.Place(rs, req); !errors.As(err, &nf) || nf.Reason != "no_runner_fits" || !strings.Contains(err.Error(), "labels do not match gpu=a100") {
		t.Fatalf("gpu=a100: %v; want no_runner_fits", err)
	}
	// CPU and the sandbox count.
	rs[1].Capacity.MaxSandboxes = 1
	used["b"] = prov.Used{Sandboxes: 1}
	if why := prov.Fit(rs[1], sandbox.Limits{}, used["b"]); !strings.Contains(why, "sandboxes: 1 of at most 1") {
		t.Fatalf("Fit of a full runner = %q", why)
	}
	if why := prov.Fit(rs[1], sandbox.Limits{CPUMillis: 2500}, prov.Used{}); !strings.Contains(why, "cpu: 2500m asked, 2000m left of 2 CPUs") {
		t.Fatalf("Fit of 2.5 CPUs on 2 = %q", why)
	}
}

// TestRunnersReportCapacityAndLabels: daemons send their labels in the
// handshake and answer capacity at connection and at each heartbeat; the
// platform's Info carries both, with the daemon's overrides, and the
// count of sandboxes follows what the runner holds. Mint spreads: two
// fresh names go to the two runners, not both to the newest.
func TestRunnersReportCapacityAndLabels(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{HeartbeatInterval: 50 * time.Millisecond})
	f1, f2 := fake.New(), fake.New()
	startDaemon(t, pl.ts.URL, f1, func(c *runner.Config) {
		c.Name, c.Labels, c.CapacityMemory, c.CapacityCPUs, c.Root = "r1", map[string]string{"zone": "eu", "gpu": "h100"}, gib(3), 3, t.TempDir()
	})
	startDaemon(t, pl.ts.URL, f2, func(c *runner.Config) { c.Name, c.Root, c.CapacityCPUs = "r2", t.TempDir(), 3 })
	byName := func() map[string]prov.Info {
		m := map[string]prov.Info{}
		for _, i := range pl.host.Online() {
			m[i.Name] = i
		}
		return m
	}
	waitFor(t, "two runners reporting capacity", 10*time.Second, func() bool {
		m := byName()
		return len(m) == 2 && m["r1"].Capacity != nil && m["r2"].Capacity != nil
	})
	m := byName()
	r1 := m["r1"]
	if r1.Labels["zone"] != "eu" || r1.Labels["gpu"] != "h100" || r1.Capacity.MemoryBytes != gib(3) || r1.Capacity.CPUs != 3 ||
		r1.Capacity.DiskBytes <= 0 || r1.CapacityAt.IsZero() || !r1.HasCap(wire.CapCapacity) {
		t.Fatalf("r1 = %+v, capacity %+v; want its labels, 3 GiB, 3 CPUs, a disk", r1, r1.Capacity)
	}
	if m["r2"].Capacity.MemoryBytes <= 0 || m["r2"].Capacity.CPUs != 3 || len(m["r2"].Labels) != 0 {
		t.Fatalf("r2 capacity %+v labels %v; want the host's figures, no labels", m["r2"].Capacity, m["r2"].Labels)
	}
	p := pl.srv.Provider()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name, err := p.Mint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Create(ctx, name, sandbox.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	first, _ := prov.Parse(name)
	waitFor(t, "the sandbox counted in its runner's capacity", 10*time.Second, func() bool {
		for _, i := range pl.host.Online() {
			if i.ID == first {
				return i.Capacity.Sandboxes == 1 && i.Capacity.Idle == 1
			}
		}
		return false
	})
	name2, err := p.Mint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if second, _ := prov.Parse(name2); second == first {
		t.Fatalf("the second sandbox went to the runner holding the first (%s): no spread", first)
	}
}
