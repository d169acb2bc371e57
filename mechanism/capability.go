package mechanism

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// Capability names a guarantee a sandbox can be given.
type Capability string

// The capability vocabulary. The first group is probed on the host; the
// last three are built by a mechanism's own supervisor and no host provides
// them, so HostProber always reports them unavailable.
const (
	ResourceLimits        Capability = "resource_limits"        // memory_cap, pids_cap and cpu_cap together
	MemoryCap             Capability = "memory_cap"             // a cgroup memory limit can be created and read back
	PidsCap               Capability = "pids_cap"               // a cgroup pids limit can be created and read back
	CPUCap                Capability = "cpu_cap"                // a cgroup CPU quota can be created and read back
	ProcessSeparation     Capability = "process_separation"     // a pid namespace can be created
	FilesystemConfinement Capability = "filesystem_confinement" // a mount namespace, read-only binds and pivot_root work
	PrivilegeSeparation   Capability = "privilege_separation"   // a process can drop to another uid (or a user namespace) under no_new_privs
	NetworkRestriction    Capability = "network_restriction"    // a network namespace with only lo can be built and reaches nothing outside
	SyscallFilter         Capability = "syscall_filter"         // a seccomp filter can be loaded and denies
	Landlock              Capability = "landlock"               // a Landlock ruleset can be enforced and denies a write
	DiskQuota             Capability = "disk_quota"             // the storage sits on a quota-capable filesystem

	TimeBudget      Capability = "time_budget"      // a wall-clock budget per command (supervisor-built)
	EgressAllowlist Capability = "egress_allowlist" // a per-connection egress allowlist (supervisor-built)
	HostMounts      Capability = "host_mounts"      // host paths bound into the sandbox, read-only where asked (mechanism-built)
)

// Known lists every capability name.
var Known = []Capability{
	ResourceLimits, MemoryCap, PidsCap, CPUCap, ProcessSeparation,
	FilesystemConfinement, PrivilegeSeparation, NetworkRestriction,
	SyscallFilter, Landlock, DiskQuota, TimeBudget, EgressAllowlist, HostMounts,
}

// DefaultRequired is what a mechanism that does not declare its
// requirements requires: every name a host can provide. TimeBudget,
// EgressAllowlist and HostMounts are left out because no host provides them (gating on them
// would refuse everything, forever).
var DefaultRequired = []Capability{
	ResourceLimits, MemoryCap, PidsCap, CPUCap, ProcessSeparation,
	FilesystemConfinement, PrivilegeSeparation, NetworkRestriction,
	SyscallFilter, Landlock, DiskQuota,
}

// Report is one capability's verdict on this host.
type Report struct {
	Name      Capability `json:"name"`
	Available bool       `json:"available"`
	// Detail says why it is unavailable (always set then) or, when
	// available, the evidence the probe saw.
	Detail string `json:"detail"`
}

// Prober answers whether the host provides a capability. Probe never
// panics; an unknown name is unavailable with a detail naming the
// vocabulary.
type Prober interface {
	Probe(ctx context.Context, c Capability) Report
}

// LimitCapabilities returns the capabilities the non-zero limits, the
// egress policy and the mounts of spec need.
func LimitCapabilities(spec Spec) []Capability {
	var cs []Capability
	if spec.MemoryBytes > 0 {
		cs = append(cs, MemoryCap)
	}
	if spec.Pids > 0 {
		cs = append(cs, PidsCap)
	}
	if spec.CPUMillis > 0 {
		cs = append(cs, CPUCap)
	}
	if spec.DiskBytes > 0 {
		cs = append(cs, DiskQuota)
	}
	if spec.WallClock > 0 {
		cs = append(cs, TimeBudget)
	}
	if len(spec.Egress) > 0 || spec.Network == NetworkEgress {
		cs = append(cs, EgressAllowlist)
	}
	return append(cs, mountCapabilities(spec)...)
}

// Gate decides whether m may launch spec on this host. It returns nil or an
// *UnavailableError listing every missing capability:
//
//   - each capability a limit of spec needs (LimitCapabilities) that m does
//     not guarantee is missing ("not enforced by mechanism");
//   - the rest of what m requires, plus the limit capabilities, minus what m
//     constructs, is probed on the host (all of it, no early stop), and each
//     unavailable one is missing with the probe's reason.
//
// Constructed names are never probed. Mechanisms call Gate at Provision and
// at Start.
func Gate(ctx context.Context, m Mechanism, spec Spec, p Prober) error {
	if p == nil {
		p = HostProber()
	}
	guaranteed := Guaranteed(m)
	constructed := Constructed(m)
	var missing []Report
	need := Required(m)
	for _, c := range LimitCapabilities(spec) {
		if !slices.Contains(guaranteed, c) {
			detail := fmt.Sprintf("not enforced by mechanism %s, so the limit cannot be applied", m.Name())
			if c == HostMounts {
				detail = fmt.Sprintf("mechanism %s cannot bind host paths into a sandbox, so Spec.Mounts cannot be honoured", m.Name())
			}
			missing = append(missing, Report{Name: c, Detail: detail})
			continue
		}
		if !slices.Contains(need, c) {
			need = append(need, c)
		}
	}
	for _, c := range need {
		if slices.Contains(constructed, c) {
			continue
		}
		if r := p.Probe(ctx, c); !r.Available {
			if r.Detail == "" {
				r.Detail = "unavailable (no detail given by the probe)"
			}
			r.Name = c
			missing = append(missing, r)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &UnavailableError{Mechanism: m.Name(), Missing: missing}
}

// CachingProber remembers each verdict of an underlying Prober for the
// lifetime of the value (probes create namespaces and cgroups; a process
// asks once). Safe for concurrent use.
type CachingProber struct {
	P  Prober
	mu sync.Mutex
	m  map[Capability]Report
}

// Probe returns the cached verdict, probing on first use.
func (c *CachingProber) Probe(ctx context.Context, name Capability) Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.m[name]; ok {
		return r
	}
	r := c.P.Probe(ctx, name)
	if ctx.Err() != nil && !r.Available {
		return r // do not cache a verdict cut short by the caller
	}
	if c.m == nil {
		c.m = map[Capability]Report{}
	}
	c.m[name] = r
	return r
}

var (
	hostOnce   sync.Once
	hostCached *CachingProber
)

// HostProber returns the process-wide caching prober of this host. Its
// verdicts of available are also kept for the rest of the boot in a
// BootCache at DefaultBootCachePath, so that short-lived processes do not
// probe the host on every start.
func HostProber() Prober {
	hostOnce.Do(func() {
		hostCached = &CachingProber{P: &BootCache{Path: DefaultBootCachePath(), P: NewHostProber()}}
	})
	return hostCached
}

// ProbeAll probes every Known capability.
func ProbeAll(ctx context.Context, p Prober) []Report {
	out := make([]Report, 0, len(Known))
	for _, c := range Known {
		out = append(out, p.Probe(ctx, c))
	}
	return out
}
