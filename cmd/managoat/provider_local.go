package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/doctor"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/oci"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// current is the invocation's globals, read by provider builders.
var current = &globals{provider: defaultProvider, mechanism: defaultMechanism}

func init() {
	registerProvider("local", func() (sandbox.Provider, error) {
		return local.New(local.Config{MechanismName: current.mechanism, LazySupervisor: current.ephemeral, Ephemeral: current.ephemeral,
			JournalRetention: current.retention})
	})
	register("doctor", "[flags]", "Show what this host can isolate, with the evidence", cmdDoctor)
}

// noteNoIsolation says, once, that a sandbox about to be made on the
// trusted mechanism isolates nothing: its commands run as this process's
// user (root, often) on this host, with its files and network.
func noteNoIsolation(g *globals, p sandbox.Provider) {
	if p.Name() != local.Name || g.mechanism != "trusted" {
		return
	}
	who := fmt.Sprintf("uid %d", os.Geteuid())
	if os.Geteuid() == 0 {
		who = "root (uid 0)"
	}
	noteOnce("--mechanism trusted isolates nothing: the sandbox's commands run as " + who + " on this host, with its files and network (the jail, the default, isolates them)")
}

func cmdDoctor(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		r, err := doctor.Default(ctx)
		if err != nil {
			return wrap("doctor", err)
		}
		checks := oci.Doctor(ctx)
		type templates struct {
			Dir    string `json:"dir,omitempty"`
			Pinned int    `json:"pinned"`
		}
		pinned := templates{Dir: local.JailTemplateDir()}
		if pinned.Dir != "" {
			pinned.Pinned = jail.PinnedTemplates(pinned.Dir)
		}
		// The defaults this host gives (provider/local sets a cap's default
		// only where the host has the cap: not memory and pids for a user
		// without delegated cgroups).
		d := local.DefaultLimits()
		var lacking []string
		for _, c := range []struct {
			cap  mechanism.Capability
			zero func()
		}{{mechanism.PidsCap, func() { d.Pids = 0 }}, {mechanism.MemoryCap, func() { d.MemoryBytes = 0 }}} {
			if r := mechanism.HostProber().Probe(ctx, c.cap); !r.Available {
				c.zero()
				lacking = append(lacking, string(c.cap)+": "+r.Detail)
			}
		}
		defaults := map[string]int64{"pids": int64(d.Pids), "memory_bytes": d.MemoryBytes}
		diskDefault := defaultHomeQuota() // quota.go
		defaults["disk_bytes"] = diskDefault.bytes
		if of.json() {
			return snakeJSON(os.Stdout, struct {
				doctor.Report
				OCI           []oci.Check      `json:"oci"`
				JailInit      string           `json:"jail_init"`
				JailTemplates templates        `json:"jail_templates"`
				DefaultLimits map[string]int64 `json:"default_limits"`
				JailUsers     string           `json:"jail_users"`
			}{r, checks, jail.InitDescription(), pinned, defaults, jail.UsernsDescription()})
		}
		if err := r.WriteText(os.Stdout); err != nil {
			return err
		}
		for _, c := range checks {
			verdict := "can run here"
			if !c.OK {
				verdict = "cannot run here"
			}
			fmt.Printf("  %-12s %s: %s\n", c.Name, verdict, c.Why)
		}
		fmt.Printf("  jail init: %s\n", jail.InitDescription())
		fmt.Printf("  jail sandboxes' users: %s\n", jail.UsernsDescription())
		limits := []string{}
		if d.Pids > 0 {
			limits = append(limits, fmt.Sprintf("%d processes", d.Pids))
		}
		if d.MemoryBytes > 0 {
			limits = append(limits, fmt.Sprintf("%d MiB of memory", d.MemoryBytes>>20))
		}
		if len(limits) == 0 {
			limits = append(limits, "none")
		}
		fmt.Printf("  default limits of a sandbox made without any (jail, runc): %s\n", strings.Join(limits, ", "))
		for _, l := range lacking {
			fmt.Printf("    no default for %s\n", l)
		}
		fmt.Printf("  default home quota of a sandbox made without one: %s\n", diskDefault)
		if pinned.Dir != "" {
			fmt.Printf("  jail tree templates pinned in %s: %d\n", pinned.Dir, pinned.Pinned)
		} else {
			fmt.Println("  jail tree templates: not pinned (not root, or a binary under the temporary directory)")
		}
		return nil
	}
}
