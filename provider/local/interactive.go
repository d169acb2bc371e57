package local

import (
	"context"
	"errors"
	"syscall"

	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

var (
	_ sandbox.CommandSignaler = (*Provider)(nil)
	_ sandbox.TTYResizer      = (*Provider)(nil)
)

// SignalCommand sends sig to the command's process group, in the sandbox.
func (p *Provider) SignalCommand(ctx context.Context, c *sandbox.Command, sig syscall.Signal) error {
	if d, ok := c.Private.(*directState); ok && c.Provider == Name {
		d.mu.Lock()
		closed := d.closed
		d.mu.Unlock()
		if closed && c.Finished() {
			return sandbox.ErrCommandExited
		}
		if err := d.proc.Signal(sig); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return sandbox.ErrCommandExited
			}
			return &sandbox.ProviderError{Provider: Name, Reason: "signal", Err: err}
		}
		return nil
	}
	st, err := commandState(c)
	if err != nil {
		return err
	}
	err = supervisor.Client{Dir: st.dir}.Signal(ctx, st.id, sig)
	if errors.Is(err, supervisor.ErrNoSupervisor) {
		return sandbox.ErrCommandExited
	}
	return supErr(err)
}

// ResizeTTY sets a PTY session's window size.
func (p *Provider) ResizeTTY(ctx context.Context, c *sandbox.Command, rows, cols int) error {
	if _, ok := c.Private.(*directState); ok && c.Provider == Name {
		return sandbox.Invalid("tty", "the command has no terminal")
	}
	st, err := commandState(c)
	if err != nil {
		return err
	}
	err = supervisor.Client{Dir: st.dir}.Resize(ctx, st.id, rows, cols)
	if errors.Is(err, supervisor.ErrNoSupervisor) {
		return sandbox.ErrCommandExited
	}
	return supErr(err)
}
