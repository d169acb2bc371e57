package jail

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The wire protocol (request, reply) is in proto.go.

type server struct {
	cfg     launchConfig
	mu      sync.Mutex
	waiters map[int]chan unix.WaitStatus
}

// serve is the init after it dropped privileges: pid 1 of the sandbox,
// reaping every orphan and starting commands on request.
func serve(cfg launchConfig) error {
	if err := lowerNoFile(); err != nil { // helper.go
		return err
	}
	// pid 1 of a pid namespace receives from inside only the signals it
	// handles, so a workload that may signal the init (one with its uid:
	// without root, or run as uid 0) must not stop it with them. They are
	// caught and dropped, not ignored: an ignored signal stays ignored
	// across exec, so every workload would inherit SIG_IGN for TERM, INT,
	// PIPE... (a graceful terminate would then always wait out its grace);
	// a caught one is reset to its default when the workload execs. Only
	// those the Go runtime dies of need catching (each Notify costs a round
	// trip to the runtime's signal thread, ~50 µs here): USR1, USR2, PIPE,
	// ALRM, VTALRM, PROF, XCPU, XFSZ, WINCH, IO, PWR and URG reach the
	// runtime's handler and are dropped there; TSTP, TTIN, TTOU and CONT
	// keep their default action, which the kernel never applies to a
	// namespace's init for a signal sent from inside it. A workload with
	// another uid and no CAP_KILL cannot signal the init at all.
	if cfg.Rootless || cfg.UID == 0 {
		swallowed := make(chan os.Signal, 16)
		signal.Notify(swallowed, syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM,
			syscall.SIGABRT, syscall.SIGILL, syscall.SIGTRAP, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV,
			syscall.SIGSTKFLT, syscall.SIGSYS)
		go func() {
			for range swallowed {
			}
		}()
	}
	if cfg.Pids > 0 {
		prewarmThreads(8)
	}
	sigch := make(chan os.Signal, 64)
	signal.Notify(sigch, syscall.SIGCHLD)
	s := &server{cfg: cfg, waiters: map[int]chan unix.WaitStatus{}}
	go s.reap(sigch)
	lf := os.NewFile(fdListener, "control")
	l, err := net.FileListener(lf)
	lf.Close()
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	ul, ok := l.(*net.UnixListener)
	if !ok {
		return errors.New("control socket is not a unix listener")
	}
	unix.Write(fdReady, []byte("ready\n"))
	unix.Close(fdReady)
	for {
		c, err := ul.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return err
			}
			time.Sleep(10 * time.Millisecond) // e.g. EMFILE: never spin
			continue
		}
		go s.handle(c)
	}
}

// prewarmThreads makes the runtime create n OS threads now and keep them
// idle. Under a pids cap a workload can exhaust the cgroup's tasks; the Go
// runtime aborts when it cannot create a thread it needs, so the init must
// never need a new one later. Each goroutine holds its thread until all
// are held, so each gets a thread of its own.
func prewarmThreads(n int) {
	var held, wg sync.WaitGroup
	release := make(chan struct{})
	held.Add(n)
	wg.Add(n)
	for range n {
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			held.Done()
			<-release
			runtime.UnlockOSThread()
		}()
	}
	held.Wait()
	close(release)
	wg.Wait()
}

func (s *server) reap(sigch chan os.Signal) {
	for range sigch {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG|unix.WALL, nil)
			if pid <= 0 || err != nil {
				break
			}
			// A command is registered under mu with its ForkExec, so
			// its exit is never reaped before: anything not waited
			// for is an orphan, reaped and forgotten.
			s.mu.Lock()
			if ch, ok := s.waiters[pid]; ok {
				ch <- ws
				delete(s.waiters, pid)
			}
			s.mu.Unlock()
		}
	}
}

// requestBufs hold one request packet each (argv and environment can be
// large); pooled so that serving allocates, and collects, next to nothing.
var requestBufs = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

func send(c *net.UnixConn, r reply) {
	// An error quotes the request (a directory, a PATH): bounded as the
	// C init bounds it, or a reply past the socket's buffer is never sent.
	if len(r.Error) > maxErrorReply {
		r.Error = r.Error[:maxErrorReply]
	}
	c.Write(r.marshal())
}

// maxErrorReply is the longest error message a reply carries (cinit.c's
// send_reply keeps as much).
const maxErrorReply = 1024

