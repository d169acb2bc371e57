package jail

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
)

// freezeTimeout bounds the wait for the kernel to report a cgroup frozen
// (a process in an uninterruptible sleep delays it).
const freezeTimeout = 10 * time.Second

// Freeze implements mechanism.Freezer: every process of the sandbox, its
// init included, stops where it is (the cgroup v2 freezer; on a host
// without one, SIGSTOP to each process of the sandbox's cgroups, which
// reaches the processes a session's own process group would miss). The
// state records it: Status answers Running without asking the frozen
// init, and the next Stop, Destroy or Start ends it.
func (j *Jail) Freeze(ctx context.Context, id string) error { return j.freeze(ctx, id, true) }

// Thaw implements mechanism.Freezer: the processes Freeze stopped go on.
func (j *Jail) Thaw(ctx context.Context, id string) error { return j.freeze(ctx, id, false) }

func (j *Jail) freeze(ctx context.Context, id string, on bool) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	dir := j.dir(id)
	if _, err := os.Stat(dir); err != nil {
		return fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
	}
	unlock, err := flock.Lock(ctx, dir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := readState(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return err
	}
	if !alive(st) {
		if on {
			return fmt.Errorf("%w: %s", mechanism.ErrNotRunning, id)
		}
		return nil
	}
	if !on && !st.Frozen {
		return nil
	}
	g := j.group(st)
	if g == nil {
		return fmt.Errorf("%w: freeze: the sandbox has no cgroup", mechanism.ErrNotSupported)
	}
	fctx, cancel := context.WithTimeout(ctx, freezeTimeout)
	defer cancel()
	if err := g.Freeze(fctx, on); err != nil {
		if on {
			_ = g.Freeze(context.WithoutCancel(ctx), false) // not half frozen
		}
		return err
	}
	st.Frozen = on
	return writeState(dir, st)
}
