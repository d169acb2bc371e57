package oci

import (
	"context"
	"errors"
	"fmt"

	"github.com/managoat/managoat/mechanism"
)

// Freeze implements mechanism.Freezer with the runtime's pause: runc
// freezes the container's cgroup, runsc stops the sandbox's tasks. Every
// process of the container stops where it is, one that left its session's
// process group included. Status reports a paused container running (its
// processes are kept). Stop and Destroy need nothing more: both runtimes'
// delete --force end a paused container (mechanismtest's freeze check
// stops a frozen sandbox).
func (m *Mechanism) Freeze(ctx context.Context, id string) error { return m.pause(ctx, id, true) }

// Thaw implements mechanism.Freezer: the runtime's resume.
func (m *Mechanism) Thaw(ctx context.Context, id string) error { return m.pause(ctx, id, false) }

func (m *Mechanism) pause(ctx context.Context, id string, on bool) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	unlock := m.lock(id)
	defer unlock()
	if _, err := m.open(id); err != nil {
		return err
	}
	if m.rt.path() == "" {
		return m.refuseRuntime()
	}
	st, err := m.state(ctx, id)
	switch {
	case errors.Is(err, errNoContainer):
		if on {
			return fmt.Errorf("%w: %s", mechanism.ErrNotRunning, id)
		}
		return nil
	case err != nil:
		return err
	}
	switch {
	case on && st.Status == "running":
		_, err = m.run(ctx, "pause", id)
	case !on && st.Status == "paused":
		_, err = m.run(ctx, "resume", id)
	case on && st.Status != "paused":
		return fmt.Errorf("%w: %s is %s", mechanism.ErrNotRunning, id, st.Status)
	}
	return err
}
