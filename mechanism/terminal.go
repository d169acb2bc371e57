package mechanism

import (
	"context"
	"os"
)

// Terminals is implemented by a mechanism whose sandboxes have a devpts
// of their own: OpenTerminal opens a pseudo-terminal pair in it, so a
// session's terminal has a name inside the sandbox (tty, ttyname and
// programs that reopen their terminal work), where a pair from the
// host's devpts would be a device the sandbox cannot name. The caller
// owns both files; the slave becomes the process's stdin, stdout and
// stderr.
type Terminals interface {
	OpenTerminal(ctx context.Context, id string) (master, slave *os.File, err error)
}
