// Package doctor reports, for this host, every capability with the probe's
// evidence and which mechanisms can run here, as data (Report, ready for
// JSON) and as text. The CLI's `managoat doctor` is one call:
//
//	err := doctor.Write(ctx, os.Stdout)
package doctor

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"text/tabwriter"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/hostfacts"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/trusted"
)

// Host describes the machine.
type Host struct {
	OS         string `json:"os"`
	Arch       string `json:"arch"`
	Kernel     string `json:"kernel"`
	Euid       int    `json:"euid"`
	CgroupMode string `json:"cgroupMode"`
}

// Verdict is whether one mechanism can run here.
type Verdict struct {
	Name string `json:"name"`
	// Runnable: the gate admits a sandbox without limits.
	Runnable bool `json:"runnable"`
	// Missing is what the gate refused for a sandbox without limits.
	Missing []mechanism.Report `json:"missing,omitempty"`
	// LimitsMissing is what it refused for a sandbox with memory, pids and
	// CPU caps and a wall-clock budget.
	LimitsMissing []mechanism.Report     `json:"limitsMissing,omitempty"`
	Required      []mechanism.Capability `json:"required"`
	Constructed   []mechanism.Capability `json:"constructed"`
	Guaranteed    []mechanism.Capability `json:"guaranteed"`
}

// Report is the doctor's finding.
type Report struct {
	Host         Host               `json:"host"`
	Capabilities []mechanism.Report `json:"capabilities"`
	// Facts are the kernel features that differ between supported hosts
	// by configuration (hostfacts), each with what depends on it.
	Facts      []hostfacts.Fact `json:"facts"`
	Mechanisms []Verdict        `json:"mechanisms"`
	// HomeQuota is how a sandbox's disk quota (Limits.DiskBytes) is
	// enforced on its home here, tried once (Default fills it).
	HomeQuota *HomeQuota `json:"homeQuota,omitempty"`
}

// HomeQuota is the jail's (and the OCI runtimes') home quota on this host:
// "project" or "loop" with the evidence of a try, or "" and why none.
type HomeQuota struct {
	Method string `json:"method"`
	Detail string `json:"detail"`
}

// limited is the Spec used to ask whether limits are enforceable.
var limited = mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 256 << 20, Pids: 256, CPUMillis: 1000, WallClock: 60e9}}

// Run probes every capability with p (nil: a fresh probe of the host, no
// verdict remembered from earlier this boot) and asks the gate about each
// mechanism.
func Run(ctx context.Context, p mechanism.Prober, mechs ...mechanism.Mechanism) Report {
	if p == nil {
		p = &mechanism.CachingProber{P: mechanism.NewHostProber()}
	}
	r := Report{Host: host(), Capabilities: mechanism.ProbeAll(ctx, p), Facts: hostfacts.All()}
	for _, m := range mechs {
		v := Verdict{Name: m.Name(), Required: mechanism.Required(m), Constructed: mechanism.Constructed(m), Guaranteed: mechanism.Guaranteed(m)}
		if v.Constructed == nil {
			v.Constructed = []mechanism.Capability{}
		}
		if v.Guaranteed == nil {
			v.Guaranteed = []mechanism.Capability{}
		}
		v.Missing = missing(mechanism.Gate(ctx, m, mechanism.Spec{}, p))
		v.Runnable = len(v.Missing) == 0
		v.LimitsMissing = missing(mechanism.Gate(ctx, m, limited, p))
		r.Mechanisms = append(r.Mechanisms, v)
	}
	return r
}

func missing(err error) []mechanism.Report {
	if err == nil {
		return nil
	}
	if u, ok := err.(*mechanism.UnavailableError); ok {
		return u.Missing
	}
	return []mechanism.Report{{Name: "gate", Detail: err.Error()}}
}

func host() Host {
	h := Host{OS: runtime.GOOS, Arch: runtime.GOARCH, Euid: os.Geteuid(), CgroupMode: "unknown"}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		h.Kernel = unix.ByteSliceToString(u.Release[:])
	}
	if l, err := mechanism.CgroupLayout(); err == nil {
		h.CgroupMode = string(l.Mode)
	}
	return h
}

// Default runs the doctor over the mechanisms of this module (jail and
// trusted), built on a throwaway state directory that is removed after.
func Default(ctx context.Context) (Report, error) {
	dir, err := os.MkdirTemp("", "managoat-doctor-")
	if err != nil {
		return Report{}, err
	}
	defer os.RemoveAll(dir)
	j, err := jail.New(jail.Config{StateDir: dir + "/jail", RunDir: dir + "/run"})
	if err != nil {
		return Report{}, err
	}
	tr, err := trusted.New(dir + "/trusted")
	if err != nil {
		return Report{}, err
	}
	r := Run(ctx, nil, j, tr)
	method, detail := j.VerifyDiskQuota(ctx)
	r.HomeQuota = &HomeQuota{Method: method, Detail: detail}
	return r, nil
}

// Write runs Default and writes its text to w.
func Write(ctx context.Context, w io.Writer) error {
	r, err := Default(ctx)
	if err != nil {
		return err
	}
	return r.WriteText(w)
}

// WriteText renders r for a terminal.
func (r Report) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "host: %s/%s kernel %s, euid %d, cgroups %s\n\n", r.Host.OS, r.Host.Arch, r.Host.Kernel, r.Host.Euid, r.Host.CgroupMode)
	fmt.Fprintln(b, "capabilities:")
	rows := make([][3]string, len(r.Capabilities))
	for i, c := range r.Capabilities {
		rows[i] = [3]string{string(c.Name), yesNo(c.Available), c.Detail}
	}
	table(b, rows)
	fmt.Fprintln(b, "\nkernel facts (these differ between hosts by configuration):")
	rows = make([][3]string, len(r.Facts))
	for i, f := range r.Facts {
		rows[i] = [3]string{string(f.Name), yesNo(f.Present), f.Detail}
	}
	table(b, rows)
	fmt.Fprintln(b, "\nmechanisms:")
	for _, m := range r.Mechanisms {
		state := "can run here"
		if !m.Runnable {
			state = "cannot run here"
		}
		fmt.Fprintf(b, "  %s: %s\n", m.Name, state)
		for _, x := range m.Missing {
			fmt.Fprintf(b, "    missing %s: %s\n", x.Name, x.Detail)
		}
		if m.Runnable {
			if len(m.LimitsMissing) == 0 {
				fmt.Fprintln(b, "    limits: memory, pids, cpu and wall clock enforceable")
			} else {
				for _, x := range m.LimitsMissing {
					fmt.Fprintf(b, "    limit refused %s: %s\n", x.Name, x.Detail)
				}
			}
		}
		fmt.Fprintf(b, "    guarantees: %s\n", join(m.Guaranteed))
	}
	if q := r.HomeQuota; q != nil {
		how := q.Method
		if how == "" {
			how = "none, homes are unbounded"
		}
		fmt.Fprintf(b, "\nhome disk quota (jail, runc; --disk): %s: %s\n", how, q.Detail)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// table writes rows as aligned, indented columns.
func table(b *strings.Builder, rows [][3]string) {
	tw := tabwriter.NewWriter(b, 0, 4, 2, ' ', 0)
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", r[0], r[1], r[2])
	}
	tw.Flush()
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "no"
}

func join(cs []mechanism.Capability) string {
	if len(cs) == 0 {
		return "nothing"
	}
	s := make([]string, len(cs))
	for i, c := range cs {
		s[i] = string(c)
	}
	return strings.Join(s, ", ")
}
