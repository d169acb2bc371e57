package jail

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// waitDelay bounds how long output is still read after a command exited
// while a background process it left keeps the pipes open.
const waitDelay = 500 * time.Millisecond

func ping(ctx context.Context, sock string) error {
	if sock == "" {
		return errors.New("no control socket")
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "unixpacket", sock)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, _ := request{Ping: true}.marshal()
	if _, err := c.Write(b); err != nil {
		return err
	}
	b = make([]byte, 256)
	n, err := c.Read(b)
	if err != nil {
		return err
	}
	var r reply
	if r.unmarshal(b[:n]) != nil || !r.Pong {
		return errors.New("bad ping reply")
	}
	return nil
}

// running returns the state of a running sandbox, or a *CouldNotRunError.
func (j *Jail) running(id string) (*state, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return nil, mechanism.CouldNotRun("invalid id", err)
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, mechanism.CouldNotRun("no such sandbox "+id, mechanism.ErrNotFound)
		}
		return nil, mechanism.CouldNotRun("sandbox state unreadable", err)
	}
	// A recorded running sandbox whose init died is found by the dial
	// (refused): no /proc probe here.
	if st.Status != mechanism.StatusRunning || st.Socket == "" {
		return nil, mechanism.CouldNotRun("sandbox "+id+" is not running", mechanism.ErrNotRunning)
	}
	return st, nil
}

func buildEnv(spec mechanism.Spec, extra []string) []string {
	env := []string{"PATH=" + mechanism.DefaultPath, "HOME=" + mechanism.Home, "USER=sprite", "LOGNAME=sprite",
		"SHELL=/bin/bash", "LANG=C.UTF-8", "TMPDIR=/tmp"}
	env = append(env, spec.Env...)
	env = append(env, extra...)
	// Later entries win; keep one per key.
	seen := map[string]int{}
	var out []string
	for _, e := range env {
		k, _, _ := strings.Cut(e, "=")
		if i, ok := seen[k]; ok {
			out[i] = e
			continue
		}
		seen[k] = len(out)
		out = append(out, e)
	}
	return out
}

// rproc is a process started through a sandbox's control socket.
type rproc struct {
	conn    *net.UnixConn
	nspid   int
	initPid int
	exit    chan reply
	mu      sync.Mutex
}

// spawn asks the init of st to start req with files as stdin, stdout, stderr.
// It reports ErrNotRunning only when the command surely did not start:
// the socket refuses the connection, the init is dying before the request
// is sent (a dying init still accepts connections it will never serve),
// or the request could not be sent to a dying init. A connection lost
// after the request went is ErrInterrupted when the init died: the
// command may have started, and must not be started again.
//
// endedErr is err, a failure to send to st's init, marked ErrNotRunning
// when the connection was closed (EOF, ECONNRESET, EPIPE) by an init on
// its way out. A live init closes connections too, when too many wait:
// that is no reason to start the sandbox again.
func endedErr(st *state, err error) error {
	if closedErr(err) && dying(st) {
		return errors.Join(mechanism.ErrNotRunning, err)
	}
	return err
}

// lostErr is err, a connection to st's init lost after the request was
// sent, marked ErrInterrupted when the init is dying.
func lostErr(st *state, err error) error {
	if closedErr(err) && dying(st) {
		return errors.Join(mechanism.ErrInterrupted, err)
	}
	return err
}

