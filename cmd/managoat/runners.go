package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// fleetFlags are the runner daemon's labels and capacity overrides.
type fleetFlags struct {
	labels       map[string]string
	cpus         int
	memory, disk int64
	maxSandboxes *int
	defaultDisk  int64
}

// runnerFleetFlags adds --label, --capacity-cpus, --capacity-memory,
// --capacity-disk, --max-sandboxes and --default-disk to the runner
// daemon's flags.
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
	fs.Func("default-disk", "the home quota of a sandbox created without a disk limit (e.g. 10G; at most half the homes' free space), so no tenant's home is unbounded on this host", func(s string) error {
		v, err := parseSize(s)
		f.defaultDisk = v
		return err
	})
	return f
}

func (f *fleetFlags) apply(c *runner.Config) {
	if len(f.labels) > 0 {
		c.Labels = f.labels
	}
	c.CapacityCPUs, c.CapacityMemory, c.CapacityDisk, c.MaxSandboxes = f.cpus, f.memory, f.disk, max(*f.maxSandboxes, 0)
	c.DefaultDiskBytes = f.defaultDisk
}

func init() {
	register("runners", "[ls] | cordon NAME | uncordon NAME | drain NAME [--wait] [--timeout D] | label NAME KEY=VALUE...",
		"List the platform's runners (labels, capacity, what they hold) and cordon, drain, uncordon or label one", cmdRunners)
}

// fleetClient is the platform client of MANAGOAT_URL and MANAGOAT_API_KEY.
func fleetClient() (*client.Client, error) {
	p, err := platformClient("")()
	if err != nil {
		return nil, err
	}
	return p.(*client.Client), nil
}

func cmdRunners(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	wait := fs.Bool("wait", false, "drain: do not park the runner's sandboxes, only wait until none is left (their users move or destroy them)")
	timeout := fs.Duration("timeout", 10*time.Minute, "drain: give up after this long (the runner stays draining)")
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 2)
		if err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		sub := "ls"
		if len(pos) > 0 {
			sub = pos[0]
		}
		need := func() (string, error) {
			if len(pos) < 2 {
				return "", usageError{msg: "runners " + sub + ": missing NAME"}
			}
			return pos[1], nil
		}
		if sub != "label" {
			if err := noMore(rest); err != nil {
				return err
			}
		}
		c, err := fleetClient()
		if err != nil {
			return err
		}
		defer c.Close()
		show := func(v api.RunnerView, verb string) error {
			if of.json() {
				return json.NewEncoder(os.Stdout).Encode(v)
			}
			fmt.Printf("runner/%s %s\n", v.Name, verb)
			return nil
		}
		switch sub {
		case "ls":
			if len(pos) > 1 {
				return usageError{msg: "runners ls takes no NAME"}
			}
			rs, err := c.Runners(ctx)
			if err != nil {
				return wrap("runners", err)
			}
			if of.json() {
				return json.NewEncoder(os.Stdout).Encode(rs)
			}
			printRunners(os.Stdout, rs)
			return nil
		case "cordon", "uncordon":
			name, err := need()
			if err != nil {
				return err
			}
			f := c.Cordon
			if sub == "uncordon" {
				f = c.Uncordon
			}
			v, err := f(ctx, name)
			if err != nil {
				return wrap("runners "+sub, err)
			}
			return show(v, sub+"ed")
		case "label":
			name, err := need()
			if err != nil {
				return err
			}
			if len(rest) == 0 {
				return usageError{msg: "runners label NAME KEY=VALUE...: no label given (KEY= removes one)"}
			}
			labels := map[string]string{}
			for _, kv := range rest {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					return usageError{msg: fmt.Sprintf("runners label: %q is not KEY=VALUE", kv)}
				}
				labels[k] = v
			}
			v, err := c.LabelRunner(ctx, name, labels)
			if err != nil {
				return wrap("runners label", err)
			}
			return show(v, "labeled")
		case "drain":
			name, err := need()
			if err != nil {
				return err
			}
			return drainRunner(ctx, c, name, *wait, *timeout, of.json())
		}
		return usageError{msg: fmt.Sprintf("runners: unknown subcommand %q (ls, cordon, uncordon, drain, label)", clipArg(sub))}
	}
}

