package egress

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Rootless publishing (see the package doc's Rootless). A socket keeps
// the network namespace it was created in: connect(2) routes in that
// namespace whichever process calls it. So a manager that cannot enter a
// sandbox's namespace (setns into a user namespace refuses a
// multithreaded process) reaches the sandbox's loopback through sockets
// made there: a helper that nsenter starts in the sandbox's user and
// network namespaces (as for egress) creates unconnected TCP sockets on
// request and hands each over a socket pair (SCM_RIGHTS); the manager
// connects it to 127.0.0.1:PORT itself, per accepted connection. The
// helper does nothing else: it never connects, listens or reads what
// flows, it serves one request at a time, and it exits when its end of
// the pair reads EOF (the manager closed it, or died: the kernel closes
// a dead process's descriptors) or when the sandbox's init exits (a
// pidfd the manager opened before starting it), so it outlives neither.
// One that stops serving while the init runs (killed, or a bad answer)
// is replaced, at most once per restartEvery.

// socketHelperEnv selects the socket helper role of an executed binary;
// its value is "SOCK,PIDFD": the descriptors of the socket pair's end and
// of the sandbox init's pidfd.
const socketHelperEnv = "MANAGOAT_EGRESS_SOCKET_HELPER"

// socketRequest asks the helper for one socket; the answer is "OK" with
// the socket, or "ERR message".
const socketRequest = "socket"

// helperAnswerTimeout bounds the wait for the helper's answer (it does
// nothing slower than socket(2)); one that does not answer in time is
// killed and the factory is broken.
const helperAnswerTimeout = 5 * time.Second

func init() {
	if v := os.Getenv(socketHelperEnv); v != "" {
		os.Exit(socketHelper(v))
	}
}

// restartEvery bounds how often a socket factory starts its helper
// again after it stopped serving (killed, or broken by a bad answer)
// while the sandbox's init runs.
const restartEvery = time.Second

// socketFactory is the manager's side of a socket helper: a portDialer
// for a rootless sandbox. It holds the sandbox init's pidfd, so a helper
// that stopped serving while the init runs is started again (at most
// once per restartEvery), and none once the init is gone.
type socketFactory struct {
	pid     int
	pidfd   int // the sandbox init's; closed by close
	closing atomic.Bool
	cur     atomic.Pointer[helperProc] // the helper; replaced under mu

	mu      sync.Mutex // one request at a time; guards the rest
	closed  bool
	broken  error     // why the current helper serves no more, or nil
	started time.Time // when the current helper was started
}

// helperProc is one run of the socket helper.
type helperProc struct {
	cmd    *exec.Cmd
	stderr *boundedBuffer
	fd     int           // our end of its socket pair, closed under the factory's mu
	exited chan struct{} // closed once it was waited for
	werr   error         // its exit, once exited is closed
}

// startSocketFactory starts a socket helper in the namespaces of pid, a
// process in a user namespace this process's user owns, and checks that
// it answers.
func startSocketFactory(pid int) (*socketFactory, error) {
	if nsenterPath() == "" {
		_, why := RootlessSupported()
		return nil, errors.New(why)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("the sandbox's init %d: %w", pid, err)
	}
	f := &socketFactory{pid: pid, pidfd: pidfd}
	f.mu.Lock()
	err = f.startLocked()
	f.mu.Unlock()
	if err != nil {
		unix.Close(pidfd)
		return nil, err
	}
	// The first socket proves the helper is in place (nsenter could
	// enter the namespaces, the binary runs there).
	s, err := f.socket()
	if err != nil {
		f.close()
		return nil, err
	}
	unix.Close(s)
	return f, nil
}

// startLocked starts a helper and makes it the current one.
func (f *socketFactory) startLocked() error {
	f.started = time.Now()
	nsenter := nsenterPath()
	if nsenter == "" {
		_, why := RootlessSupported()
		return errors.New(why)
	}
	// The helper gets its own copy of the pidfd (an os.File closes
	// what it holds).
	pidfd, err := unix.FcntlInt(uintptr(f.pidfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return err
	}
	pidf := os.NewFile(uintptr(pidfd), "sandbox init")
	defer pidf.Close()
	exe, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer exe.Close()
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	theirs := os.NewFile(uintptr(pair[1]), "socket helper")
	// The helper's end is its fd 3, the binary its fd 4, the pidfd its fd 5.
	cmd := exec.Command(nsenter, "--target", strconv.Itoa(f.pid), "--user", "--net", "--preserve-credentials",
		"--", "/proc/self/fd/4")
	cmd.Env = []string{socketHelperEnv + "=3,5", "GOMAXPROCS=1"}
	cmd.ExtraFiles = []*os.File{theirs, exe, pidf}
	h := &helperProc{cmd: cmd, stderr: &boundedBuffer{max: 4096}, fd: pair[0], exited: make(chan struct{})}
	cmd.Stderr = h.stderr
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		unix.Close(pair[0])
		return fmt.Errorf("start the socket helper: %w", err)
	}
	go func() {
		h.werr = cmd.Wait()
		close(h.exited)
	}()
	_ = unix.SetsockoptTimeval(h.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: int64(helperAnswerTimeout / time.Second)})
	f.cur.Store(h)
	f.broken = nil
	return nil
}

