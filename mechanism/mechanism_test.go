package mechanism_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// silent declares nothing: it requires everything and guarantees nothing.
type silent struct{ mechanism.Mechanism }

func (silent) Name() string { return "silent" }

type declared struct {
	silent
	req, con, gua []mechanism.Capability
}

func (d declared) RequiredCapabilities() []mechanism.Capability    { return d.req }
func (d declared) ConstructedCapabilities() []mechanism.Capability { return d.con }
func (d declared) GuaranteedCapabilities() []mechanism.Capability  { return d.gua }

type fakeProber struct {
	avail  map[mechanism.Capability]bool
	probed []mechanism.Capability
}

func (f *fakeProber) Probe(_ context.Context, c mechanism.Capability) mechanism.Report {
	f.probed = append(f.probed, c)
	if f.avail[c] {
		return mechanism.Report{Name: c, Available: true}
	}
	return mechanism.Report{Name: c, Detail: "not on this fake host"}
}

func TestGateSilentRequiresEverything(t *testing.T) {
	p := &fakeProber{}
	err := mechanism.Gate(context.Background(), silent{}, mechanism.Spec{}, p)
	var u *mechanism.UnavailableError
	if !errors.As(err, &u) || !errors.Is(err, mechanism.ErrCapabilityUnavailable) {
		t.Fatalf("err = %v, want *UnavailableError", err)
	}
	if len(u.Missing) != len(mechanism.DefaultRequired) {
		t.Fatalf("missing %d, want every default (%d): %v", len(u.Missing), len(mechanism.DefaultRequired), u.Missing)
	}
	for _, r := range u.Missing {
		if r.Detail == "" {
			t.Errorf("%s has no reason", r.Name)
		}
	}
}

func TestGateConstructedNotProbedAndLimitsRefused(t *testing.T) {
	p := &fakeProber{avail: map[mechanism.Capability]bool{mechanism.Landlock: true, mechanism.MemoryCap: true}}
	m := declared{
		req: []mechanism.Capability{mechanism.Landlock, mechanism.NetworkRestriction},
		con: []mechanism.Capability{mechanism.NetworkRestriction, mechanism.TimeBudget},
		gua: []mechanism.Capability{mechanism.MemoryCap, mechanism.TimeBudget},
	}
	spec := mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 1 << 26, WallClock: 1, DiskBytes: 1}}
	err := mechanism.Gate(context.Background(), m, spec, p)
	var u *mechanism.UnavailableError
	if !errors.As(err, &u) {
		t.Fatalf("err = %v, want refusal of disk_quota", err)
	}
	if len(u.Missing) != 1 || u.Missing[0].Name != mechanism.DiskQuota {
		t.Fatalf("missing = %v, want only disk_quota (not guaranteed)", u.Missing)
	}
	if slices.Contains(p.probed, mechanism.NetworkRestriction) || slices.Contains(p.probed, mechanism.TimeBudget) {
		t.Fatalf("constructed capability probed: %v", p.probed)
	}
	if !slices.Contains(p.probed, mechanism.MemoryCap) {
		t.Fatalf("a limit's capability was not probed on the host: %v", p.probed)
	}
	spec.DiskBytes = 0
	if err := mechanism.Gate(context.Background(), m, spec, p); err != nil {
		t.Fatalf("gate refused a satisfiable spec: %v", err)
	}
}

func TestResolveHome(t *testing.T) {
	for in, want := range map[string]string{
		"/home/sprite":           "/h",
		"/home/sprite/a/b":       "/h/a/b",
		"a/b":                    "/h/a/b",
		"":                       "/h",
		"/home/sprite/x/../y":    "/h/y",
		"/home/sprite/../sprite": "/h",
	} {
		got, err := mechanism.ResolveHome("/h", in)
		if err != nil || got != want {
			t.Errorf("ResolveHome(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"/etc/passwd", "../x", "/home/sprite/../../etc", "/home/spritex", "/home"} {
		if _, err := mechanism.ResolveHome("/h", bad); !errors.Is(err, mechanism.ErrInvalid) {
			t.Errorf("ResolveHome(%q) err = %v, want ErrInvalid", bad, err)
		}
	}
}

func TestValidateID(t *testing.T) {
	for _, bad := range []string{"", ".", "..", "a/b", "a b", string(make([]byte, 129))} {
		if err := mechanism.ValidateID(bad); !errors.Is(err, mechanism.ErrInvalid) {
			t.Errorf("ValidateID(%q) = %v", bad, err)
		}
	}
	if err := mechanism.ValidateID("sb-1.a_B"); err != nil {
		t.Error(err)
	}
}

// TestHostProbe runs every real probe; as root on a Linux host with the
// kernel features this project targets every host-probeable name must be
// available.
func TestHostProbe(t *testing.T) {
	testenv.RequireRoot(t)
	p := mechanism.NewHostProber()
	for _, c := range mechanism.Known {
		r := p.Probe(context.Background(), c)
		t.Logf("%-22s %-5v %s", c, r.Available, r.Detail)
		if !r.Available && r.Detail == "" {
			t.Errorf("%s unavailable without a reason", c)
		}
		switch c {
		case mechanism.TimeBudget, mechanism.EgressAllowlist, mechanism.HostMounts:
			if r.Available {
				t.Errorf("%s reported available by the host", c)
			}
		case mechanism.DiskQuota:
		default:
			testenv.Require(t, r.Available, string(c)+": "+r.Detail)
		}
	}
	// The probes leave nothing behind in this process's cgroups.
	l, err := mechanism.CgroupLayout()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range l.V1 {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() && len(e.Name()) > 15 && e.Name()[:15] == "managoat-probe-" {
				t.Errorf("probe cgroup left behind: %s/%s", d, e.Name())
			}
		}
	}
}

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}
