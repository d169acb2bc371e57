package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// waitDelay bounds how long output is still read after a command exited
// while a background process it left keeps the pipes open.
const waitDelay = 500 * time.Millisecond

// prelude runs inside the container before the command: it resolves the
// executable against the command's PATH (so a missing binary is "could not
// run", never exit 127), writes "<nonce>:<pid>" on stderr and execs the
// command in its own place, so the pid is the command's (on gVisor through
// the filter-exec helper, which loads the seccomp filter first). A runtime failure
// (container gone, bad working directory) never prints the nonce, which is
// random per call, so the tenant cannot forge the marker before it runs.
const prelude = `n=$1; x=$2; shift 2
case $1 in
*/*) p=$1 ;;
*) p=; IFS=:; for d in $PATH; do if [ -f "$d/$1" ] && [ -x "$d/$1" ]; then p=$d/$1; break; fi; done; unset IFS ;;
esac
[ -n "$p" ] && [ -f "$p" ] && [ -x "$p" ] || { echo "$n:notfound" >&2; exit 127; }
echo "$n:$$" >&2
[ -z "$x" ] || exec "$x" "$p" "$@"
exec "$@"`

// markerFilter is the stderr writer of a runtime exec: it holds back what
// comes before the prelude's marker line (the runtime's own messages) and
// passes everything after it to next.
type markerFilter struct {
	nonce    string
	next     io.Writer
	mu       sync.Mutex
	state    int // 0 waiting, 1 started, 2 not found
	line     []byte
	runtime  bytes.Buffer // the runtime's own output before the marker
	pid      int
	ready    chan struct{}
	doneOnce sync.Once
}

func (f *markerFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	if f.state == 1 {
		f.mu.Unlock()
		return f.next.Write(p)
	}
	n := len(p)
	var rest []byte
	for f.state == 0 && len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			f.line = append(f.line, p...)
			if len(f.line) > 64<<10 {
				f.runtime.Write(f.line)
				f.line = nil
			}
			p = nil
			break
		}
		f.line = append(f.line, p[:i]...)
		p = p[i+1:]
		l := string(f.line)
		f.line = nil
		switch {
		case l == f.nonce+":notfound":
			f.state = 2
		case strings.HasPrefix(l, f.nonce+":"):
			f.pid, _ = strconv.Atoi(strings.TrimPrefix(l, f.nonce+":"))
			f.state = 1
			rest = p
		default:
			if f.runtime.Len() < 64<<10 {
				f.runtime.WriteString(l + "\n")
			}
		}
	}
	state := f.state
	f.mu.Unlock()
	if state != 0 {
		f.doneOnce.Do(func() { close(f.ready) })
	}
	if state == 1 && len(rest) > 0 {
		_, _ = f.next.Write(rest)
	}
	return n, nil
}

func (f *markerFilter) result() (state, pid int, runtimeOut string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state, f.pid, strings.TrimSpace(f.runtime.String() + string(f.line))
}

// capture keeps the first limit bytes of a stream and hands every chunk to
// the sink (serialized by mu).
type capture struct {
	limit     int
	buf       []byte
	truncated bool
	stream    mechanism.Stream
	sink      func(mechanism.Stream, []byte)
	mu        *sync.Mutex
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sink != nil && len(p) > 0 {
		c.sink(c.stream, bytes.Clone(p))
	}
	room := c.limit - len(c.buf)
	if room > len(p) {
		room = len(p)
	}
	if room > 0 {
		c.buf = append(c.buf, p[:room]...)
	}
	if room < len(p) {
		c.truncated = true
	}
	return len(p), nil
}

// execution is one runtime exec whose prelude reported the command started.
type execution struct {
	m       *Mechanism
	id      string
	cg      *ccgroup
	filter  *markerFilter
	pid     int // the command's pid inside the container
	exited  chan struct{}
	code    int // the runtime exec's exit code (-1 if it was signaled)
	hostPid int // the runtime exec process (group leader)
}

