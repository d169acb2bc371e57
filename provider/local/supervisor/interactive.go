package supervisor

import (
	"context"
	"errors"
	"syscall"

	"github.com/creack/pty"
)

// signal sends req.Signal to session req.ID's process group.
func (s *server) signal(req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		return errResp(codeExited, "session %q is not live", req.ID)
	}
	sig := syscall.Signal(req.Signal)
	if sig <= 0 || sig > 64 {
		return errResp(codeInvalid, "signal %d is not a signal", req.Signal)
	}
	sess.stdinMu.Lock()
	finished := sess.finished
	sess.stdinMu.Unlock()
	if finished {
		return errResp(codeExited, "session %q exited", req.ID)
	}
	if err := sess.proc.Signal(sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return errResp(codeExited, "session %q exited", req.ID)
		}
		return errResp(codeInternal, "signal: %v", err)
	}
	return response{}
}

// resize sets session req.ID's terminal to req.Rows×req.Cols; the
// command's process group gets SIGWINCH from the kernel.
func (s *server) resize(req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		return errResp(codeExited, "session %q is not live", req.ID)
	}
	if !sess.tty {
		return errResp(codeInvalid, "session %q has no terminal", req.ID)
	}
	if req.Rows <= 0 || req.Cols <= 0 || req.Rows > 65535 || req.Cols > 65535 {
		return errResp(codeInvalid, "window size %dx%d", req.Rows, req.Cols)
	}
	sess.stdinMu.Lock()
	defer sess.stdinMu.Unlock()
	if sess.stdinRef == nil || sess.finished {
		return errResp(codeExited, "session %q exited", req.ID)
	}
	if err := pty.Setsize(sess.stdinRef, &pty.Winsize{Rows: uint16(req.Rows), Cols: uint16(req.Cols)}); err != nil {
		return errResp(codeInternal, "resize: %v", err)
	}
	return response{}
}

// Signal sends sig to session id's process group.
func (c Client) Signal(ctx context.Context, id string, sig syscall.Signal) error {
	_, err := c.call(ctx, request{Op: "signal", ID: id, Signal: int(sig)})
	return err
}

// Resize sets session id's terminal window size.
func (c Client) Resize(ctx context.Context, id string, rows, cols int) error {
	_, err := c.call(ctx, request{Op: "resize", ID: id, Rows: rows, Cols: cols})
	return err
}
