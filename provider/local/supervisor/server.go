package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/provider/local/journal"
)

// Backend runs processes inside one sandbox. provider/local adapts a
// mechanism.Mechanism to it; tests use plain processes.
type Backend interface {
	// Start makes sure the sandbox is running (a no-op when it is).
	Start(ctx context.Context) error
	// StartProcess starts a process inside the running sandbox, handing it
	// the given files directly.
	StartProcess(ctx context.Context, spec ProcessSpec) (Process, error)
	// UpdateEgress replaces the egress allowlist; empty denies all.
	UpdateEgress(ctx context.Context, allow []string) error
	// Stop ends every process of the sandbox, keeping its files.
	Stop(ctx context.Context) error
	// Destroy releases the sandbox.
	Destroy(ctx context.Context) error
}

// Terminals is a Backend whose sandbox has a devpts of its own: a TTY
// session's terminal is opened there (mechanism.Terminals), so it has a
// name inside the sandbox. Without it, or when it fails, the terminal is
// the host's.
type Terminals interface {
	OpenTerminal(ctx context.Context) (master, slave *os.File, err error)
}

// Freezer is a Backend that can freeze every process of its sandbox at
// once (the jail's cgroup freezer), which suspend prefers to stopping the
// sessions one process group at a time. ErrNotSupported from Freeze means
// it cannot for this sandbox.
type Freezer interface {
	Freeze(ctx context.Context) error
	Thaw(ctx context.Context) error
}

// ProcessSpec describes one session's process.
type ProcessSpec struct {
	Argv   []string
	Env    []string
	Dir    string
	Stdin  *os.File // nil: empty stdin
	Stdout *os.File
	Stderr *os.File
}

// Process is a session's process.
type Process interface {
	Pid() int
	// Signal signals the process's whole process group.
	Signal(sig syscall.Signal) error
	// Wait returns the exit code (128+signal when a signal ended it) and
	// the signal.
	Wait() (code, signal int, err error)
}

// Errors a Backend may wrap so the client sees the right class.
var (
	// ErrCouldNotRun: the command did not run (binary missing, ...).
	ErrCouldNotRun = errors.New("supervisor: could not run")
	// ErrNotSupported: the backend cannot do this (egress on trusted).
	ErrNotSupported = errors.New("supervisor: not supported")
	// ErrSandboxNotRunning: the sandbox does not run, so the command
	// surely did not start (the client starts the sandbox and asks again).
	ErrSandboxNotRunning = errors.New("supervisor: sandbox not running")
	// ErrBusy: another supervisor serves this sandbox.
	ErrBusy = errors.New("supervisor: another supervisor holds the sandbox")
)

// File names inside a sandbox's directory.
const (
	SocketName    = "sup.sock"
	LockName      = "sup.lock"
	LogName       = "sup.log"
	SessionsDir   = "sessions"
	SuspendedName = "suspended"
	journalName   = "journal"
	metaName      = "meta.json"
	exitName      = "exit"
)

// Config configures Serve.
type Config struct {
	// Dir is the sandbox's state directory.
	Dir     string
	Backend Backend
	Logger  *slog.Logger
	// Ready is called once: with nil when the socket accepts connections,
	// or with the error that stops Serve before that.
	Ready func(error)
	// WatchInterval is how often the supervisor checks that its directory
	// still exists (it exits when the sandbox was destroyed) where the
	// kernel does not notify it of the directory's changes (F_NOTIFY);
	// 0 means 2 s.
	WatchInterval time.Duration
}

type server struct {
	cfg  Config
	dir  string
	b    Backend
	log  *slog.Logger
	ln   net.Listener
	quit chan struct{}

	mu       sync.Mutex
	sessions map[string]*session
	conns    map[net.Conn]struct{}
	nextID   int
	closing  bool
	quitOnce sync.Once
	wg       sync.WaitGroup
	// opMu serializes suspend, resume and shutdown; a spawn holds it for
	// reading, so no freeze lands between its look and its start.
	opMu      sync.RWMutex
	suspended bool
}

type session struct {
	id   string
	dir  string
	meta SessionMeta
	w    *journal.Writer
	proc Process

	stdinMu    sync.Mutex
	stdin      *os.File
	stdinWired bool
	finished   bool     // the process exited (guarded by stdinMu)
	tty        bool     // stdin is a pty master: closing it is an EOT
	stdinRef   *os.File // the same file as stdin, never reset (for deadlines)

	mu      sync.Mutex
	changed chan struct{}
	done    bool
	exited  chan struct{}

	budget   *time.Timer // kills the command at the end of its budget
	overtime atomic.Bool // it did

	log    *slog.Logger // the supervisor's
	losing atomic.Bool  // output is being dropped (a full disk)

	// Followers' positions (readers.go): while one follows, the journal
	// cap drops nothing it has not read; the pumps wait instead.
	capBytes int64 // the journal's cap (0: none)
	rmu      sync.Mutex
	readers  map[*int]int64 // a follower's connection → its offset
	moved    chan struct{}  // closed and replaced when a follower moves or leaves
	ended    chan struct{}  // closed when the process exited: the pumps hold no more
}

