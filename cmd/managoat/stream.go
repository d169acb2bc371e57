package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/sandbox"
)

func isTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// spinner shows a spinner on stderr while slow work runs, only when stderr
// is a terminal and the work takes over 200 ms. Stop clears it.
type spinner struct {
	stop chan struct{}
	done sync.WaitGroup
}

func startSpinner(msg string) *spinner {
	s := &spinner{stop: make(chan struct{})}
	if !isTerminal(os.Stderr) {
		return s
	}
	s.done.Go(func() {
		select {
		case <-s.stop:
			return
		case <-time.After(200 * time.Millisecond):
		}
		frames := `|/-\`
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		start := time.Now()
		for i := 0; ; i++ {
			fmt.Fprintf(os.Stderr, "\r%c %s (%.1fs)", frames[i%4], msg, time.Since(start).Seconds())
			select {
			case <-s.stop:
				fmt.Fprint(os.Stderr, "\r\033[K")
				return
			case <-t.C:
			}
		}
	})
	return s
}

func (s *spinner) Stop() {
	close(s.stop)
	s.done.Wait()
}

// forwardStdin copies r into the command's stdin, then closes it.
func forwardStdin(ctx context.Context, c *sandbox.Command, r io.Reader) {
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if werr := c.WriteStdin(ctx, append([]byte(nil), buf[:n]...)); werr != nil {
				return
			}
		}
		if err != nil {
			_ = c.CloseStdin(ctx)
			return
		}
	}
}

// pump writes a command's events to stdout/stderr until its terminal event
// or until ctx is cancelled. It returns the exit code, the stream's error,
// or ctx's error.
func pump(ctx context.Context, c *sandbox.Command, stdout, stderr io.Writer) (int, error) {
	for {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case ev, ok := <-c.Events():
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
