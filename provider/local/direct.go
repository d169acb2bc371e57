package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

// The direct path: with Config.LazySupervisor, a spawn that asks for no
// detachable session and no TTY, in a sandbox created lazily that has no
// supervisor, is started by this process through the mechanism, with its
// pipes read here. Nothing is journaled, no session is listed, and the
// process ends with the caller (the mechanism kills it when its caller
// goes): what `managoat run` needs, without the cost of starting a
// supervisor. Any other spawn goes through the supervisor.

// directState is a direct Command's private state.
type directState struct {
	proc  mechanism.Process
	stdin *os.File // nil when stdin was not asked for

	mu     sync.Mutex
	closed bool
}

// directOK reports whether a spawn may try the direct path. Whether the
// mechanism's sandbox runs is not asked here (the jail would ask its init,
// a round trip): the mechanism's StartProcess refuses with ErrNotRunning,
// and Spawn then goes through the supervisor, which starts it.
func (p *Provider) directOK(r *record, dir string, opts sandbox.SpawnOptions) bool {
	if !p.lazy || !r.Lazy || opts.Detachable || opts.TTY {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SuspendedName)); !errors.Is(err, os.ErrNotExist) {
		return false
	}
	if _, err := os.Stat(filepath.Join(dir, supervisor.SocketName)); err == nil {
		return false // a supervisor is up: its sessions are the truth
	}
	return true
}

func (p *Provider) spawnDirect(ctx context.Context, r *record, m mechanism.Mechanism, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	argv, env := p.command(r, m, c.Argv(), opts.Env)
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, sandbox.Unavailable("pipe", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, sandbox.Unavailable("pipe", err)
	}
	spec := mechanism.ProcessSpec{Argv: argv, Env: env, Dir: r.dir(opts.Dir), Stdout: outW, Stderr: errW}
	var inR, inW *os.File
	if opts.Stdin {
		if inR, inW, err = os.Pipe(); err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, sandbox.Unavailable("pipe", err)
		}
		spec.Stdin = inR
	}
	proc, err := m.StartProcess(ctx, r.InstanceID, spec)
	// The child holds its own copies now (or failed): ours must go, so
	// EOF and EPIPE reach the right ends.
	outW.Close()
	errW.Close()
	if inR != nil {
		inR.Close()
	}
	if err != nil {
		outR.Close()
		errR.Close()
		if inW != nil {
			inW.Close()
		}
		if ctx.Err() != nil && !errors.Is(err, mechanism.ErrInterrupted) {
			// The caller's deadline or cancellation ended the start (a
			// budget spent before the command could start): that, not
			// what the interrupted dial said.
			return nil, ctx.Err()
		}
		if errors.Is(err, mechanism.ErrInterrupted) {
			return nil, sandbox.Unavailable("not_running", err) // started, perhaps: not again
		}
		if errors.Is(err, mechanism.ErrCouldNotRun) && !errors.Is(err, mechanism.ErrNotRunning) && !errors.Is(err, mechanism.ErrNotFound) {
			return nil, sandbox.Invalid("could_not_run", err.Error())
		}
		return nil, mechErr("spawn", err)
	}
	ds := &directState{proc: proc, stdin: inW}
	cmd, stream := sandbox.NewCommand(p, "", ds)
	var wg sync.WaitGroup
	// A reader that falls behind slows the command (backpressure): a pump
	// waits for room before it queues what it read, so the pipe fills and
	// the command's writes block, as on a plain pipe. Nothing is dropped
	// and nothing is queued past the stream's bound. After a Stop the
	// pumps drain the pipes into nothing until the command (killed by
	// StopCommand) closes them.
	pump := func(f *os.File, out func([]byte) bool) {
		defer wg.Done()
		defer f.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := f.Read(buf)
			if n > 0 && stream.WaitRoom(context.Background(), n) {
				out(append([]byte(nil), buf[:n]...))
			}
			if err != nil {
				return
			}
		}
	}
	wg.Add(2)
	go pump(outR, stream.Stdout)
	go pump(errR, stream.Stderr)
	// The sandbox's WallClock limit bounds each command, spawned ones too
	// (the supervisor does the same for its sessions).
	var overtime atomic.Bool
	var budget *time.Timer
	if b := r.Limits.WallClock; b > 0 {
		budget = time.AfterFunc(b, func() {
			overtime.Store(true)
			_ = proc.Signal(syscall.SIGKILL)
		})
	}
	go func() {
		st, err := proc.Wait()
		if budget != nil {
			budget.Stop()
		}
		wg.Wait()
		var le *mechanism.LimitExceededError
		if overtime.Load() {
			stream.Stderr([]byte(supervisor.BudgetMessage(r.Limits.WallClock)))
		} else if errors.As(err, &le) && le.Limit != mechanism.LimitWallClock {
			stream.Stderr([]byte(supervisor.LimitMessage(string(le.Limit), le.Evidence)))
		}
		ds.closeStdin()
		if errors.Is(err, mechanism.ErrInterrupted) {
			// The sandbox's init died under it: no exit status, as when
			// a supervisor dies under its session.
			stream.Fail(sandbox.ClosedBeforeExit())
			return
		}
		if err != nil && !errors.Is(err, mechanism.ErrLimitExceeded) {
			stream.Fail(mechErr("wait", err))
			return
		}
		stream.Exit(st.Code)
	}()
	return cmd, nil
}

func (d *directState) closeStdin() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stdin != nil && !d.closed {
		d.stdin.Close()
	}
	d.closed = true
}

func (d *directState) write(data []byte) error {
	d.mu.Lock()
	f, closed := d.stdin, d.closed
	d.mu.Unlock()
	switch {
	case f == nil:
		return &sandbox.WriteFailedError{Err: errors.New("local: command was spawned without stdin")}
	case closed:
		return sandbox.ErrCommandExited
	}
	if _, err := f.Write(data); err != nil {
		if errors.Is(err, os.ErrClosed) || errors.Is(err, syscall.EPIPE) {
			return sandbox.ErrCommandExited
		}
		return &sandbox.WriteFailedError{Err: err}
	}
	return nil
}
