package local

import (
	"context"
	"encoding/json"
	"errors"

	"os"
	"path/filepath"
	"syscall"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/supervisor"
)

// backend adapts one mechanism sandbox to the supervisor.
type backend struct {
	m   mechanism.Mechanism
	id  string
	dir string // the sandbox's state directory
}

func (b *backend) Start(ctx context.Context) error {
	if err := b.m.Start(ctx, b.id); err != nil {
		return err
	}
	// The policy applied last wins over the one at launch.
	if pol, ok := readPolicy(b.dir); ok {
		if err := mechanism.UpdateEgress(ctx, b.m, b.id, egressEntries(pol)); err != nil && !errors.Is(err, mechanism.ErrNotSupported) {
			return err
		}
	}
	return nil
}

func (b *backend) StartProcess(ctx context.Context, s supervisor.ProcessSpec) (supervisor.Process, error) {
	spec := mechanism.ProcessSpec{Argv: s.Argv, Env: s.Env, Dir: s.Dir}
	if s.Stdin != nil {
		spec.Stdin = s.Stdin
	}
	if s.Stdout != nil {
		spec.Stdout = s.Stdout
	}
	if s.Stderr != nil {
		spec.Stderr = s.Stderr
	}
	p, err := b.m.StartProcess(ctx, b.id, spec)
	if err != nil {
		if errors.Is(err, mechanism.ErrNotRunning) {
			// Surely not started (the mechanism's contract): the
			// client starts the sandbox and spawns again.
			return nil, errors.Join(supervisor.ErrSandboxNotRunning, err)
		}
		if errors.Is(err, mechanism.ErrCouldNotRun) && !errors.Is(err, mechanism.ErrNotRunning) && !errors.Is(err, mechanism.ErrNotFound) {
			return nil, errors.Join(supervisor.ErrCouldNotRun, err)
		}
		return nil, err
	}
	return proc{p}, nil
}

// OpenTerminal opens a TTY session's terminal in the sandbox's own
// devpts where the mechanism has one (supervisor.Terminals).
func (b *backend) OpenTerminal(ctx context.Context) (master, slave *os.File, err error) {
	t, ok := b.m.(mechanism.Terminals)
	if !ok {
		return nil, nil, mechanism.ErrNotSupported
	}
	return t.OpenTerminal(ctx, b.id)
}

func (b *backend) UpdateEgress(ctx context.Context, allow []string) error {
	return notSupported(mechanism.UpdateEgress(ctx, b.m, b.id, allow))
}

func (b *backend) Freeze(ctx context.Context) error {
	if f, ok := b.m.(mechanism.Freezer); ok {
		return notSupported(f.Freeze(ctx, b.id))
	}
	return supervisor.ErrNotSupported
}

func (b *backend) Thaw(ctx context.Context) error {
	if f, ok := b.m.(mechanism.Freezer); ok {
		return notSupported(f.Thaw(ctx, b.id))
	}
	return supervisor.ErrNotSupported
}

// notSupported marks the mechanism's ErrNotSupported for the supervisor.
func notSupported(err error) error {
	if errors.Is(err, mechanism.ErrNotSupported) {
		return errors.Join(supervisor.ErrNotSupported, err)
	}
	return err
}

func (b *backend) Stop(ctx context.Context) error    { return b.m.Stop(ctx, b.id) }
func (b *backend) Destroy(ctx context.Context) error { return b.m.Destroy(ctx, b.id) }

type proc struct{ p mechanism.Process }

func (p proc) Pid() int                        { return p.p.Pid() }
func (p proc) Signal(sig syscall.Signal) error { return p.p.Signal(sig) }
func (p proc) Wait() (int, int, error) {
	st, err := p.p.Wait()
	var le *mechanism.LimitExceededError
	if errors.As(err, &le) {
		// The exit state is filled in; the code is the real one, and the
		// supervisor says on the session's stderr which limit stopped it.
		err = &supervisor.LimitError{Limit: string(le.Limit), Evidence: le.Evidence}
	} else if err != nil && errors.Is(err, mechanism.ErrLimitExceeded) {
		err = nil
	}
	return st.Code, int(st.Signal), err
}

// policy file: the last applied allowlist, so a restarted sandbox keeps it.
const policyName = "policy.json"

func readPolicy(dir string) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join(dir, policyName))
	if err != nil {
		return nil, false
	}
	var allow []string
	if json.Unmarshal(b, &allow) != nil {
		return nil, false
	}
	return allow, true
}
