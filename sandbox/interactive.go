package sandbox

import (
	"context"
	"syscall"
)

// CommandSignaler is implemented by providers that can send a signal to a
// running command's process group: a CLI proxies the signals it gets to
// the command (as docker's --sig-proxy). A command that already ended is
// ErrCommandExited.
type CommandSignaler interface {
	SignalCommand(ctx context.Context, c *Command, sig syscall.Signal) error
}

// TTYResizer is implemented by providers that can change the window size
// of a command spawned with a PTY (SpawnOptions.TTY), as a terminal's
// SIGWINCH asks; the command gets SIGWINCH from its terminal.
type TTYResizer interface {
	ResizeTTY(ctx context.Context, c *Command, rows, cols int) error
}
