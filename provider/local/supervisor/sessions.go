package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/local/journal"
)

// Sessions: spawn (with its stdio, pipes or a terminal), wait, stdin,
// termination and the list of live sessions.

func (s *server) spawn(ctx context.Context, req *request) response {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errResp(codeInvalid, "empty command")
	}
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return errResp(codeUnavailable, "supervisor shutting down")
	}
	// No freeze may land between here and the start (the request would
	// wait on a frozen sandbox); a suspended one is resumed first, as
	// the provider does before a spawn.
	s.opMu.RLock()
	for s.suspended {
		s.opMu.RUnlock()
		s.opMu.Lock()
		r := response{}
		if s.suspended {
			r = s.resumeLocked(ctx)
		}
		s.opMu.Unlock()
		if r.Err != nil {
			return r
		}
		s.opMu.RLock()
	}
	defer s.opMu.RUnlock()
	id, dir, err := s.newSessionDir()
	if err != nil {
		return errResp(codeInternal, "%v", err)
	}
	fail := func(code string, err error) response {
		_ = os.RemoveAll(dir)
		return errResp(code, "%v", err)
	}
	w, err := journal.Create(filepath.Join(dir, journalName))
	if err != nil {
		return fail(codeInternal, err)
	}
	capBytes := ReadRetention(s.dir).MaxSessionBytes
	if err := w.SetCap(capBytes); err != nil {
		capBytes = 0
		if s.log != nil {
			s.log.Warn("session journal not capped", "err", err)
		}
	}
	io, err := openStdio(req, s.terminal(ctx))
	if err != nil {
		w.Close()
		return fail(codeInternal, err)
	}
	spec := ProcessSpec{Argv: req.Argv, Env: req.Env, Dir: req.Dir, Stdout: io.outW, Stderr: io.errW}
	if io.inR != nil {
		spec.Stdin = io.inR
	}
	proc, err := s.b.StartProcess(ctx, spec)
	// The write ends stay open until the process was waited for: a
	// mechanism that copies through its own pipes (oci's stderr filter)
	// writes into them until then.
	if io.inR != nil && !io.tty {
		io.inR.Close()
	}
	if err != nil {
		io.closeAll()
		w.Close()
		switch {
		case errors.Is(err, ErrSandboxNotRunning):
			return fail(codeNotRunning, err)
		case errors.Is(err, ErrCouldNotRun):
			return fail(codeCouldNotRun, err)
		}
		return fail(codeUnavailable, err)
	}
	outR, errR, outW, errW, inW := io.outR, io.errR, io.outW, io.errW, io.inW
	line := req.Command
	if line == "" {
		line = strings.Join(req.Argv, " ")
	}
	meta := SessionMeta{ID: id, Command: line, Argv: req.Argv, Budget: req.Budget,
		CreatedAt: time.Now().UTC(), Pid: proc.Pid(), StartTicks: startTicks(proc.Pid()), Stdin: req.Stdin, TTY: req.TTY}
	sess := &session{log: s.log, id: id, dir: dir, meta: meta, w: w, proc: proc, stdin: inW, stdinRef: inW, stdinWired: req.Stdin || req.TTY, tty: req.TTY,
		changed: make(chan struct{}), exited: make(chan struct{}),
		capBytes: max(capBytes, 0), readers: map[*int]int64{}, moved: make(chan struct{}), ended: make(chan struct{})}
	if err := writeFileAtomic(filepath.Join(dir, metaName), meta.marshal()); err != nil {
		// A session nobody can find again is not one to report: end
		// the process now (a full disk, say) and say why.
		_ = proc.Signal(syscall.SIGKILL)
		_, _, _ = proc.Wait()
		io.closeAll()
		w.Close()
		return fail(codeUnavailable, fmt.Errorf("record session %s: %w", id, err))
	}
	// The session's directory itself (its entry in sessions/) is durable
	// too: meta.json's rename synced the directory it is in, not this one.
	if err := syncDir(filepath.Dir(dir)); err != nil && s.log != nil {
		s.log.Warn("session directory not synced", "id", id, "err", err)
	}
	if req.Budget > 0 {
		sess.budget = time.AfterFunc(req.Budget, func() {
			sess.overtime.Store(true)
			_ = s.kill(sess, true, 0)
		})
	}
	s.mu.Lock()
	s.sessions[id] = sess
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.run(sess, outR, errR, outW, errW)
	}()
	return response{ID: id, Pid: proc.Pid()}
}

// waitPoll is the longest a wait request is held without news.
const waitPoll = 20 * time.Second

func (s *server) wait(req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		if validID(req.ID) {
			if _, err := os.Stat(filepath.Join(s.dir, SessionsDir, req.ID, journalName)); err == nil {
				return response{Live: false}
			}
		}
		return errResp(codeNotFound, "no session %q", req.ID)
	}
	t := time.NewTimer(waitPoll)
	defer t.Stop()
	for {
		sess.mu.Lock()
		ch, done := sess.changed, sess.done
		sess.mu.Unlock()
		size := sess.w.Size()
		if size > req.Offset || done {
			return response{Size: size, Done: done, Live: true}
		}
		select {
		case <-ch:
		case <-t.C:
			return response{Size: size, Live: true}
		case <-s.quit:
			return errResp(codeUnavailable, "supervisor shutting down")
		}
	}
}

