package mechanism_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/mechanism"
)

// hostWithout is a Prober of a host lacking some capabilities.
type hostWithout map[mechanism.Capability]string

func (h hostWithout) Probe(_ context.Context, c mechanism.Capability) mechanism.Report {
	if why, ok := h[c]; ok {
		return mechanism.Report{Name: c, Detail: why}
	}
	return mechanism.Report{Name: c, Available: true}
}

// Example shows the gate refusing a Spec: every missing capability is
// listed with its reason, and a limit the mechanism does not enforce is
// refused rather than dropped.
func ExampleGate() {
	var m silent // declares nothing: requires everything, guarantees nothing
	host := hostWithout{mechanism.Landlock: "Landlock is disabled at boot", mechanism.DiskQuota: "no quotas on /"}
	spec := mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 64 << 20}}
	err := mechanism.Gate(context.Background(), m, spec, host)
	var u *mechanism.UnavailableError
	if errors.As(err, &u) {
		for _, r := range u.Missing {
			fmt.Printf("%s: %s\n", r.Name, r.Detail)
		}
	}
	// Output:
	// memory_cap: not enforced by mechanism silent, so the limit cannot be applied
	// landlock: Landlock is disabled at boot
	// disk_quota: no quotas on /
}

// A BootCache in front of a prober: the second process of the same boot
// (here, a second BootCache on the same file) trusts what the first found
// available and probes again only what was not.
func ExampleBootCache() {
	dir, err := os.MkdirTemp("", "bootcache")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "probes.json")
	probes := 0
	host := proberFunc(func(c mechanism.Capability) mechanism.Report {
		probes++
		if c == mechanism.DiskQuota {
			return mechanism.Report{Name: c, Detail: "no quotas on /"}
		}
		return mechanism.Report{Name: c, Available: true, Detail: "probed"}
	})
	ctx := context.Background()
	for range 2 { // two short-lived processes
		c := &mechanism.BootCache{Path: path, P: host}
		c.Probe(ctx, mechanism.Landlock)
		c.Probe(ctx, mechanism.DiskQuota)
	}
	fmt.Println("probes:", probes)
	// Output:
	// probes: 3
}

type proberFunc func(mechanism.Capability) mechanism.Report

func (f proberFunc) Probe(_ context.Context, c mechanism.Capability) mechanism.Report { return f(c) }