// running loads a sandbox to run a command in, and its cgroup (nil when
// its init is not there). Whether the container runs is left to the
// runtime's exec (one runtime call per command); explain says why it
// could not run.
func (m *Mechanism) running(id string) (*sandbox, *ccgroup, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return nil, nil, mechanism.CouldNotRun("invalid id", err)
	}
	sb, err := m.load(id)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, mechanism.CouldNotRun("no such sandbox "+id, mechanism.ErrNotFound)
		}
		return nil, nil, mechanism.CouldNotRun("sandbox state unreadable", err)
	}
	if m.rt.path() == "" {
		return nil, nil, mechanism.CouldNotRun(m.refuseRuntime().Error(), mechanism.ErrNotRunning)
	}
	return sb, m.cgroupOf(sb), nil
}

// explain turns a runtime exec that failed before the command started
// into a *CouldNotRunError, naming a sandbox that is not running.
func (m *Mechanism) explain(id string, err error) error {
	st, serr := m.state(context.Background(), id)
	switch {
	case errors.Is(serr, errNoContainer):
		return mechanism.CouldNotRun("sandbox "+id+" is not running", mechanism.ErrNotRunning)
	case serr == nil && st.Status != "running":
		return mechanism.CouldNotRun("sandbox "+id+" is "+st.Status, mechanism.ErrNotRunning)
	}
	return err
}

// workdir resolves a working directory (default Home; relative to Home).
func workdir(dir string) string {
	if dir == "" {
		return mechanism.Home
	}
	if !path.IsAbs(dir) {
		return path.Join(mechanism.Home, dir)
	}
	return path.Clean(dir)
}

// spawn starts a runtime exec and waits until the prelude reports the
// command started (or the runtime failed, or ctx ended).
func (m *Mechanism) spawn(ctx context.Context, id string, cg *ccgroup, argv, env []string, dir string,
	stdin io.Reader, stdout, stderr io.Writer) (*execution, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, mechanism.CouldNotRun("empty argv", mechanism.Invalid("argv", "empty"))
	}
	nonce := "managoat-" + randHex(12)
	helper := ""
	if m.rt.gvisor && runtime.GOARCH == "amd64" {
		helper = filterExecPath
	}
	full := append([]string{"/bin/sh", "-c", prelude, "managoat-exec", nonce, helper}, argv...)
	spec, err := processSpec(full, env, dir)
	if err != nil {
		return nil, mechanism.CouldNotRun("process spec", err)
	}
	pf, err := os.CreateTemp(m.base+"/tmp", "exec-*.json")
	if err != nil {
		return nil, mechanism.CouldNotRun("process spec", err)
	}
	defer os.Remove(pf.Name())
	if _, err := pf.Write(spec); err != nil {
		pf.Close()
		return nil, mechanism.CouldNotRun("process spec", err)
	}
	pf.Close()
	filter := &markerFilter{nonce: nonce, next: stderr, ready: make(chan struct{})}
	cmd := m.command(context.Background(), "exec", "--process", pf.Name(), id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, filter
	cmd.WaitDelay = waitDelay
	if err := cmd.Start(); err != nil {
		return nil, mechanism.CouldNotRun("start "+m.rt.name+" exec", err)
	}
	ex := &execution{m: m, id: id, cg: cg, filter: filter, exited: make(chan struct{}), hostPid: cmd.Process.Pid}
	go func() {
		_ = cmd.Wait()
		ex.code = cmd.ProcessState.ExitCode()
		close(ex.exited)
	}()
	select {
	case <-filter.ready:
	case <-ex.exited:
	case <-ctx.Done():
		select {
		case <-filter.ready:
		case <-time.After(time.Second):
		}
		_, pid, _ := filter.result()
		ex.pid = pid
		ex.stop(syscall.SIGKILL)
		return nil, mechanism.CouldNotRun("canceled before the command started", ctx.Err())
	}
	state, pid, rtOut := filter.result()
	ex.pid = pid
	switch state {
	case 1:
		return ex, nil
	case 2:
		<-ex.exited
		return nil, mechanism.CouldNotRun(fmt.Sprintf("executable %q not found in the sandbox", argv[0]), nil)
	}
	<-ex.exited
	if rtOut == "" {
		rtOut = fmt.Sprintf("exit %d before the command started", ex.code)
	}
	return nil, m.explain(id, mechanism.CouldNotRun(m.rt.name+" exec: "+rtOut, nil))
}

