package supervisor

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Parking: suspend and resume (the freezer, or stop and start), and the
// shutdown that ends every session.

// suspend freezes the whole sandbox when the backend can (Freezer), and
// otherwise stops (SIGSTOP) each live session's process group.
func (s *server) suspend(ctx context.Context) response {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.suspendLocked(ctx)
}

// The suspended marker says how: frozen, or stopped (SIGSTOP to the
// sessions; "1" was written before there was a freeze), so that resume
// (perhaps of a later supervisor) undoes just that. A SIGCONT to the
// sessions of a frozen sandbox is not harmless: a jail session's signal
// travels to its init, and one for a command that just exited made the
// init drop the connection, its exit report with it.
const (
	suspendedFrozen  = "frozen"
	suspendedStopped = "1"
)

func (s *server) suspendLocked(ctx context.Context) response {
	marker := filepath.Join(s.dir, SuspendedName)
	// A checkpoint: a suspended sandbox may stay so across a reboot of
	// its host, so what its sessions journaled so far reaches the disk.
	for _, se := range s.live() {
		_ = se.w.Sync()
	}
	if f, ok := s.b.(Freezer); ok {
		if err := writeFileAtomic(marker, []byte(suspendedFrozen)); err != nil {
			return errResp(codeInternal, "%v", err)
		}
		err := f.Freeze(ctx)
		if err == nil {
			s.suspended = true
			return response{}
		}
		if !errors.Is(err, ErrNotSupported) {
			_ = os.Remove(marker)
			return errResp(codeUnavailable, "freeze: %v", err)
		}
	}
	if err := writeFileAtomic(marker, []byte(suspendedStopped)); err != nil {
		return errResp(codeInternal, "%v", err)
	}
	for _, se := range s.live() {
		_ = se.proc.Signal(syscall.SIGSTOP)
	}
	s.suspended = true
	return response{}
}

// resume undoes suspend, either way it went (a supervisor started again
// while the sandbox was suspended does not know which).
func (s *server) resume(ctx context.Context) response {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	return s.resumeLocked(ctx)
}

func (s *server) resumeLocked(ctx context.Context) response {
	how, _ := os.ReadFile(filepath.Join(s.dir, SuspendedName))
	if f, ok := s.b.(Freezer); ok {
		if err := f.Thaw(ctx); err != nil && !errors.Is(err, ErrNotSupported) {
			return errResp(codeUnavailable, "thaw: %v", err)
		}
	}
	if string(how) != suspendedFrozen {
		for _, se := range s.live() {
			_ = se.proc.Signal(syscall.SIGCONT)
		}
	}
	if err := os.Remove(filepath.Join(s.dir, SuspendedName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return errResp(codeInternal, "%v", err)
	}
	s.suspended = false
	return response{}
}

// shutdown kills every session, then stops (or destroys) the sandbox.
func (s *server) shutdown(ctx context.Context, destroy bool) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	if s.suspended {
		_ = s.resumeLocked(ctx) // a frozen process takes no signal
	}
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, se := range s.live() {
		wg.Add(1)
		go func() { defer wg.Done(); _ = s.kill(se, true, 0) }()
	}
	wg.Wait()
	var err error
	if destroy {
		err = s.b.Destroy(ctx)
	} else {
		err = s.b.Stop(ctx)
	}
	go s.stop()
	return err
}