func (s *session) notify() {
	s.mu.Lock()
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()
}

// Serve runs the supervisor of one sandbox until the sandbox is shut down
// or destroyed, or ctx is done.
func Serve(ctx context.Context, cfg Config) (err error) {
	ready := cfg.Ready
	readyOnce := sync.Once{}
	signalReady := func(e error) {
		readyOnce.Do(func() {
			if ready != nil {
				ready(e)
			}
		})
	}
	defer func() { signalReady(err) }()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.WatchInterval == 0 {
		cfg.WatchInterval = 2 * time.Second
	}
	lock, err := os.OpenFile(filepath.Join(cfg.Dir, LockName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return ErrBusy
		}
		return fmt.Errorf("supervisor: lock: %w", err)
	}
	dirSt, err := os.Stat(cfg.Dir)
	if err != nil {
		return err
	}
	s := &server{cfg: cfg, dir: cfg.Dir, b: cfg.Backend, log: cfg.Logger, quit: make(chan struct{}),
		sessions: map[string]*session{}, conns: map[net.Conn]struct{}{}}
	if err := os.MkdirAll(filepath.Join(s.dir, SessionsDir), 0o700); err != nil {
		return err
	}
	s.reapOrphans()
	s.prune()
	if _, err := os.Stat(filepath.Join(s.dir, SuspendedName)); err == nil {
		s.suspended = true
	}
	if err := s.b.Start(ctx); err != nil {
		return err
	}
	sock := filepath.Join(s.dir, SocketName)
	_ = os.Remove(sock)
	ln, err := listenUnix(sock)
	if err != nil {
		return err
	}
	s.ln = ln
	signalReady(nil)

	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.watch(ctx, dirSt, lock)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.acceptLoop()
	}()
	select {
	case <-s.quit:
	case <-ctx.Done():
		s.shutdown(context.Background(), false)
	}
	s.wg.Wait()
	return nil
}

func (s *server) stop() {
	s.quitOnce.Do(func() {
		s.mu.Lock()
		s.closing = true
		for c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.ln.Close()
		close(s.quit)
	})
}

// watch exits the supervisor once its directory is gone or replaced: the
// sandbox was destroyed. It waits on the kernel rather than a timer, so an
// idle supervisor is not woken (1,000 idle sandboxes were a quarter of a
// core on a 2 s poll): a directory notification (dnotify, F_NOTIFY, which
// has no per-user limit, unlike inotify's 128 instances) on its own
// directory fires when one of its entries is removed or renamed, as a
// removal of the directory removes them first, the lock file the
// supervisor holds among them; it then checks the directory as the poll
// did, and that the lock file is still linked. Its own directory and not
// the parent: a notification there woke every supervisor at each destroy
// (1,000 sandboxes removed made a load of 150). A directory renamed away
// is not seen: Destroy renames it and then tells the supervisor to shut
// down, and Sweep finishes a Destroy cut short in between. Where F_NOTIFY
// is refused it polls every Config.WatchInterval.
func (s *server) watch(ctx context.Context, orig os.FileInfo, lock *os.File) {
	gone := func() bool {
		st, err := os.Stat(s.dir)
		if err != nil || !os.SameFile(st, orig) {
			return true
		}
		var ls unix.Stat_t
		return unix.Fstat(int(lock.Fd()), &ls) == nil && ls.Nlink == 0
	}
	var wake <-chan struct{}
	if notes, stop, err := notifyDir(s.dir); err == nil {
		defer stop()
		wake = notes
	} else {
		s.log.Debug("no directory notifications; polling", "err", err)
		t := time.NewTicker(s.cfg.WatchInterval)
		defer t.Stop()
		ch := make(chan struct{}, 1)
		go func() {
			for {
				select {
				case <-s.quit:
					return
				case <-ctx.Done():
					return
				case <-t.C:
					select {
					case ch <- struct{}{}:
					default:
					}
				}
			}
		}()
		wake = ch
	}
	// A removal that began before the notification was set is seen here.
	check := func() bool {
		if gone() {
			s.log.Info("sandbox directory gone; shutting down")
			go s.shutdown(context.Background(), true)
			return true
		}
		return false
	}
	if check() {
		return
	}
	for {
		select {
		case <-s.quit:
			return
		case <-ctx.Done():
			return
		case <-wake:
			if check() {
				return
			}
		}
	}
}

