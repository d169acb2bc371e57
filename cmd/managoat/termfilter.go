package main

import (
	"os"

	"github.com/managoat/managoat/internal/termsafe"
)

// sessionOutputs are where a session's output goes: managoat's stdout and
// stderr, unchanged when the session has a terminal of its own (tty: its
// bytes are a terminal's, managoat's is raw) or they are no terminal (a
// pipe or a file gets every byte), and through package termsafe when they
// are a terminal managoat did not allocate for the session: there a
// workload's escape sequences (an OSC 52 clipboard write, a title report,
// text hidden by cursor moves) are shown as text instead of driving the
// user's terminal. Colours pass. logs always takes this path (tty false):
// it replays a journal onto whatever terminal managoat runs on.
func sessionOutputs(tty bool) (stdout, stderr *termsafe.Writer) {
	if tty {
		return termsafe.NewRaw(os.Stdout), termsafe.NewRaw(os.Stderr)
	}
	return termsafe.For(os.Stdout), termsafe.For(os.Stderr)
}
