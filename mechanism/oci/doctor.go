package oci

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// ParseName parses a mechanism name of the CLI: "oci" (runc), "oci:runsc",
// "oci:<runtime name or path>", and the Name() forms "oci/runc",
// "oci/runsc". ok is false for a name that is not an OCI mechanism.
func ParseName(name string) (runtime string, ok bool) {
	switch {
	case name == "oci":
		return "runc", true
	case strings.HasPrefix(name, "oci:"):
		runtime = strings.TrimPrefix(name, "oci:")
	case strings.HasPrefix(name, "oci/"):
		runtime = strings.TrimPrefix(name, "oci/")
	default:
		return "", false
	}
	if runtime == "" {
		return "", false
	}
	return runtime, true
}

// Check is one line of a doctor report.
type Check struct {
	Name string // "oci/runc", "oci/runsc"
	OK   bool
	Why  string // the evidence when OK, the reason otherwise
}

// Doctor checks oci/runc and oci/runsc (see Available).
func Doctor(ctx context.Context) []Check {
	var out []Check
	for _, rt := range []string{"runc", "runsc"} {
		ok, why := Available(ctx, rt)
		out = append(out, Check{Name: "oci/" + rt, OK: ok, Why: why})
	}
	return out
}

// Available says whether the OCI mechanism on runtime (a name or a path)
// can run here, and why: the runtime is installed, the caller is root (the
// mechanism drives rootful containers), and a real container runs /bin/true
// (availability is evidence, not configuration). It takes a few hundred
// milliseconds and leaves nothing behind.
func Available(ctx context.Context, runtime string) (ok bool, why string) {
	rt := resolveRuntime(runtime)
	p := rt.path()
	if p == "" {
		return false, fmt.Sprintf("%s is not installed (%s)", rt.name, rt.installHint())
	}
	version := "unknown version"
	if out, err := exec.CommandContext(ctx, p, "--version").Output(); err == nil {
		version = strings.SplitN(strings.TrimSpace(string(out)), "\n", 2)[0]
	}
	if os.Geteuid() != 0 {
		return false, fmt.Sprintf("%s (%s) found, but the oci mechanism needs root (it runs rootful containers with cgroup limits)", version, p)
	}
	dir, err := os.MkdirTemp("", "managoat-oci-doctor-")
	if err != nil {
		return false, err.Error()
	}
	defer os.RemoveAll(dir)
	m, err := New(Config{Runtime: runtime, StateDir: dir, Prober: okProber{}})
	if err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id := "doctor-" + randHex(4)
	began := time.Now()
	err = m.Provision(ctx, id, mechanism.Spec{})
	if err == nil {
		err = m.Start(ctx, id)
	}
	var c mechanism.Completion
	if err == nil {
		c, err = m.Execute(ctx, id, []string{"/bin/true"}, mechanism.ExecOptions{Timeout: 10 * time.Second})
	}
	took := time.Since(began)
	if derr := m.Destroy(context.Background(), id); derr != nil && err == nil {
		err = derr
	}
	if err == nil && c.ExitStatus != 0 {
		err = fmt.Errorf("/bin/true exited %d: %s", c.ExitStatus, c.Stderr)
	}
	if err != nil {
		var ue *mechanism.UnavailableError
		if errors.As(err, &ue) {
			return false, fmt.Sprintf("%s: %v", version, ue)
		}
		return false, fmt.Sprintf("%s (%s): a test container failed: %v", version, filepath.Base(p), err)
	}
	return true, fmt.Sprintf("%s: created, started and ran /bin/true in a container in %v", version, took.Round(time.Millisecond))
}

// okProber answers the doctor's gate: a Spec without limits probes nothing
// (everything the container needs it constructs).
type okProber struct{}

func (okProber) Probe(_ context.Context, c mechanism.Capability) mechanism.Report {
	return mechanism.Report{Name: c, Available: true, Detail: "not probed by the doctor"}
}
