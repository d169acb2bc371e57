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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