// dnotify's flags (linux/fcntl.h), which x/sys/unix does not name.
const (
	dnDelete    = 0x00000008
	dnRename    = 0x00000010
	dnMultishot = 0x80000000
)

// notifyDir asks the kernel for a SIGIO whenever an entry of dir is
// removed or renamed (dnotify), and returns a channel that receives once
// for one or more of them, and the function that stops it. Several
// watchers in one process (tests) each see every SIGIO and check their
// own directory.
func notifyDir(dir string) (<-chan struct{}, func(), error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, unix.SIGIO)
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_NOTIFY, dnDelete|dnRename|dnMultishot); err != nil {
		signal.Stop(sig)
		unix.Close(fd)
		return nil, nil, fmt.Errorf("F_NOTIFY: %w", err)
	}
	out := make(chan struct{}, 1)
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			case <-sig:
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	stop := func() {
		unix.Close(fd) // the notification goes with its descriptor
		close(done)
		<-finished
		signal.Stop(sig)
	}
	return out, stop, nil
}

func (s *server) acceptLoop() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

func (s *server) serveConn(c net.Conn) {
	dec := json.NewDecoder(c)
	enc := json.NewEncoder(c)
	// A connection that follows a session (wait, at) is one of its
	// readers until it closes.
	conn := new(int)
	var following []*session
	defer func() {
		for _, sess := range following {
			sess.leave(conn)
		}
	}()
	for {
		var req request
		if err := dec.Decode(&req); err != nil {
			return
		}
		if req.Op == "wait" || req.Op == "at" {
			if sess := s.lookup(req.ID); sess != nil && sess.at(conn, req.Offset) {
				following = append(following, sess)
			}
		}
		resp, after := s.handle(&req)
		if err := enc.Encode(resp); err != nil {
			return
		}
		if after != nil {
			after()
			return
		}
	}
}

func errResp(code string, format string, a ...any) response {
	return response{Err: &wireError{Code: code, Msg: fmt.Sprintf(format, a...)}}
}

func (s *server) handle(req *request) (response, func()) {
	ctx := context.Background()
	switch req.Op {
	case "ping":
		return response{Pid: os.Getpid()}, nil
	case "spawn":
		return s.spawn(ctx, req), nil
	case "wait":
		return s.wait(req), nil
	case "at":
		// A follower's position, recorded by serveConn.
		if s.lookup(req.ID) == nil {
			return response{Live: false}, nil
		}
		return response{Live: true}, nil
	case "stdin":
		return s.writeStdin(req), nil
	case "close_stdin":
		return s.closeStdin(req), nil
	case "signal":
		return s.signal(req), nil
	case "resize":
		return s.resize(req), nil
	case "terminate":
		return s.terminate(ctx, req), nil
	case "start":
		if err := s.b.Start(ctx); err != nil {
			return errResp(codeUnavailable, "%v", err), nil
		}
		return response{}, nil
	case "suspend":
		return s.suspend(ctx), nil
	case "resume":
		return s.resume(ctx), nil
	case "policy":
		if err := s.b.UpdateEgress(ctx, req.Allow); err != nil {
			if errors.Is(err, ErrNotSupported) {
				return errResp(codeUnsupported, "%v", err), nil
			}
			return errResp(codeInternal, "%v", err), nil
		}
		return response{}, nil
	case "shutdown":
		err := s.shutdown(ctx, req.Destroy)
		if err != nil {
			return errResp(codeInternal, "%v", err), s.stop
		}
		return response{}, s.stop
	}
	return errResp(codeInvalid, "unknown op %q", req.Op), nil
}

func (s *server) lookup(id string) *session {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

func validID(id string) bool {
	if id == "" || len(id) > 256 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// newSessionDir claims the next session id with an atomic mkdir.
func (s *server) newSessionDir() (string, string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nextID == 0 {
		ents, _ := os.ReadDir(filepath.Join(s.dir, SessionsDir))
		for _, e := range ents {
			if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "s")); err == nil && n > s.nextID {
				s.nextID = n
			}
		}
	}
	for range 1000 {
		s.nextID++
		id := "s" + strconv.Itoa(s.nextID)
		d := filepath.Join(s.dir, SessionsDir, id)
		err := os.Mkdir(d, 0o700)
		if err == nil {
			return id, d, nil
		}
		if !errors.Is(err, os.ErrExist) {
			return "", "", err
		}
	}
	return "", "", errors.New("supervisor: no free session id")
}

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

