package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/sandbox"
)

// Interactive use, as docker run/exec -it: -t gives the command a PTY,
// managoat's terminal goes raw for as long as it runs (and is restored on
// every way out), and its window size follows managoat's (SIGWINCH). The
// signals managoat gets (SIGINT, SIGTERM, SIGHUP) go to the command
// (--sig-proxy, on by default), and a key sequence on stdin (Ctrl-P
// Ctrl-Q, --detach-keys) detaches, leaving the command running; only when
// stdin is a terminal (as docker): a pipe's or a file's bytes all go to
// the command. Raw mode is set with termios through x/sys/unix
// (cfmakeraw's flags): the module that wraps it, golang.org/x/term, is
// not among this build's modules.

// ioFlags are -i, -t (and -it), --detach-keys and --sig-proxy.
type ioFlags struct {
	interactive, tty, it bool
	detachKeys           string
	sigProxy             bool
	detach               bool // whether this command can detach
}

func (f *ioFlags) add(fs *flag.FlagSet, tty, detach bool) {
	f.detach = detach
	if tty {
		fs.BoolVar(&f.interactive, "i", false, "keep stdin open (it is forwarded in any case; accepted as docker's)")
		fs.BoolVar(&f.tty, "t", false, "give the command a terminal (PTY); managoat's own goes raw while it runs")
		fs.BoolVar(&f.it, "it", false, "the same as -i -t")
	}
	fs.BoolVar(&f.sigProxy, "sig-proxy", true, "send the signals managoat gets (SIGINT, SIGTERM, SIGHUP) to the command")
	if detach {
		fs.StringVar(&f.detachKeys, "detach-keys", "ctrl-p,ctrl-q", "the key `SEQUENCE` on stdin that detaches, leaving the command running (when stdin is a terminal; on a pipe every byte is data)")
	}
}

func (f *ioFlags) wantTTY() bool { return f.tty || f.it }

// keys is the detach sequence, or a usage error.
func (f *ioFlags) keys() ([]byte, error) {
	if !f.detach || f.detachKeys == "" {
		return nil, nil
	}
	var out []byte
	for _, k := range strings.Split(f.detachKeys, ",") {
		k = strings.TrimSpace(k)
		if c, ok := strings.CutPrefix(strings.ToLower(k), "ctrl-"); ok && len(c) == 1 {
			switch b := c[0]; {
			case b >= 'a' && b <= 'z':
				out = append(out, b-'a'+1)
				continue
			case b == '@' || b == '[' || b == '\\' || b == ']' || b == '^' || b == '_':
				out = append(out, (b-'@')&0x1f)
				continue
			}
		} else if len(k) == 1 {
			out = append(out, k[0])
			continue
		}
		return nil, usageError{msg: fmt.Sprintf("--detach-keys %q: each key is ctrl-LETTER or one character, comma-separated", f.detachKeys)}
	}
	return out, nil
}

// winsize is the terminal size of managoat's stdin (or stdout).
func winsize() (rows, cols int, ok bool) {
	for _, f := range []*os.File{os.Stdin, os.Stdout} {
		if ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ); err == nil && ws.Row > 0 && ws.Col > 0 {
			return int(ws.Row), int(ws.Col), true
		}
	}
	return 0, 0, false
}

// makeRaw puts the terminal fd in raw mode and returns what restores it.
func makeRaw(fd int) (restore func(), err error) {
	old, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN] = 1
	t.Cc[unix.VTIME] = 0
	if err := unix.IoctlSetTermios(fd, unix.TCSETS, &t); err != nil {
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { _ = unix.IoctlSetTermios(fd, unix.TCSETS, old) }) }, nil
}

// signalHook, when set, gets the signals notifyContext catches first; it
// returns whether it took the signal (then the command's context is not
// cancelled).
var signalHook atomic.Pointer[func(os.Signal) bool]

// session is one command's I/O with managoat's terminal.
type session struct {
	p     sandbox.Provider
	cmd   *sandbox.Command
	flags *ioFlags
	keys  []byte
	stdin bool // forward managoat's stdin
}

// errDetached is the outcome of a detach key sequence.
var errDetached = errors.New("detached")

