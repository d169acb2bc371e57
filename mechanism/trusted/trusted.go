// Package trusted is the mechanism without isolation: a sandbox is a plain
// directory on the host and its commands are plain processes of the calling
// user, with the sandbox's home directory as their working directory and
// HOME. It is the runner's trusted mode.
//
// Its capabilities are honest: it requires nothing from the host and
// constructs and guarantees only the wall-clock budget it enforces itself.
// A Spec asking for memory, pids, CPU or disk caps, or an egress allowlist,
// is refused at Provision with the capability named; mechanismtest reports
// every isolation check as not demonstrated.
//
// Paths inside a trusted sandbox are host paths; ExecOptions.Dir under
// mechanism.Home is mapped to the sandbox's home directory, any other
// directory is used as is.
package trusted

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/managoat/managoat/mechanism"
)

// Trusted is the mechanism. Safe for concurrent use.
type Trusted struct {
	stateDir string
	mu       sync.Mutex
	procs    map[string]map[*exec.Cmd]struct{}
}

var (
	_ mechanism.Mechanism             = (*Trusted)(nil)
	_ mechanism.CapabilityRequirer    = (*Trusted)(nil)
	_ mechanism.CapabilityConstructor = (*Trusted)(nil)
	_ mechanism.CapabilityGuarantor   = (*Trusted)(nil)
)

// New returns a Trusted mechanism keeping its sandboxes under stateDir.
func New(stateDir string) (*Trusted, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, mechanism.Invalid("stateDir", "must be an absolute path")
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	return &Trusted{stateDir: stateDir, procs: map[string]map[*exec.Cmd]struct{}{}}, nil
}

// Name implements mechanism.Mechanism.
func (t *Trusted) Name() string { return "trusted" }

// RequiredCapabilities: nothing from the host.
func (t *Trusted) RequiredCapabilities() []mechanism.Capability { return []mechanism.Capability{} }

// ConstructedCapabilities: the wall-clock budget.
func (t *Trusted) ConstructedCapabilities() []mechanism.Capability {
	return []mechanism.Capability{mechanism.TimeBudget}
}

// GuaranteedCapabilities: the wall-clock budget, nothing else.
func (t *Trusted) GuaranteedCapabilities() []mechanism.Capability {
	return []mechanism.Capability{mechanism.TimeBudget}
}

type state struct {
	Mechanism string           `json:"mechanism"`
	Spec      mechanism.Spec   `json:"spec"`
	HomeDir   string           `json:"homeDir"`
	OwnHome   bool             `json:"ownHome"`
	Status    mechanism.Status `json:"status"`
}

func (t *Trusted) dir(id string) string { return filepath.Join(t.stateDir, id) }

func (t *Trusted) read(id string) (*state, error) {
	if err := mechanism.ValidateID(id); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(t.dir(id), "state.json"))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil || st.Mechanism != "trusted" {
		return nil, fmt.Errorf("corrupt state of %s: %v", id, err)
	}
	return &st, nil
}

func (t *Trusted) write(dir string, st *state) error {
	b, _ := json.Marshal(st)
	tmp := filepath.Join(dir, ".state.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "state.json"))
}

// Provision implements mechanism.Mechanism.
func (t *Trusted) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	if err := mechanism.ValidateID(id); err != nil {
		return err
	}
	if err := spec.Validate(); err != nil {
		return err
	}
	if err := mechanism.Gate(ctx, t, spec, nil); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if st, err := t.read(id); err == nil {
		if reflect.DeepEqual(st.Spec, spec) {
			return nil
		}
		return fmt.Errorf("%w: %s", mechanism.ErrExists, id)
	}
	tmp, err := os.MkdirTemp(t.stateDir, ".provision-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	st := &state{Mechanism: "trusted", Spec: spec, Status: mechanism.StatusProvisioned, HomeDir: spec.HomeDir}
	if spec.HomeDir == "" {
		if err := os.Mkdir(filepath.Join(tmp, "home"), 0o755); err != nil {
			return err
		}
		st.HomeDir, st.OwnHome = filepath.Join(t.dir(id), "home"), true
	} else if err := os.MkdirAll(spec.HomeDir, 0o755); err != nil {
		return err
	}
	if err := t.write(tmp, st); err != nil {
		return err
	}
	return os.Rename(tmp, t.dir(id))
}

func (t *Trusted) setStatus(ctx context.Context, id string, s mechanism.Status) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	st, err := t.read(id)
	if err != nil {
		return err
	}
	st.Status = s
	return t.write(t.dir(id), st)
}

// Start implements mechanism.Mechanism (the gate runs again).
func (t *Trusted) Start(ctx context.Context, id string) error {
	st, err := t.read(id)
	if err != nil {
		return err
	}
	if err := mechanism.Gate(ctx, t, st.Spec, nil); err != nil {
		return err
	}
	return t.setStatus(ctx, id, mechanism.StatusRunning)
}