func closedErr(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func spawn(ctx context.Context, st *state, req request, files [3]*os.File) (*rproc, error) {
	d := net.Dialer{}
	c, err := d.DialContext(ctx, "unixpacket", st.Socket)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			// Recorded running, but nothing listens: the init is gone.
			err = errors.Join(mechanism.ErrNotRunning, err)
		}
		return nil, mechanism.CouldNotRun("cannot reach the sandbox's init", err)
	}
	conn := c.(*net.UnixConn)
	if dying(st) {
		conn.Close()
		return nil, mechanism.CouldNotRun("the sandbox's init is exiting", mechanism.ErrNotRunning)
	}
	b, err := req.marshal()
	if err != nil {
		conn.Close()
		return nil, mechanism.CouldNotRun(err.Error(), nil)
	}
	if len(b) > 64<<10 {
		// One packet: the socket's send buffer (wmem_default, ~208 KiB)
		// must hold it; root may raise it past wmem_max.
		if rc, err := conn.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 2*len(b)) != nil {
					_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, 2*len(b))
				}
			})
		}
	}
	rights := unix.UnixRights(int(files[0].Fd()), int(files[1].Fd()), int(files[2].Fd()))
	if _, _, err := conn.WriteMsgUnix(b, rights, nil); err != nil {
		conn.Close()
		if errors.Is(err, unix.EMSGSIZE) {
			return nil, mechanism.CouldNotRun(fmt.Sprintf("command line and environment take %d bytes, more than this host lets one request carry", len(b)), err)
		}
		return nil, mechanism.CouldNotRun("cannot send the request", endedErr(st, err))
	}
	p := &rproc{conn: conn, initPid: st.InitPid, exit: make(chan reply, 1)}
	if !req.Collect {
		buf := make([]byte, 4096)
		dl := time.Now().Add(startWait)
		if d, ok := ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		_ = conn.SetReadDeadline(dl)
		n, err := conn.Read(buf)
		_ = conn.SetReadDeadline(time.Time{})
		if err != nil {
			conn.Close()
			return nil, mechanism.CouldNotRun("no answer from the sandbox's init", lostErr(st, err))
		}
		var r reply
		if err := r.unmarshal(buf[:n]); err != nil || (!r.Started && r.Error == "") {
			conn.Close()
			return nil, mechanism.CouldNotRun("bad answer from the sandbox's init", err)
		}
		if !r.Started {
			conn.Close()
			return nil, mechanism.CouldNotRun(r.Error, nil)
		}
		p.nspid = r.Pid
	}
	go func() {
		b := make([]byte, 4096)
		for {
			n, err := conn.Read(b)
			if err != nil {
				p.exit <- reply{Error: "connection to the sandbox's init lost: " + err.Error(), lost: closedErr(err)}
				return
			}
			var r reply
			if r.unmarshal(b[:n]) == nil && (r.Exited || r.Error != "") {
				p.exit <- r
				return
			}
		}
	}()
	return p, nil
}

// killGrace bounds the wait for a killed command's exit. An init that
// does not answer in time (its own workload stalled it: see cinit.c) is
// left, and the connection closed, which kills the command again.
const killGrace = 5 * time.Second

// startWait bounds the wait for the started answer when ctx has no
// earlier deadline.
const startWait = 30 * time.Second

// exitWithin waits at most d for p's exit.
func (p *rproc) exitWithin(d time.Duration) reply {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-p.exit:
		return r
	case <-t.C:
		p.conn.Close()
		return reply{Error: fmt.Sprintf("the sandbox's init reported no exit %v after the kill", d)}
	}
}

func (p *rproc) signal(sig syscall.Signal) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("signal %d: %w", int(sig), syscall.EINVAL)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := request{Signal: int(sig)}.marshal()
	_, err := p.conn.Write(b)
	return err
}

// hostPid finds the host pid of the process whose pid in the sandbox's pid
// namespace is p.nspid.
func (p *rproc) hostPid() int {
	ns, err := os.Readlink("/proc/" + strconv.Itoa(p.initPid) + "/ns/pid")
	if err != nil {
		return 0
	}
	ents, _ := os.ReadDir("/proc")
	want := strconv.Itoa(p.nspid)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if l, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); l != ns {
			continue
		}
		b, _ := os.ReadFile("/proc/" + e.Name() + "/status")
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "NSpid:"); ok {
				f := strings.Fields(v)
				if len(f) > 1 && f[len(f)-1] == want {
					return pid
				}
			}
		}
	}
	return 0
}

// capture keeps the first limit bytes of a stream and hands every chunk
// to the sink.
type capture struct {
	buf       []byte
	limit     int
	truncated bool
}

// drainBufs are drain's read buffers, pooled: two per Execute otherwise.
var drainBufs = sync.Pool{New: func() any { b := make([]byte, 64<<10); return &b }}

func drain(r *os.File, c *capture, s mechanism.Stream, sink func(mechanism.Stream, []byte), mu *sync.Mutex) {
	bp := drainBufs.Get().(*[]byte)
	defer drainBufs.Put(bp)
	b := *bp
	for {
		n, err := r.Read(b)
		if n > 0 {
			if room := c.limit - len(c.buf); room > 0 {
				c.buf = append(c.buf, b[:min(n, room)]...)
				if n > room {
					c.truncated = true
				}
			} else {
				c.truncated = true
			}
			if sink != nil {
				chunk := append([]byte(nil), b[:n]...)
				mu.Lock()
				sink(s, chunk)
				mu.Unlock()
			}
		}
		if err != nil {
			return
		}
	}
}