func (s *server) handle(c *net.UnixConn) {
	defer c.Close()
	bp := requestBufs.Get().(*[]byte)
	defer requestBufs.Put(bp)
	buf := *bp
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if f, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, f...)
			}
		}
	}
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	if flags&unix.MSG_CTRUNC != 0 {
		send(c, reply{Error: "bad request: more than three descriptors"})
		return
	}
	if flags&unix.MSG_TRUNC != 0 {
		send(c, reply{Error: "bad request: over the size limit"})
		return
	}
	var req request
	if err := req.unmarshal(buf[:n]); err != nil {
		send(c, reply{Error: "bad request: " + err.Error()})
		return
	}
	if req.Ping {
		send(c, reply{Pong: true})
		return
	}
	if len(req.Argv) == 0 || len(fds) != 3 {
		send(c, reply{Error: "bad request: need argv and three descriptors"})
		return
	}
	dir := req.Dir
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		send(c, reply{Error: fmt.Sprintf("working directory %s: not a directory", dir), NotFound: true})
		return
	}
	path, err := lookPath(req.Argv[0], req.Env, dir)
	if err != nil {
		send(c, reply{Error: err.Error(), NotFound: true})
		return
	}
	// A session of its own (see cinit.c): the command cannot leave its
	// process group, nor its descendants join another's.
	pidfd := -1
	sys := &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd}
	if _, err := unix.IoctlGetTermios(fds[0], unix.TCGETS); err == nil {
		// A terminal on stdin (a PTY session) becomes the session's
		// controlling terminal, for job control, as in cinit.c.
		sys.Setctty, sys.Ctty = true, 0
	}
	if !s.cfg.Rootless {
		sys.Credential = &syscall.Credential{Uid: uint32(s.cfg.UID), Gid: uint32(s.cfg.GID), Groups: []uint32{}}
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: req.Env, Files: []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}, Sys: sys}
	ch := make(chan unix.WaitStatus, 1)
	s.mu.Lock()
	pid, err := syscall.ForkExec(path, req.Argv, attr)
	if err == nil {
		s.waiters[pid] = ch
	}
	s.mu.Unlock()
	if err != nil {
		notFound := errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.EACCES) || errors.Is(err, syscall.ENOTDIR)
		send(c, reply{Error: fmt.Sprintf("start %s: %v", path, err), NotFound: notFound})
		return
	}
	defer unix.Close(pidfd)
	for _, fd := range fds {
		unix.Close(fd)
	}
	fds = nil
	if !req.Collect {
		send(c, reply{Started: true, Pid: pid})
	}
	// kill signals the command's group and the command itself while it
	// has not been reaped: the command through its pidfd (never another
	// process with its number), the group only while the command lives.
	var killMu sync.Mutex
	reaped := false
	kill := func(sig unix.Signal) {
		killMu.Lock()
		defer killMu.Unlock()
		if !reaped && unix.PidfdSendSignal(pidfd, 0, nil, 0) == nil {
			unix.Kill(-pid, sig)
			unix.PidfdSendSignal(pidfd, sig, nil, 0)
		}
	}
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		b := make([]byte, 4096)
		for {
			n, err := c.Read(b)
			if err != nil {
				return
			}
			var r request
			if r.unmarshal(b[:n]) == nil && r.Signal > 0 {
				kill(unix.Signal(r.Signal))
			}
		}
	}()
	var ws unix.WaitStatus
	select {
	case ws = <-ch:
	case <-closed:
		if req.KillOnClose {
			kill(unix.SIGKILL)
		}
		ws = <-ch
	}
	killMu.Lock()
	reaped = true
	killMu.Unlock()
	r := reply{Exited: true, Code: ws.ExitStatus()}
	if ws.Signaled() {
		r.Sig = int(ws.Signal())
		r.Code = 128 + r.Sig
	}
	send(c, r)
}

func lookPath(file string, env []string, dir string) (string, error) {
	if strings.Contains(file, "/") {
		p := file
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if err := executable(p); err != nil {
			return "", fmt.Errorf("executable %s: %w", file, err)
		}
		return p, nil
	}
	pathEnv := ""
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathEnv = v
		}
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, file)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %s not found in PATH %s", file, pathEnv)
}

func executable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return syscall.EACCES
	}
	return nil
}
