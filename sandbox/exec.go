package sandbox

import (
	"bytes"
	"context"
	"errors"
	"time"
)

// CollectExec is for Provider implementations whose Exec runs over a
// stream: it reads c's events until the terminal one under a single
// monotonic deadline (ctx's) that output never renews. The deadline is
// checked before every receive, so queued output cannot starve it, and once
// more after the exit. On expiry it stops c (the local end only) and returns
// ExecTimeout(budget). A stream that closes without an exit is
// ClosedBeforeExit, never a partial result; an Error event returns its error
// after passing it through normalize (nil means unchanged).
func CollectExec(ctx context.Context, c *Command, stderrToStdout bool, budget time.Duration, normalize func(error) error) (ExecResult, error) {
	return CollectExecMax(ctx, c, stderrToStdout, budget, 0, normalize)
}

// CollectExecMax is CollectExec keeping at most max bytes of output (0:
// no cap): the rest is read and dropped, and the result is Truncated.
func CollectExecMax(ctx context.Context, c *Command, stderrToStdout bool, budget time.Duration, max int, normalize func(error) error) (ExecResult, error) {
	var out bytes.Buffer
	truncated := false
	keep := func(p []byte) {
		if max > 0 && out.Len()+len(p) > max {
			p = p[:max-out.Len()]
			truncated = true
		}
		out.Write(p)
	}
	expired := func() error {
		if ctx.Err() == nil {
			return nil
		}
		_ = c.Stop()
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return ExecTimeout(budget)
		}
		return ctx.Err()
	}
	events := c.Events()
	for {
		if err := expired(); err != nil {
			return ExecResult{}, err
		}
		select {
		case <-ctx.Done():
			continue
		case ev, ok := <-events:
			if !ok {
				return ExecResult{}, ClosedBeforeExit()
			}
			switch ev.Kind {
			case Stdout:
				keep(ev.Data)
			case Stderr:
				if stderrToStdout {
					keep(ev.Data)
				}
			case Exit:
				if err := expired(); err != nil {
					return ExecResult{}, err
				}
				return ExecResult{Output: out.Bytes(), ExitCode: ev.Code, Truncated: truncated}, nil
			case Error:
				err := ev.Err
				if normalize != nil {
					err = normalize(err)
				}
				return ExecResult{}, err
			}
		}
	}
}