// stdinFile returns a file to hand over as stdin, and a func to call
// after the hand-over.
func stdinFile(r io.Reader) (*os.File, func(), error) {
	if r == nil {
		f, err := os.Open(os.DevNull)
		if err != nil {
			return nil, nil, err
		}
		return f, func() { f.Close() }, nil
	}
	if f, ok := r.(*os.File); ok {
		return f, func() {}, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	go func() {
		_, _ = io.Copy(pw, r)
		pw.Close()
	}()
	return pr, func() { pr.Close() }, nil
}

// Execute implements mechanism.Mechanism.
func (j *Jail) Execute(ctx context.Context, id string, argv []string, opts mechanism.ExecOptions) (mechanism.Completion, error) {
	if len(argv) == 0 {
		return mechanism.Completion{}, mechanism.Invalid("argv", "empty")
	}
	st, err := j.running(id)
	if err != nil {
		return mechanism.Completion{}, err
	}
	limit := opts.LimitBytes
	if limit <= 0 {
		limit = mechanism.DefaultLimitBytes
	}
	dir := opts.Dir
	if dir == "" {
		dir = mechanism.Home
	}
	in, inDone, err := stdinFile(opts.Stdin)
	if err != nil {
		return mechanism.Completion{}, mechanism.CouldNotRun("stdin", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inDone()
		return mechanism.Completion{}, mechanism.CouldNotRun("pipe", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inDone()
		outR.Close()
		outW.Close()
		return mechanism.Completion{}, mechanism.CouldNotRun("pipe", err)
	}
	g := j.attributable(st)
	var before cgroups.Stats
	if g != nil {
		before = g.Stats()
	}
	began := time.Now()
	p, err := spawn(ctx, st, request{Argv: argv, Env: buildEnv(st.Spec, opts.Env), Dir: dir, KillOnClose: true, Collect: true}, [3]*os.File{in, outW, errW})
	inDone()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return mechanism.Completion{}, err
	}
	defer p.conn.Close()
	var sinkMu sync.Mutex
	out, errc := &capture{limit: limit}, &capture{limit: limit}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); drain(outR, out, mechanism.Stdout, opts.OnOutput, &sinkMu) }()
	go func() { defer wg.Done(); drain(errR, errc, mechanism.Stderr, opts.OnOutput, &sinkMu) }()

	budget := st.Spec.WallClock
	if opts.Timeout > 0 && (budget == 0 || opts.Timeout < budget) {
		budget = opts.Timeout
	}
	var timer <-chan time.Time
	if budget > 0 {
		t := time.NewTimer(budget)
		defer t.Stop()
		timer = t.C
	}
	var wall bool
	var ctxErr error
	var r reply
	select {
	case r = <-p.exit:
	case <-timer:
		wall = true
		_ = p.signal(syscall.SIGKILL)
		r = p.exitWithin(killGrace)
	case <-ctx.Done():
		ctxErr = ctx.Err()
		_ = p.signal(syscall.SIGKILL)
		r = p.exitWithin(killGrace)
	}
	streamsDone := make(chan struct{})
	go func() { wg.Wait(); close(streamsDone) }()
	select {
	case <-streamsDone:
	case <-time.After(waitDelay):
		outR.Close()
		errR.Close()
		<-streamsDone
	}
	outR.Close()
	errR.Close()
	c := mechanism.Completion{
		ExitStatus: r.Code, Signal: syscall.Signal(r.Sig),
		Stdout: out.buf, Stderr: errc.buf, Truncated: out.truncated || errc.truncated,
		Duration: time.Since(began),
	}
	if c.Stdout == nil {
		c.Stdout = []byte{}
	}
	if c.Stderr == nil {
		c.Stderr = []byte{}
	}
	if wall {
		return c, &mechanism.LimitExceededError{Limit: mechanism.LimitWallClock, Evidence: fmt.Sprintf("budget %v elapsed; process group killed", budget)}
	}
	if le := attribute(g, before); le != nil {
		return c, le
	}
	if ctxErr != nil {
		return c, mechanism.CouldNotRun("canceled while running", ctxErr)
	}
	if !r.Exited {
		var cause error
		if r.lost && dying(st) {
			cause = mechanism.ErrInterrupted // started, perhaps: never again
		}
		return c, mechanism.CouldNotRun(r.Error, cause)
	}
	return c, nil
}

