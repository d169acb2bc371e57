package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// runtimeInfo is the OCI runtime a mechanism drives.
type runtimeInfo struct {
	name   string // "runc", "runsc", or the basename of a path
	arg    string // as configured: a name looked up on PATH, or a path
	gvisor bool
}

func resolveRuntime(arg string) runtimeInfo {
	name := filepath.Base(arg)
	return runtimeInfo{name: name, arg: arg, gvisor: strings.Contains(name, "runsc")}
}

// path returns the runtime binary, or "" when it is not installed. It is
// looked up on each call, so installing the runtime needs no restart.
func (r runtimeInfo) path() string {
	if strings.Contains(r.arg, "/") {
		if st, err := os.Stat(r.arg); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return r.arg
		}
		return ""
	}
	for _, p := range []string{r.arg, "/usr/sbin/" + r.arg, "/usr/bin/" + r.arg, "/usr/local/sbin/" + r.arg, "/usr/local/bin/" + r.arg} {
		if lp, err := exec.LookPath(p); err == nil {
			return lp
		}
	}
	return ""
}

// installHint says how to install the runtime on Debian.
func (r runtimeInfo) installHint() string {
	switch {
	case r.gvisor:
		return "apt-get install runsc"
	case r.name == "runc":
		return "apt-get install runc"
	}
	return "install an OCI runtime at " + r.arg
}

// globalArgs are the runtime's flags before the subcommand.
func (m *Mechanism) globalArgs() []string {
	a := []string{"--root", m.root}
	if m.rt.gvisor {
		// ptrace: the platform that works without a usable KVM; network
		// none: only a loopback inside the sandbox; oci-seccomp: apply the
		// bundle's seccomp filter inside the sandbox too.
		a = append(a, "--platform=ptrace", "--network=none", "--oci-seccomp")
	}
	return a
}

// command returns the runtime invocation; it runs in a session of its own
// so a daemon it leaves (runsc's sandbox and gofer) belongs to no caller's
// session or process group.
func (m *Mechanism) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, m.rt.path(), append(m.globalArgs(), args...)...)
	cmd.Env = []string{"PATH=" + "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// runtimeTimeout bounds a runtime subcommand when the caller set no deadline.
const runtimeTimeout = 2 * time.Minute

// run runs a short runtime subcommand and returns its stdout; an error
// carries its stderr.
func (m *Mechanism) run(ctx context.Context, args ...string) ([]byte, error) {
	if m.rt.path() == "" {
		return nil, m.refuseRuntime()
	}
	// A wedged runtime (a sandbox that stopped answering its control
	// socket) must not hang the caller forever.
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, runtimeTimeout)
		defer cancel()
	}
	cmd := m.command(ctx, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.Bytes(), &runtimeError{args: args, err: err, stderr: strings.TrimSpace(errb.String())}
	}
	return out.Bytes(), nil
}

type runtimeError struct {
	args   []string
	err    error
	stderr string
}

func (e *runtimeError) Error() string {
	return fmt.Sprintf("oci runtime %s: %v: %s", strings.Join(e.args, " "), e.err, e.stderr)
}

func (e *runtimeError) Unwrap() error { return e.err }

// errNoContainer says the runtime does not know the container.
var errNoContainer = errors.New("oci: no such container")

// containerState is the runtime's `state` (and an entry of `list`).
type containerState struct {
	ID     string `json:"id"`
	Pid    int    `json:"pid"`
	Status string `json:"status"`
	Bundle string `json:"bundle"`
}

// state asks the runtime for the container's state; errNoContainer when
// the runtime's own list (which succeeded) does not have it.
func (m *Mechanism) state(ctx context.Context, id string) (*containerState, error) {
	out, err := m.run(ctx, "state", id)
	if err == nil {
		var st containerState
		if jerr := json.Unmarshal(out, &st); jerr != nil {
			return nil, fmt.Errorf("oci: %s state %s: %w", m.rt.name, id, jerr)
		}
		return &st, nil
	}
	// state fails for a missing container with runtime-specific words;
	// the list is the unambiguous answer.
	list, lerr := m.list(ctx)
	if lerr != nil {
		return nil, err
	}
	for _, c := range list {
		if c.ID == id {
			return nil, err
		}
	}
	return nil, errNoContainer
}

// list asks the runtime for every container in this mechanism's root.
func (m *Mechanism) list(ctx context.Context) ([]containerState, error) {
	out, err := m.run(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	out = bytes.TrimSpace(out)
	if len(out) == 0 || string(out) == "null" {
		return nil, nil
	}
	var list []containerState
	if err := json.Unmarshal(out, &list); err != nil {
		return nil, fmt.Errorf("oci: %s list: %w", m.rt.name, err)
	}
	return list, nil
}

// deleteContainer kills and deletes the container; a container the
// runtime does not know is fine.
func (m *Mechanism) deleteContainer(ctx context.Context, id string) error {
	if m.rt.path() == "" {
		return nil
	}
	_, err := m.run(ctx, "delete", "--force", id)
	if err == nil {
		return nil
	}
	if _, serr := m.state(ctx, id); errors.Is(serr, errNoContainer) {
		return nil
	}
	// runc refuses to delete a container whose init is still dying; kill
	// it and retry for a bounded time.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		_, _ = m.run(ctx, "kill", id, "KILL")
		time.Sleep(50 * time.Millisecond)
		if _, err = m.run(ctx, "delete", "--force", id); err == nil {
			return nil
		}
		if _, serr := m.state(ctx, id); errors.Is(serr, errNoContainer) {
			return nil
		}
	}
	return err
}