// run copies the command's output, forwards stdin (watching for the
// detach keys), proxies signals and the window size, until the command
// ends (its code), ctx ends (ctx's error), or a detach (errDetached).
func (s *session) run(ctx context.Context) (int, error) {
	tty := s.flags.wantTTY()
	stdout, stderr := sessionOutputs(tty) // termfilter.go
	if tty && isTerminal(os.Stdin) {
		if restore, err := makeRaw(int(os.Stdin.Fd())); err == nil {
			defer restore()
		}
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if sig, ok := s.p.(sandbox.CommandSignaler); ok && s.flags.sigProxy {
		hook := func(v os.Signal) bool {
			sv, ok := v.(syscall.Signal)
			if !ok {
				return false
			}
			sctx, c := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer c()
			err := sig.SignalCommand(sctx, s.cmd, sv)
			return err == nil || errors.Is(err, sandbox.ErrCommandExited)
		}
		signalHook.Store(&hook)
		defer signalHook.Store(nil)
	}
	if rz, ok := s.p.(sandbox.TTYResizer); ok && tty {
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-winch:
					if rows, cols, ok := winsize(); ok {
						_ = rz.ResizeTTY(ctx, s.cmd, rows, cols)
					}
				}
			}
		})
	}
	if !isTerminal(os.Stdin) {
		// As docker: the detach keys are a terminal's. On a pipe or a
		// file, stdin is data, every byte of it the command's (a
		// random file holds Ctrl-P Ctrl-Q about once in 64 KiB).
		s.keys = nil
	}
	detached := make(chan struct{})
	if s.stdin {
		// Not waited for: a read of managoat's stdin cannot be cut short,
		// and the process ends after the command.
		go s.forward(ctx, detached)
	}
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-detached:
			return 0, errDetached
		case ev, ok := <-s.cmd.Events():
			if !ok {
				return 0, sandbox.ClosedBeforeExit()
			}
			switch ev.Kind {
			case sandbox.Stdout:
				_, _ = stdout.Write(ev.Data)
			case sandbox.Stderr:
				_, _ = stderr.Write(ev.Data)
			case sandbox.Exit:
				return ev.Code, nil
			case sandbox.Error:
				return 0, ev.Err
			}
		}
	}
}

// forward copies managoat's stdin to the command's, closing it at the
// end; the detach keys, seen in a row, close detached instead of being
// sent (a partial match is sent once it fails).
func (s *session) forward(ctx context.Context, detached chan struct{}) {
	buf := make([]byte, 32<<10)
	matched := 0
	for {
		n, err := os.Stdin.Read(buf)
		if n > 0 {
			out := make([]byte, 0, n+matched)
			for _, b := range buf[:n] {
				if len(s.keys) > 0 && b == s.keys[matched] {
					matched++
					if matched == len(s.keys) {
						if len(out) > 0 {
							_ = s.cmd.WriteStdin(ctx, out)
						}
						close(detached)
						return
					}
					continue
				}
				out = append(out, s.keys[:matched]...)
				matched = 0
				if len(s.keys) > 0 && b == s.keys[0] {
					matched = 1
					continue
				}
				out = append(out, b)
			}
			if len(out) > 0 {
				if werr := s.cmd.WriteStdin(ctx, out); werr != nil {
					return
				}
			}
		}
		if err != nil {
			if matched > 0 {
				// A partial detach sequence at the end is data.
				if werr := s.cmd.WriteStdin(ctx, append([]byte(nil), s.keys[:matched]...)); werr != nil {
					return
				}
			}
			if err == io.EOF || !errors.Is(err, os.ErrClosed) {
				_ = s.cmd.CloseStdin(ctx)
			}
			return
		}
	}
}

// spawnOptions fills o's terminal fields from the flags and managoat's
// terminal.
func (f *ioFlags) spawnOptions(o sandbox.SpawnOptions) sandbox.SpawnOptions {
	if f.wantTTY() {
		o.TTY = true
		if rows, cols, ok := winsize(); ok {
			o.TTYRows, o.TTYCols = rows, cols
		}
	}
	return o
}