// attributable returns the group whose counters can attribute a kill, or
// nil when the sandbox has no memory or pids cap (nothing to attribute).
func (j *Jail) attributable(st *state) *cgroups.Group {
	if st.Spec.MemoryBytes == 0 && st.Spec.Pids == 0 {
		return nil
	}
	return j.group(st)
}

// attribute compares the group's kernel counters with before.
func attribute(g *cgroups.Group, before cgroups.Stats) *mechanism.LimitExceededError {
	if g == nil {
		return nil
	}
	after := g.Stats()
	if d := after.OOMKills - before.OOMKills; d > 0 {
		return &mechanism.LimitExceededError{Limit: mechanism.LimitMemory, Evidence: fmt.Sprintf("oom_kill +%d in the sandbox's memory cgroup", d)}
	}
	if d := after.PidsMax - before.PidsMax; d > 0 {
		return &mechanism.LimitExceededError{Limit: mechanism.LimitPids, Evidence: fmt.Sprintf("pids.events max +%d: forks refused by pids.max", d)}
	}
	return nil
}

// process is a mechanism.Process of the jail.
type process struct {
	p       *rproc
	g       *cgroups.Group
	before  cgroups.Stats
	copies  sync.WaitGroup
	closers []io.Closer
	once    sync.Once
	state   mechanism.ExitState
	err     error
	pidOnce sync.Once
	pid     int
}

func (x *process) Pid() int {
	x.pidOnce.Do(func() { x.pid = x.p.hostPid() })
	return x.pid
}

func (x *process) Signal(sig syscall.Signal) error { return x.p.signal(sig) }

func (x *process) Wait() (mechanism.ExitState, error) {
	x.once.Do(func() {
		r := <-x.p.exit
		x.p.conn.Close()
		done := make(chan struct{})
		go func() { x.copies.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(waitDelay):
			for _, c := range x.closers {
				c.Close()
			}
			<-done
		}
		for _, c := range x.closers {
			c.Close()
		}
		x.state = mechanism.ExitState{Code: r.Code, Signal: syscall.Signal(r.Sig)}
		switch {
		case !r.Exited && r.lost:
			// It started; its end is unknown: the sandbox stopped under it.
			x.err = mechanism.CouldNotRun(r.Error, mechanism.ErrInterrupted)
		case !r.Exited:
			x.err = mechanism.CouldNotRun(r.Error, nil)
		default:
			if le := attribute(x.g, x.before); le != nil {
				x.err = le
			}
		}
	})
	return x.state, x.err
}

// outFile returns a file to hand over for w, starting a copy when w is not
// a file.
func (x *process) outFile(w io.Writer) (*os.File, error) {
	if w == nil {
		return os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	}
	if f, ok := w.(*os.File); ok {
		return f, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	x.closers = append(x.closers, pr)
	x.copies.Add(1)
	go func() {
		defer x.copies.Done()
		_, _ = io.Copy(w, pr)
	}()
	return pw, nil
}

// StartProcess implements mechanism.Mechanism.
func (j *Jail) StartProcess(ctx context.Context, id string, spec mechanism.ProcessSpec) (mechanism.Process, error) {
	if len(spec.Argv) == 0 {
		return nil, mechanism.Invalid("Argv", "empty")
	}
	st, err := j.running(id)
	if err != nil {
		return nil, err
	}
	dir := spec.Dir
	if dir == "" {
		dir = mechanism.Home
	}
	x := &process{g: j.attributable(st)}
	if x.g != nil {
		x.before = x.g.Stats()
	}
	in, inDone, err := stdinFile(spec.Stdin)
	if err != nil {
		return nil, mechanism.CouldNotRun("stdin", err)
	}
	defer inDone()
	out, err := x.outFile(spec.Stdout)
	if err != nil {
		return nil, mechanism.CouldNotRun("stdout", err)
	}
	errf, err := x.outFile(spec.Stderr)
	if err != nil {
		return nil, mechanism.CouldNotRun("stderr", err)
	}
	p, err := spawn(ctx, st, request{Argv: spec.Argv, Env: buildEnv(st.Spec, spec.Env), Dir: dir, KillOnClose: true}, [3]*os.File{in, out, errf})
	if out != spec.Stdout {
		out.Close()
	}
	if errf != spec.Stderr {
		errf.Close()
	}
	if err != nil {
		for _, c := range x.closers {
			c.Close()
		}
		x.copies.Wait()
		return nil, err
	}
	x.p = p
	return x, nil
}