// dialPort connects a socket made in the sandbox's network namespace to
// 127.0.0.1:port there.
func (f *socketFactory) dialPort(port int) (net.Conn, error) {
	s, err := f.socket()
	if err != nil {
		return nil, err
	}
	return connectLoopback(s, port, dialTimeout)
}

var errPublishClosed = errors.New("the published port is closed")

// socket asks the helper for a TCP socket of the sandbox's namespace.
func (f *socketFactory) socket() (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed || f.closing.Load() {
		return -1, errPublishClosed
	}
	if f.broken != nil {
		if err := f.restartLocked(); err != nil {
			return -1, err
		}
	}
	h := f.cur.Load()
	s, err := askHelper(h.fd)
	if err != nil {
		if f.closing.Load() {
			return -1, errPublishClosed
		}
		// A helper that does not answer as it should serves no more.
		_ = h.cmd.Process.Kill()
		f.broken = describeHelper(f.pid, h, err)
		return -1, f.broken
	}
	return s, nil
}

// restartLocked replaces a helper that serves no more by a new one, if
// the sandbox's init runs and the last start is restartEvery ago.
func (f *socketFactory) restartLocked() error {
	if n, _ := unix.Poll([]unix.PollFd{{Fd: int32(f.pidfd), Events: unix.POLLIN}}, 0); n > 0 {
		return fmt.Errorf("%w (the sandbox's init %d exited)", f.broken, f.pid)
	}
	if time.Since(f.started) < restartEvery {
		return f.broken
	}
	if old := f.cur.Load(); old.cmd != nil {
		_ = old.cmd.Process.Kill()
		<-old.exited
		unix.Close(old.fd)
	}
	if err := f.startLocked(); err != nil {
		// No helper until the next try.
		f.cur.Store(&helperProc{fd: -1})
		f.broken = fmt.Errorf("socket helper in the namespaces of %d: %w", f.pid, err)
		return f.broken
	}
	return nil
}

// askHelper sends a request on fd and returns the socket answered.
func askHelper(fd int) (int, error) {
	if fd < 0 {
		return -1, errors.New("no helper")
	}
	if err := unix.Sendmsg(fd, []byte(socketRequest), nil, nil, unix.MSG_NOSIGNAL); err != nil {
		return -1, err
	}
	buf := make([]byte, 512)
	oob := make([]byte, unix.CmsgSpace(4))
	var n, oobn int
	var err error
	for {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		if err == unix.EAGAIN {
			err = fmt.Errorf("no answer in %v", helperAnswerTimeout)
		}
		return -1, err
	}
	var fds []int
	if cms, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range cms {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	msg := string(buf[:n])
	if msg != "OK" || len(fds) != 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		switch {
		case n == 0:
			return -1, errors.New("the helper ended")
		case strings.HasPrefix(msg, "ERR "):
			return -1, errors.New(strings.TrimPrefix(msg, "ERR "))
		}
		return -1, fmt.Errorf("the helper answered %q with %d descriptors", msg, len(fds))
	}
	return fds[0], nil
}

// describeHelper names the helper and adds how it ended and what it
// said on its stderr.
func describeHelper(pid int, h *helperProc, err error) error {
	select {
	case <-h.exited:
		if h.werr != nil {
			err = fmt.Errorf("%w (%v)", err, h.werr)
		}
	case <-time.After(100 * time.Millisecond):
	}
	if h.stderr != nil {
		if s := strings.TrimSpace(h.stderr.String()); s != "" {
			err = fmt.Errorf("%w: %s", err, s)
		}
	}
	return fmt.Errorf("socket helper in the namespaces of %d: %w", pid, err)
}

