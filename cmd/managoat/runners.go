package main

import (
	"flag"
	"fmt"
	"strings"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
)

// fleetFlags are the runner daemon's labels and capacity overrides.
type fleetFlags struct {
	labels       map[string]string
	cpus         int
	memory, disk int64
	maxSandboxes *int
}

// runnerFleetFlags adds --label, --capacity-cpus, --capacity-memory,
// --capacity-disk and --max-sandboxes to the runner daemon's flags.
func runnerFleetFlags(fs *flag.FlagSet) *fleetFlags {
	f := &fleetFlags{labels: map[string]string{}}
	fs.Func("label", "a label of this runner, key=value (repeatable): the platform places by them (create --runner-selector)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", s)
		}
		if err := wire.CheckLabel(k, v); err != nil {
			return err
		}
		if len(f.labels) >= wire.MaxLabels {
			return fmt.Errorf("more than %d labels", wire.MaxLabels)
		}
		f.labels[k] = v
		return nil
	})
	fs.Func("capacity-cpus", "CPUs to report to the platform instead of this host's", func(s string) error {
		m, err := parseCPU(s)
		if err != nil {
			return err
		}
		f.cpus = max(m/1000, 1)
		return nil
	})
	fs.Func("capacity-memory", "memory to report to the platform instead of this host's (e.g. 16G)", func(s string) error {
		v, err := parseSize(s)
		f.memory = v
		return err
	})
	fs.Func("capacity-disk", "disk for homes to report instead of the homes' file system's size (e.g. 200G)", func(s string) error {
		v, err := parseSize(s)
		f.disk = v
		return err
	})
	f.maxSandboxes = fs.Int("max-sandboxes", 0, "the most sandboxes the platform may place on this runner (0: no bound)")
	return f
}

func (f *fleetFlags) apply(c *runner.Config) {
	if len(f.labels) > 0 {
		c.Labels = f.labels
	}
	c.CapacityCPUs, c.CapacityMemory, c.CapacityDisk, c.MaxSandboxes = f.cpus, f.memory, f.disk, max(*f.maxSandboxes, 0)
}