// reapOrphans kills the processes of sessions an earlier supervisor left
// without an exit record (it was killed): their output pipes are gone, so
// they can never be journaled again.
func (s *server) reapOrphans() {
	ents, _ := os.ReadDir(filepath.Join(s.dir, SessionsDir))
	for _, e := range ents {
		d := filepath.Join(s.dir, SessionsDir, e.Name())
		if _, err := os.Stat(filepath.Join(d, exitName)); err == nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, metaName)); err != nil {
			// never started: a half-made session directory
			_ = os.RemoveAll(d)
			continue
		}
		killOrphan(d)
		// What the killed supervisor journaled is in the page cache
		// (a kill does not lose it) but maybe not on the disk: sync it
		// before the mark that says the session is over.
		_ = journal.SyncFile(filepath.Join(d, journalName))
		// Ended with no exit status: listed as lost, not running.
		_ = writeFileAtomic(filepath.Join(d, exitName), []byte("lost"))
	}
}

// KillOrphan kills the process of session id under dir when it is still
// the process the session recorded (its pid and start time match). It is
// for a session whose supervisor is gone.
func KillOrphan(dir, id string) {
	if validID(id) {
		killOrphan(filepath.Join(dir, SessionsDir, id))
	}
}

func killOrphan(d string) {
	b, err := os.ReadFile(filepath.Join(d, metaName))
	if err != nil {
		return
	}
	var m SessionMeta
	if json.Unmarshal(b, &m) != nil || m.Pid <= 1 {
		return
	}
	if m.StartTicks != 0 && startTicks(m.Pid) == m.StartTicks {
		_ = syscall.Kill(-m.Pid, syscall.SIGKILL)
		_ = syscall.Kill(m.Pid, syscall.SIGKILL)
	}
}

// startTicks reads a process's start time from /proc (0 when unknown).
func startTicks(pid int) uint64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// writeFileAtomic replaces path with data so that a reader, a later
// supervisor or a host back from a crash finds the old content or the
// new, whole, never a torn or empty file: the data goes to path.tmp,
// which is synced to disk before it is renamed over path, and the
// directory is synced after, so the rename itself is durable when this
// returns. One temporary name per path: a writer killed midway leaves at
// most one path.tmp, which the next write truncates (every state file has
// one writer at a time: the supervisor's lock, or opMu).
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

// syncDir makes dir's entries durable (a file renamed or created in it).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadSessions lists the sessions recorded under a sandbox directory,
// oldest first. It reads the disk only, so it works without a supervisor.
func ReadSessions(dir string) ([]SessionMeta, error) {
	ents, err := os.ReadDir(filepath.Join(dir, SessionsDir))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var out []SessionMeta
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, SessionsDir, e.Name(), metaName))
		if err != nil {
			continue
		}
		var m SessionMeta
		if json.Unmarshal(b, &m) == nil {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(out[i].ID, "s"))
		b, _ := strconv.Atoi(strings.TrimPrefix(out[j].ID, "s"))
		return a < b
	})
	return out, nil
}

// SessionState is session id's state under a sandbox directory, from its
// exit mark: running (no mark yet), exited with its code, or lost (it
// ended with no exit status: its supervisor or the sandbox's init died).
func SessionState(dir, id string) (state string, code int) {
	b, err := os.ReadFile(filepath.Join(dir, SessionsDir, id, exitName))
	if err != nil {
		return "running", 0
	}
	if c, err := strconv.Atoi(string(b)); err == nil {
		return "exited", c
	}
	return "lost", 0
}

// JournalPath is the journal file of session id under a sandbox directory.
func JournalPath(dir, id string) string { return filepath.Join(dir, SessionsDir, id, journalName) }

// HasSession reports whether session id is recorded under dir.
func HasSession(dir, id string) bool {
	if !validID(id) {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, SessionsDir, id, metaName))
	return err == nil
}

// listenUnix listens on path; a path longer than a sockaddr allows is
// reached through /proc/self/fd of its directory.
func listenUnix(path string) (net.Listener, error) {
	addr, closeDir, err := sockAddr(path)
	if err != nil {
		return nil, err
	}
	defer closeDir()
	return net.Listen("unix", addr)
}

func sockAddr(path string) (string, func(), error) {
	if len(path) < 100 {
		return path, func() {}, nil
	}
	d, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return "", nil, err
	}
	return fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), filepath.Base(path)), func() { d.Close() }, nil
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