func clipArg(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// drainRunner drains until no sandbox is left on the runner, printing
// each pass's progress on stderr when it changed (the outcome, or with
// --json each pass's status, on stdout). With wait the sandboxes are
// only waited for (their users destroy or move them), else parked.
func drainRunner(ctx context.Context, c *client.Client, name string, wait bool, timeout time.Duration, asJSON bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		st, err := c.Drain(ctx, name, wait)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("runners drain %s: gave up after %v; the runner stays draining (runners uncordon %s ends it)", name, timeout, name)
			}
			return wrap("runners drain", err)
		}
		if asJSON {
			if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
				return err
			}
		} else {
			var b strings.Builder
			done := len(st.Sandboxes) - st.Remaining
			verb := "parked"
			if wait {
				verb = "gone or parked"
			}
			fmt.Fprintf(&b, "runner/%s draining: %d of %d sandboxes %s", st.Runner.Name, done, len(st.Sandboxes), verb)
			for _, it := range st.Sandboxes {
				if it.Action != "parked" && it.Action != "already_parked" {
					fmt.Fprintf(&b, "\n  %s: %s", it.Name, it.Action)
					if it.Detail != "" {
						fmt.Fprintf(&b, " (%s)", it.Detail)
					}
				}
			}
			if s := b.String(); s != last {
				fmt.Fprintln(os.Stderr, s) // progress on stderr; stdout keeps the outcome
				last = s
			}
		}
		if st.Remaining == 0 {
			if !asJSON {
				fmt.Printf("runner/%s drained\n", st.Runner.Name)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("runners drain %s: %d sandboxes left after %v; the runner stays draining (runners uncordon %s ends it)", name, st.Remaining, timeout, name)
		case <-time.After(time.Second):
		}
	}
}

// printRunners is the runners table.
func printRunners(w io.Writer, rs []api.RunnerView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSTATUS\tLABELS\tCPUS\tMEMORY\tDISK\tLOAD\tSANDBOXES\tASKED")
	for _, r := range rs {
		status := "offline"
		if r.Online {
			status = "online"
		}
		if r.Schedule != "" {
			status += "," + r.Schedule
		}
		labels := map[string]string{}
		for k, v := range r.Labels {
			labels[k] = v
		}
		for k, v := range r.OperatorLabels {
			labels[k] = v
		}
		ls := wire.FormatLabels(labels)
		if ls == "" {
			ls = "-"
		}
		cpus, mem, disk, load, boxes := "-", "-", "-", "-", fmt.Sprint(r.Used.Sandboxes)
		if c := r.Capacity; c != nil {
			cpus = fmt.Sprint(c.CPUs)
			mem = humanBytes(c.MemoryAvailable) + "/" + humanBytes(c.MemoryBytes)
			disk = humanBytes(c.DiskFree) + "/" + humanBytes(c.DiskBytes)
			load = fmt.Sprintf("%.2f", c.Load1)
			boxes = fmt.Sprintf("%d (%d running)", c.Sandboxes, c.Running)
			if c.MaxSandboxes > 0 {
				boxes = fmt.Sprintf("%d/%d (%d running)", c.Sandboxes, c.MaxSandboxes, c.Running)
			}
		}
		asked := fmt.Sprintf("%s mem, %dm cpu, %s disk", humanBytes(r.Used.MemoryBytes), r.Used.CPUMillis, humanBytes(r.Used.DiskBytes))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, status, ls, cpus, mem, disk, load, boxes, asked)
	}
	tw.Flush()
}

// humanBytes prints n in the largest binary unit under it (1.5G).
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprint(n)
	}
	f, u := float64(n), 0
	for f >= unit && u < 4 {
		f /= unit
		u++
	}
	return fmt.Sprintf("%.1f%c", f, "KMGT"[u-1])
}

// runnerSelectorFlags are create's and run's placement flags.
type runnerSelectorFlags struct {
	selector   string
	preferLast bool
}

func (r *runnerSelectorFlags) add(fs *flag.FlagSet) {
	fs.StringVar(&r.selector, "runner-selector", "", "place the sandbox on a platform runner whose labels match, e.g. gpu=h100 or 'zone in (eu,us)' (runner provider)")
	fs.BoolVar(&r.preferLast, "prefer-last-runner", false, "place the sandbox on the runner of your latest sandbox when it fits (runner provider)")
}

// context carries the flags to the platform client's create; they mean
// nothing to another provider.
func (r *runnerSelectorFlags) context(ctx context.Context, provider string) (context.Context, error) {
	if r.selector == "" && !r.preferLast {
		return ctx, nil
	}
	if provider != client.Name && !strings.HasPrefix(provider, client.Name+":") {
		return ctx, &sandbox.InvalidError{Reason: "runner_selector", Msg: fmt.Sprintf("provider %s has no runners to choose from; --runner-selector and --prefer-last-runner place sandboxes through a platform (MANAGOAT_URL and MANAGOAT_API_KEY)", provider)}
	}
	return client.WithPlacement(ctx, r.selector, r.preferLast), nil
}