// Stop implements mechanism.Mechanism: it kills the process groups of
// the commands this process started in the sandbox.
func (t *Trusted) Stop(ctx context.Context, id string) error {
	if _, err := t.read(id); errors.Is(err, mechanism.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	t.mu.Lock()
	for c := range t.procs[id] {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	t.mu.Unlock()
	return t.setStatus(ctx, id, mechanism.StatusStopped)
}

// Destroy implements mechanism.Mechanism.
func (t *Trusted) Destroy(ctx context.Context, id string) error {
	if err := t.Stop(ctx, id); err != nil {
		return err
	}
	st, err := t.read(id)
	if errors.Is(err, mechanism.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	gone := filepath.Join(t.stateDir, fmt.Sprintf(".destroy-%s-%d", id, time.Now().UnixNano()))
	if err := os.Rename(t.dir(id), gone); err != nil {
		return err
	}
	_ = st
	return os.RemoveAll(gone)
}

// Status implements mechanism.Mechanism.
func (t *Trusted) Status(ctx context.Context, id string) (mechanism.Status, error) {
	st, err := t.read(id)
	if errors.Is(err, mechanism.ErrNotFound) {
		return mechanism.StatusAbsent, nil
	}
	if err != nil {
		return mechanism.StatusUnknown, err
	}
	return st.Status, nil
}

// ListRunning implements mechanism.Mechanism.
func (t *Trusted) ListRunning(ctx context.Context) ([]string, error) {
	ents, err := os.ReadDir(t.stateDir)
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if st, err := t.read(e.Name()); err == nil && st.Status == mechanism.StatusRunning {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Usage implements mechanism.Mechanism: only disk (allocated blocks under
// home); a trusted sandbox has no cgroup to read CPU or memory from.
func (t *Trusted) Usage(ctx context.Context, id string) (mechanism.Usage, error) {
	st, err := t.read(id)
	if err != nil {
		return mechanism.Usage{}, err
	}
	var u mechanism.Usage
	_ = filepath.WalkDir(st.HomeDir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil {
			if info, err := d.Info(); err == nil {
				if s, ok := info.Sys().(*syscall.Stat_t); ok {
					u.DiskBytes += s.Blocks * 512
				}
			}
		}
		return nil
	})
	return u, nil
}

// HostPath implements mechanism.Mechanism.
func (t *Trusted) HostPath(id, sandboxPath string) (string, error) {
	st, err := t.read(id)
	if err != nil {
		return "", err
	}
	return mechanism.ResolveHome(st.HomeDir, sandboxPath)
}

func (t *Trusted) command(id string, st *state, argv, env []string, dir string) (*exec.Cmd, error) {
	if dir == "" || dir == mechanism.Home || strings.HasPrefix(dir, mechanism.Home+"/") {
		d, err := mechanism.ResolveHome(st.HomeDir, dir)
		if err != nil {
			return nil, err
		}
		dir = d
	}
	base := []string{"PATH=" + mechanism.DefaultPath, "HOME=" + st.HomeDir, "LANG=C.UTF-8", "TMPDIR=" + os.TempDir()}
	base = append(append(base, st.Spec.Env...), env...)
	path, err := exec.LookPath(argv[0])
	if strings.Contains(argv[0], "/") {
		path, err = argv[0], nil
	} else {
		for _, e := range base {
			if v, ok := strings.CutPrefix(e, "PATH="); ok {
				path, err = lookIn(argv[0], v)
			}
		}
	}
	if err != nil {
		return nil, err
	}
	c := exec.Command(path, argv[1:]...)
	c.Args[0] = argv[0]
	c.Dir, c.Env = dir, base
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c.WaitDelay = 500 * time.Millisecond
	return c, nil
}

func lookIn(file, pathEnv string) (string, error) {
	for _, d := range filepath.SplitList(pathEnv) {
		p := filepath.Join(d, file)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("executable %s not found in PATH %s", file, pathEnv)
}

func (t *Trusted) running(id string) (*state, error) {
	st, err := t.read(id)
	if err != nil {
		return nil, mechanism.CouldNotRun("no such sandbox "+id, err)
	}
	if st.Status != mechanism.StatusRunning {
		return nil, mechanism.CouldNotRun("sandbox "+id+" is "+string(st.Status), mechanism.ErrNotRunning)
	}
	return st, nil
}

func (t *Trusted) track(id string, c *exec.Cmd, on bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if on {
		if t.procs[id] == nil {
			t.procs[id] = map[*exec.Cmd]struct{}{}
		}
		t.procs[id][c] = struct{}{}
	} else {
		delete(t.procs[id], c)
	}
}

type capWriter struct {
	limit     int
	buf       []byte
	truncated bool
	stream    mechanism.Stream
	sink      func(mechanism.Stream, []byte)
	mu        *sync.Mutex
}

func (w *capWriter) Write(p []byte) (int, error) {
	if room := w.limit - len(w.buf); room > 0 {
		w.buf = append(w.buf, p[:min(len(p), room)]...)
		if len(p) > room {
			w.truncated = true
		}
	} else if len(p) > 0 {
		w.truncated = true
	}
	if w.sink != nil {
		w.mu.Lock()
		w.sink(w.stream, append([]byte(nil), p...))
		w.mu.Unlock()
	}
	return len(p), nil
}

// Execute implements mechanism.Mechanism.
func (t *Trusted) Execute(ctx context.Context, id string, argv []string, opts mechanism.ExecOptions) (mechanism.Completion, error) {
	if len(argv) == 0 {
		return mechanism.Completion{}, mechanism.Invalid("argv", "empty")
	}
	st, err := t.running(id)
	if err != nil {
		return mechanism.Completion{}, err
	}
	c, err := t.command(id, st, argv, opts.Env, opts.Dir)
	if err != nil {
		return mechanism.Completion{}, mechanism.CouldNotRun(err.Error(), nil)
	}
	limit := opts.LimitBytes
	if limit <= 0 {
		limit = mechanism.DefaultLimitBytes
	}
	var mu sync.Mutex
	out := &capWriter{limit: limit, stream: mechanism.Stdout, sink: opts.OnOutput, mu: &mu}
	errw := &capWriter{limit: limit, stream: mechanism.Stderr, sink: opts.OnOutput, mu: &mu}
	c.Stdin, c.Stdout, c.Stderr = opts.Stdin, out, errw
	began := time.Now()
	if err := c.Start(); err != nil {
		return mechanism.Completion{}, mechanism.CouldNotRun("start", err)
	}
	t.track(id, c, true)
	defer t.track(id, c, false)
	budget := st.Spec.WallClock
	if opts.Timeout > 0 && (budget == 0 || opts.Timeout < budget) {
		budget = opts.Timeout
	}
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	var timer <-chan time.Time
	if budget > 0 {
		tm := time.NewTimer(budget)
		defer tm.Stop()
		timer = tm.C
	}
	var wall bool
	var ctxErr error
	select {
	case <-done:
		done <- nil
	case <-timer:
		wall = true
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	case <-ctx.Done():
		ctxErr = ctx.Err()
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	<-done
	comp := mechanism.Completion{Stdout: out.buf, Stderr: errw.buf, Truncated: out.truncated || errw.truncated, Duration: time.Since(began)}
	if comp.Stdout == nil {
		comp.Stdout = []byte{}
	}
	if comp.Stderr == nil {
		comp.Stderr = []byte{}
	}
	if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok {
		comp.ExitStatus = ws.ExitStatus()
		if ws.Signaled() {
			comp.Signal = ws.Signal()
			comp.ExitStatus = 128 + int(ws.Signal())
		}
	}
	switch {
	case wall:
		return comp, &mechanism.LimitExceededError{Limit: mechanism.LimitWallClock, Evidence: fmt.Sprintf("budget %v elapsed; process group killed", budget)}
	case ctxErr != nil:
		return comp, mechanism.CouldNotRun("canceled while running", ctxErr)
	}
	return comp, nil
}

type process struct {
	c    *exec.Cmd
	t    *Trusted
	id   string
	once sync.Once
	st   mechanism.ExitState
}

func (p *process) Pid() int { return p.c.Process.Pid }

func (p *process) Signal(sig syscall.Signal) error { return syscall.Kill(-p.c.Process.Pid, sig) }

func (p *process) Wait() (mechanism.ExitState, error) {
	p.once.Do(func() {
		_ = p.c.Wait()
		p.t.track(p.id, p.c, false)
		if ws, ok := p.c.ProcessState.Sys().(syscall.WaitStatus); ok {
			p.st.Code = ws.ExitStatus()
			if ws.Signaled() {
				p.st.Signal = ws.Signal()
				p.st.Code = 128 + int(ws.Signal())
			}
		}
	})
	return p.st, nil
}

// StartProcess implements mechanism.Mechanism.
func (t *Trusted) StartProcess(ctx context.Context, id string, spec mechanism.ProcessSpec) (mechanism.Process, error) {
	if len(spec.Argv) == 0 {
		return nil, mechanism.Invalid("Argv", "empty")
	}
	st, err := t.running(id)
	if err != nil {
		return nil, err
	}
	c, err := t.command(id, st, spec.Argv, spec.Env, spec.Dir)
	if err != nil {
		return nil, mechanism.CouldNotRun(err.Error(), nil)
	}
	c.Stdin = spec.Stdin
	c.Stdout, c.Stderr = spec.Stdout, spec.Stderr
	if c.Stdout == nil {
		c.Stdout = io.Discard
	}
	if c.Stderr == nil {
		c.Stderr = io.Discard
	}
	if err := c.Start(); err != nil {
		return nil, mechanism.CouldNotRun("start", err)
	}
	t.track(id, c, true)
	return &process{c: c, t: t, id: id}, nil
}