// close ends the helper (its end reads EOF) and waits for it; one that
// does not exit in time is killed. A request under way (it holds mu) is
// woken by killing the helper it waits for.
func (f *socketFactory) close() {
	if !f.closing.CompareAndSwap(false, true) {
		return
	}
	if !f.mu.TryLock() {
		if h := f.cur.Load(); h != nil && h.cmd != nil {
			_ = h.cmd.Process.Kill()
		}
		f.mu.Lock()
	}
	f.closed = true
	h := f.cur.Load()
	if h != nil && h.fd >= 0 {
		unix.Close(h.fd)
		h.fd = -1
	}
	unix.Close(f.pidfd)
	f.mu.Unlock()
	if h == nil || h.cmd == nil {
		return
	}
	select {
	case <-h.exited:
	case <-time.After(helperAnswerTimeout):
		_ = h.cmd.Process.Kill()
		<-h.exited
	}
}

// connectLoopback connects the TCP socket s (made in a sandbox's network
// namespace) to 127.0.0.1:port, within timeout, and returns it as a
// net.Conn; s is consumed.
func connectLoopback(s, port int, timeout time.Duration) (net.Conn, error) {
	if err := unix.SetNonblock(s, true); err != nil {
		unix.Close(s)
		return nil, err
	}
	// Non-blocking, so the file is in the runtime's poller.
	f := os.NewFile(uintptr(s), "published port")
	defer f.Close()
	addr := "127.0.0.1:" + strconv.Itoa(port)
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "tcp4", Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: port},
			Err: os.NewSyscallError("connect", err)}
	}
	err := unix.Connect(s, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	if err == unix.EINPROGRESS || err == unix.EINTR {
		rc, rerr := f.SyscallConn()
		if rerr != nil {
			return nil, rerr
		}
		_ = f.SetWriteDeadline(time.Now().Add(timeout))
		err = nil
		werr := rc.Write(func(fd uintptr) bool {
			e, gerr := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_ERROR)
			switch {
			case gerr != nil:
				err = gerr
				return true
			case e != 0 && unix.Errno(e) != unix.EINPROGRESS && unix.Errno(e) != unix.EALREADY:
				err = unix.Errno(e)
				return true
			}
			if _, perr := unix.Getpeername(int(fd)); perr == nil {
				return true
			}
			return false // not yet: wait until writable
		})
		if werr != nil {
			return nil, fmt.Errorf("dial %s: %w", addr, werr)
		}
	}
	if err != nil {
		return nil, opErr(err)
	}
	_ = f.SetWriteDeadline(time.Time{})
	return net.FileConn(f)
}

// socketHelper is the helper's work, in the sandbox's user and network
// namespaces, with its socket pair's end and the init's pidfd at the
// descriptors v names.
func socketHelper(v string) int {
	a, b, _ := strings.Cut(v, ",")
	sock, err1 := strconv.Atoi(a)
	pidfd, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "socket helper: bad descriptors", v)
		return 2
	}
	buf := make([]byte, 512)
	for {
		fds := []unix.PollFd{{Fd: int32(sock), Events: unix.POLLIN}, {Fd: int32(pidfd), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, -1); err != nil {
			if err == unix.EINTR {
				continue
			}
			fmt.Fprintln(os.Stderr, "socket helper: poll:", err)
			return 1
		}
		if fds[1].Revents != 0 {
			return 0 // the sandbox's init exited
		}
		if fds[0].Revents == 0 {
			continue
		}
		n, err := unix.Read(sock, buf)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil || n == 0 {
			return 0 // the manager closed its end, or died
		}
		var answer string
		var rights []byte
		s := -1
		if string(buf[:n]) != socketRequest {
			answer = fmt.Sprintf("ERR bad request %q", buf[:min(n, 64)])
		} else if s, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			answer = "ERR socket: " + err.Error()
		} else {
			answer, rights = "OK", unix.UnixRights(s)
		}
		err = unix.Sendmsg(sock, []byte(answer), rights, nil, unix.MSG_NOSIGNAL)
		if s >= 0 {
			unix.Close(s)
		}
		if err != nil {
			if err == unix.EPIPE {
				return 0
			}
			fmt.Fprintln(os.Stderr, "socket helper: answer:", err)
			return 1
		}
	}
}

// boundedBuffer keeps the first max bytes written to it.
type boundedBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *boundedBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if room := w.max - len(w.b); room > 0 {
		w.b = append(w.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (w *boundedBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}