func (s *server) writeStdin(req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		return errResp(codeExited, "session %q is not live", req.ID)
	}
	sess.stdinMu.Lock()
	defer sess.stdinMu.Unlock()
	if sess.finished {
		return errResp(codeExited, "session %q exited", req.ID)
	}
	if !sess.stdinWired {
		return errResp(codeStdinClosed, "session %q was started without stdin", req.ID)
	}
	if sess.stdin == nil {
		return errResp(codeStdinClosed, "stdin of session %q is closed", req.ID)
	}
	if _, err := sess.stdin.Write(req.Data); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) || errors.Is(err, os.ErrDeadlineExceeded) {
			return errResp(codeExited, "session %q exited", req.ID)
		}
		return errResp(codeInternal, "%v", err)
	}
	return response{}
}

func (s *server) closeStdin(req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		return errResp(codeExited, "session %q is not live", req.ID)
	}
	sess.stdinMu.Lock()
	defer sess.stdinMu.Unlock()
	if sess.tty {
		// A terminal has no end of file to close: EOT (^D) makes a
		// reading program see one, as at a keyboard.
		if sess.stdin != nil && !sess.finished {
			_, _ = sess.stdin.Write([]byte{4})
		}
		return response{}
	}
	if sess.stdin != nil {
		sess.stdin.Close()
		sess.stdin = nil
	}
	return response{}
}

// killGrace bounds the wait for a SIGKILLed session to be reaped.
const killGrace = 5 * time.Second

func (s *server) terminate(ctx context.Context, req *request) response {
	sess := s.lookup(req.ID)
	if sess == nil {
		if validID(req.ID) {
			d := filepath.Join(s.dir, SessionsDir, req.ID)
			if _, err := os.Stat(filepath.Join(d, journalName)); err == nil {
				// A session of an earlier supervisor: make sure its process is gone.
				killOrphan(d)
				return response{}
			}
		}
		return errResp(codeNotFound, "no session %q", req.ID)
	}
	// A frozen process takes no signal: a suspended sandbox is resumed
	// for the kill, and suspended again after it.
	s.opMu.Lock()
	wasSuspended := s.suspended
	if wasSuspended {
		if r := s.resumeLocked(ctx); r.Err != nil {
			s.opMu.Unlock()
			return r
		}
	}
	s.opMu.Unlock()
	err := s.kill(sess, req.Force, req.Timeout)
	if wasSuspended {
		if r := s.suspend(ctx); r.Err != nil && err == nil {
			return r
		}
	}
	if err != nil {
		return errResp(codeUnconfirmed, "%v", err)
	}
	return response{}
}

func (s *server) kill(sess *session, force bool, grace time.Duration) error {
	select {
	case <-sess.exited:
		return nil
	default:
	}
	if !force {
		_ = sess.proc.Signal(syscall.SIGTERM)
		_ = sess.proc.Signal(syscall.SIGCONT)
		t := time.NewTimer(grace)
		select {
		case <-sess.exited:
			t.Stop()
			return nil
		case <-t.C:
		}
	}
	_ = sess.proc.Signal(syscall.SIGKILL)
	t := time.NewTimer(killGrace)
	defer t.Stop()
	select {
	case <-sess.exited:
		return nil
	case <-t.C:
		return fmt.Errorf("session %s not confirmed dead %v after SIGKILL", sess.id, killGrace)
	}
}

func (s *server) live() []*session {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*session
	for _, se := range s.sessions {
		select {
		case <-se.exited:
		default:
			out = append(out, se)
		}
	}
	return out
}

// stdio is a session's descriptors: pipes, or a pty for a TTY session
// (then the slave is stdin, stdout and stderr, the master both the output
// and the input end).
type stdio struct {
	tty                              bool
	outR, outW, errR, errW, inR, inW *os.File
}

// terminal opens a TTY session's terminal: in the sandbox's devpts when
// the backend can, else on the host's (logged).
func (s *server) terminal(ctx context.Context) func() (master, slave *os.File, err error) {
	return func() (*os.File, *os.File, error) {
		if t, ok := s.b.(Terminals); ok {
			m, sl, err := t.OpenTerminal(ctx)
			if err == nil {
				return m, sl, nil
			}
			if s.log != nil {
				s.log.Warn("terminal opened on the host's devpts: the sandbox's refused", "err", err)
			}
		}
		return pty.Open()
	}
}

func openStdio(req *request, openTerminal func() (master, slave *os.File, err error)) (*stdio, error) {
	if req.TTY {
		master, slave, err := openTerminal()
		if err != nil {
			return nil, err
		}
		rows, cols := req.Rows, req.Cols
		if rows <= 0 {
			rows = 24
		}
		if cols <= 0 {
			cols = 80
		}
		_ = pty.Setsize(master, &pty.Winsize{Rows: uint16(rows), Cols: uint16(cols)})
		return &stdio{tty: true, outR: master, outW: slave, errW: slave, inR: slave, inW: master}, nil
	}
	io := &stdio{}
	var err error
	if io.outR, io.outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	if io.errR, io.errW, err = os.Pipe(); err != nil {
		io.closeAll()
		return nil, err
	}
	_, _ = unix.FcntlInt(io.outR.Fd(), unix.F_SETPIPE_SZ, 1<<20)
	if req.Stdin {
		if io.inR, io.inW, err = os.Pipe(); err != nil {
			io.closeAll()
			return nil, err
		}
	}
	return io, nil
}

func (io *stdio) closeAll() {
	for _, f := range []*os.File{io.outR, io.outW, io.errR, io.errW, io.inR, io.inW} {
		if f != nil {
			f.Close()
		}
	}
}
