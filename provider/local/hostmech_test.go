package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/managoat/managoat/mechanism"
)

// hostMech is a test mechanism: plain host processes, home mapped to a
// host directory. It stands in for mechanism/trusted in unit tests.
type hostMech struct{ dir string }

func openHost(name, stateDir string) (mechanism.Mechanism, error) {
	if name != "host" {
		return OpenMechanism(name, stateDir)
	}
	d := filepath.Join(stateDir, "mech", "host")
	return hostMech{d}, os.MkdirAll(d, 0o700)
}

type hostState struct {
	Home    string
	Running bool
}

func (m hostMech) Name() string { return "host" }
func (m hostMech) path(id string) string {
	return filepath.Join(m.dir, id+".json")
}
func (m hostMech) read(id string) (hostState, error) {
	var st hostState
	b, err := os.ReadFile(m.path(id))
	if err != nil {
		return st, mechanism.ErrNotFound
	}
	return st, json.Unmarshal(b, &st)
}
func (m hostMech) write(id string, st hostState) error {
	b, _ := json.Marshal(st)
	return os.WriteFile(m.path(id), b, 0o600)
}
func (m hostMech) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	if spec.MemoryBytes != 0 || spec.Pids != 0 || spec.CPUMillis != 0 {
		return &mechanism.UnavailableError{Mechanism: "host", Missing: []mechanism.Report{{Name: mechanism.MemoryCap, Detail: "host constructs nothing"}}}
	}
	return m.write(id, hostState{Home: spec.HomeDir})
}
func (m hostMech) Start(ctx context.Context, id string) error {
	st, err := m.read(id)
	if err != nil {
		return err
	}
	st.Running = true
	return m.write(id, st)
}
func (m hostMech) Stop(ctx context.Context, id string) error {
	st, err := m.read(id)
	if err != nil {
		return nil
	}
	st.Running = false
	return m.write(id, st)
}
func (m hostMech) Destroy(ctx context.Context, id string) error {
	os.Remove(m.path(id))
	return nil
}
func (m hostMech) Status(ctx context.Context, id string) (mechanism.Status, error) {
	st, err := m.read(id)
	if err != nil {
		return mechanism.StatusAbsent, nil
	}
	if st.Running {
		return mechanism.StatusRunning, nil
	}
	return mechanism.StatusStopped, nil
}
func (m hostMech) ListRunning(ctx context.Context) ([]string, error) { return nil, nil }
func (m hostMech) Usage(ctx context.Context, id string) (mechanism.Usage, error) {
	return mechanism.Usage{}, nil
}
func (m hostMech) HostPath(id, p string) (string, error) {
	st, err := m.read(id)
	if err != nil {
		return "", err
	}
	return mechanism.ResolveHome(st.Home, p)
}

func (m hostMech) command(id string, argv, env []string, dir string) (*exec.Cmd, error) {
	st, err := m.read(id)
	if err != nil {
		return nil, mechanism.CouldNotRun("unknown sandbox", err)
	}
	if !st.Running {
		return nil, mechanism.CouldNotRun("not running", mechanism.ErrNotRunning)
	}
	if dir == "" {
		dir = mechanism.Home
	}
	if dir == mechanism.Home || strings.HasPrefix(dir, mechanism.Home+"/") {
		dir, _ = mechanism.ResolveHome(st.Home, dir)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append([]string{"PATH=" + mechanism.DefaultPath, "HOME=" + st.Home}, env...)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if _, err := exec.LookPath(argv[0]); err != nil {
		return nil, mechanism.CouldNotRun("executable not found", err)
	}
	return cmd, nil
}

type hostProc struct{ cmd *exec.Cmd }

func (p hostProc) Pid() int                        { return p.cmd.Process.Pid }
func (p hostProc) Signal(sig syscall.Signal) error { return syscall.Kill(-p.cmd.Process.Pid, sig) }
func (p hostProc) Wait() (mechanism.ExitState, error) {
	err := p.cmd.Wait()
	if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return mechanism.ExitState{Code: 128 + int(ws.Signal()), Signal: ws.Signal()}, nil
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		return mechanism.ExitState{Code: -1}, err
	}
	return mechanism.ExitState{Code: p.cmd.ProcessState.ExitCode()}, nil
}

func (m hostMech) StartProcess(ctx context.Context, id string, spec mechanism.ProcessSpec) (mechanism.Process, error) {
	cmd, err := m.command(id, spec.Argv, spec.Env, spec.Dir)
	if err != nil {
		return nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = spec.Stdin, spec.Stdout, spec.Stderr
	if err := cmd.Start(); err != nil {
		return nil, mechanism.CouldNotRun("start", err)
	}
	return hostProc{cmd}, nil
}

type sinkWriter struct {
	mu *sync.Mutex
	s  mechanism.Stream
	fn func(mechanism.Stream, []byte)
}

func (w sinkWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fn(w.s, bytes.Clone(p))
	return len(p), nil
}

func (m hostMech) Execute(ctx context.Context, id string, argv []string, opts mechanism.ExecOptions) (mechanism.Completion, error) {
	cmd, err := m.command(id, argv, opts.Env, opts.Dir)
	if err != nil {
		return mechanism.Completion{}, err
	}
	var mu sync.Mutex
	fn := opts.OnOutput
	if fn == nil {
		fn = func(mechanism.Stream, []byte) {}
	}
	cmd.Stdout = sinkWriter{&mu, mechanism.Stdout, fn}
	cmd.Stderr = sinkWriter{&mu, mechanism.Stderr, fn}
	cmd.Stdin = opts.Stdin
	if cmd.Stdin == nil {
		cmd.Stdin = io.LimitReader(nil, 0)
	}
	if err := cmd.Start(); err != nil {
		return mechanism.Completion{}, mechanism.CouldNotRun("start", err)
	}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		case <-done:
		}
	}()
	st, err := hostProc{cmd}.Wait()
	close(done)
	if ctx.Err() != nil {
		return mechanism.Completion{}, mechanism.CouldNotRun("timeout", ctx.Err())
	}
	return mechanism.Completion{ExitStatus: st.Code, Signal: st.Signal}, err
}