// signal sends sig to the command's process group inside the container.
func (ex *execution) signal(sig syscall.Signal) error {
	if ex.pid <= 0 {
		return fmt.Errorf("oci: the command's pid is not known")
	}
	if !ex.m.rt.gvisor {
		if hp := ex.cg.hostPid(ex.pid); hp > 0 {
			if err := syscall.Kill(-hp, sig); err != nil {
				return syscall.Kill(hp, sig)
			}
			return nil
		}
		select {
		case <-ex.exited:
			return fmt.Errorf("oci: process exited")
		default:
		}
	}
	// gVisor's processes are not host processes: signal the group from
	// inside (the command is a session leader there), then the leader
	// through the runtime.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec, err := processSpec([]string{"/bin/sh", "-c", `kill -s "$1" -- "-$2" 2>/dev/null || kill -s "$1" "$2"`, "kill",
		strconv.Itoa(int(sig)), strconv.Itoa(ex.pid)}, baseEnv(), "/")
	if err == nil {
		pf, ferr := os.CreateTemp(ex.m.base+"/tmp", "kill-*.json")
		if ferr == nil {
			_, _ = pf.Write(spec)
			pf.Close()
			_, err = ex.m.run(ctx, "exec", "--process", pf.Name(), ex.id)
			os.Remove(pf.Name())
		} else {
			err = ferr
		}
	}
	if err != nil {
		_, err = ex.m.run(ctx, "kill", "--pid", strconv.Itoa(ex.pid), ex.id, strconv.Itoa(int(sig)))
	}
	return err
}

// stop kills the command's group and waits for the runtime exec to end;
// as a last resort the runtime exec process itself is killed.
func (ex *execution) stop(sig syscall.Signal) {
	_ = ex.signal(sig)
	select {
	case <-ex.exited:
		return
	case <-time.After(10 * time.Second):
	}
	_ = syscall.Kill(-ex.hostPid, syscall.SIGKILL)
	<-ex.exited
}

// Execute implements mechanism.Mechanism: the runtime's exec enters the
// running container; see the package doc for the outcomes.
func (m *Mechanism) Execute(ctx context.Context, id string, argv []string, opts mechanism.ExecOptions) (mechanism.Completion, error) {
	sb, cg, err := m.running(id)
	if err != nil {
		return mechanism.Completion{}, err
	}
	limit := opts.LimitBytes
	if limit <= 0 {
		limit = mechanism.DefaultLimitBytes
	}
	var sinkMu sync.Mutex
	out := &capture{limit: limit, stream: mechanism.Stdout, sink: opts.OnOutput, mu: &sinkMu}
	errc := &capture{limit: limit, stream: mechanism.Stderr, sink: opts.OnOutput, mu: &sinkMu}
	before := cg.stats()
	budget := sb.Spec.WallClock
	if opts.Timeout > 0 && (budget == 0 || opts.Timeout < budget) {
		budget = opts.Timeout
	}
	began := time.Now()
	env := mergeEnv(baseEnv(), sb.Spec.Env, opts.Env)
	ex, err := m.spawn(ctx, id, cg, argv, env, workdir(opts.Dir), opts.Stdin, out, errc)
	if err != nil {
		if le := cg.attribute(before); le != nil {
			return mechanism.Completion{Stdout: []byte{}, Stderr: []byte{}}, le
		}
		return mechanism.Completion{}, err
	}
	var timer <-chan time.Time
	if budget > 0 {
		rest := budget - time.Since(began)
		if rest < 0 {
			rest = 0
		}
		t := time.NewTimer(rest)
		defer t.Stop()
		timer = t.C
	}
	var wall bool
	var ctxErr error
	select {
	case <-ex.exited:
	case <-timer:
		wall = true
		ex.stop(syscall.SIGKILL)
	case <-ctx.Done():
		ctxErr = ctx.Err()
		ex.stop(syscall.SIGKILL)
	}
	sinkMu.Lock()
	c := mechanism.Completion{
		ExitStatus: ex.code,
		Stdout:     append([]byte{}, out.buf...),
		Stderr:     append([]byte{}, errc.buf...),
		Truncated:  out.truncated || errc.truncated,
		Duration:   time.Since(began),
	}
	sinkMu.Unlock()
	if wall {
		c.ExitStatus, c.Signal = 128+int(syscall.SIGKILL), syscall.SIGKILL
		return c, &mechanism.LimitExceededError{Limit: mechanism.LimitWallClock, Evidence: fmt.Sprintf("budget %v elapsed; process group killed", budget)}
	}
	if le := cg.attribute(before); le != nil {
		if le.Limit == mechanism.LimitMemory && c.ExitStatus == 128+int(syscall.SIGKILL) {
			c.Signal = syscall.SIGKILL
		}
		return c, le
	}
	if ctxErr != nil {
		return c, mechanism.CouldNotRun("canceled while running", ctxErr)
	}
	if c.ExitStatus < 0 {
		return c, mechanism.CouldNotRun(m.rt.name+" exec ended by a signal", nil)
	}
	if c.ExitStatus != 0 {
		// A sandbox that stopped under the command (Stop, Destroy, a
		// runtime failure) did not let it finish.
		if st, err := m.state(context.Background(), id); errors.Is(err, errNoContainer) || (err == nil && st.Status != "running") {
			// ErrInterrupted, not ErrNotRunning: the command started, and
			// a retry would run it twice.
			return c, mechanism.CouldNotRun("sandbox "+id+" stopped while the command ran", mechanism.ErrInterrupted)
		}
	}
	return c, nil
}

// process is a mechanism.Process of this mechanism.
type process struct {
	ex      *execution
	before  cstats
	pidOnce sync.Once
	pid     int
}

func (p *process) Pid() int {
	if p.ex.m.rt.gvisor {
		return 0
	}
	p.pidOnce.Do(func() { p.pid = p.ex.cg.hostPid(p.ex.pid) })
	return p.pid
}

func (p *process) Signal(sig syscall.Signal) error {
	select {
	case <-p.ex.exited:
		return os.ErrProcessDone
	default:
	}
	return p.ex.signal(sig)
}

func (p *process) Wait() (mechanism.ExitState, error) {
	<-p.ex.exited
	s := mechanism.ExitState{Code: p.ex.code}
	if le := p.ex.cg.attribute(p.before); le != nil {
		if le.Limit == mechanism.LimitMemory && s.Code == 128+int(syscall.SIGKILL) {
			s.Signal = syscall.SIGKILL
		}
		return s, le
	}
	if s.Code < 0 {
		return s, mechanism.CouldNotRun(p.ex.m.rt.name+" exec ended by a signal", nil)
	}
	return s, nil
}

// StartProcess implements mechanism.Mechanism. The process's stdin, stdout
// and stderr are the caller's (an *os.File is handed to the runtime,
// anything else is copied through a pipe; stderr always passes a filter
// that removes the start marker). The sandbox's wall-clock budget does not
// apply.
func (m *Mechanism) StartProcess(ctx context.Context, id string, spec mechanism.ProcessSpec) (mechanism.Process, error) {
	sb, cg, err := m.running(id)
	if err != nil {
		return nil, err
	}
	stdout, stderr := spec.Stdout, spec.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	if m.rt.gvisor {
		// gVisor writes a donated regular file at its own offset, over
		// what the file already holds: copy through a pipe instead.
		if f, ok := stdout.(*os.File); ok {
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				stdout = struct{ io.Writer }{f}
			}
		}
	}
	before := cg.stats()
	env := mergeEnv(baseEnv(), sb.Spec.Env, spec.Env)
	ex, err := m.spawn(ctx, id, cg, spec.Argv, env, workdir(spec.Dir), spec.Stdin, stdout, stderr)
	if err != nil {
		return nil, err
	}
	return &process{ex: ex, before: before}, nil
}
