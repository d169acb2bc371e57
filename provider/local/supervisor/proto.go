package supervisor

import (
	"encoding/json"
	"fmt"
	"time"
)

// request is one message from a client; Op selects the fields used.
type request struct {
	Op string `json:"op"`

	// spawn
	Argv  []string `json:"argv,omitempty"`
	Env   []string `json:"env,omitempty"`
	Dir   string   `json:"dir,omitempty"`
	Stdin bool     `json:"stdin,omitempty"`
	TTY   bool     `json:"tty,omitempty"`
	Rows  int      `json:"rows,omitempty"`
	Cols  int      `json:"cols,omitempty"`
	// Command is the command line sessions report; "" means Argv joined.
	Command string `json:"command,omitempty"`
	// Budget bounds the command's run (SpawnRequest.Budget).
	Budget time.Duration `json:"budget,omitempty"`

	// session-addressed operations
	ID     string `json:"id,omitempty"`
	Offset int64  `json:"offset,omitempty"`
	Data   []byte `json:"data,omitempty"`

	// terminate
	Force   bool          `json:"force,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`

	// policy
	Allow []string `json:"allow,omitempty"`

	// shutdown
	Destroy bool `json:"destroy,omitempty"`

	// signal (a session's process group); resize takes Rows and Cols
	Signal int `json:"signal,omitempty"`
}

// response answers one request.
type response struct {
	Err *wireError `json:"err,omitempty"`

	ID   string `json:"id,omitempty"`  // spawn
	Pid  int    `json:"pid,omitempty"` // spawn, ping
	Size int64  `json:"size,omitempty"`
	// Done: the session's exit record is in the journal (wait).
	Done bool `json:"done,omitempty"`
	// Live: this supervisor owns the session (wait); a session not live and
	// not done was lost with an earlier supervisor.
	Live bool `json:"live,omitempty"`
}

// Error codes on the wire.
const (
	codeNotFound    = "not_found"
	codeExited      = "command_exited"
	codeStdinClosed = "stdin_closed"
	codeInvalid     = "invalid"
	codeCouldNotRun = "could_not_run"
	codeUnavailable = "unavailable"
	codeNotRunning  = "not_running"
	codeUnsupported = "not_supported"
	codeUnconfirmed = "termination_unconfirmed"
	codeInternal    = "internal"
)

type wireError struct {
	Code string `json:"code"`
	Msg  string `json:"msg"`
}

// SessionMeta is what the supervisor records about a session on disk, in
// sessions/<id>/meta.json.
type SessionMeta struct {
	ID        string    `json:"id"`
	Command   string    `json:"command"`
	Argv      []string  `json:"argv"`
	CreatedAt time.Time `json:"created_at"`
	Pid       int       `json:"pid,omitempty"`
	// StartTicks is the process's start time (field 22 of /proc/<pid>/stat),
	// so a later supervisor can tell the process from a recycled pid.
	StartTicks uint64 `json:"start_ticks,omitempty"`
	Stdin      bool   `json:"stdin,omitempty"`
	TTY        bool   `json:"tty,omitempty"`
	// Budget is how long the command may run (0: no bound).
	Budget time.Duration `json:"budget,omitempty"`
}

// BudgetMessage is what a command killed at the end of its budget gets on
// its stderr, after its own output.
func BudgetMessage(budget time.Duration) string {
	return fmt.Sprintf("\nmanagoat: killed: the command ran out of its budget of %v (the sandbox's WallClock limit, --timeout)\n", budget)
}

// A LimitError, returned by Process.Wait with the exit status filled in,
// says which of the sandbox's limits stopped the command (memory: the
// kernel's OOM killer; pids: a fork refused), from the kernel's counters.
// The session gets LimitMessage on its stderr and ends with its real code.
type LimitError struct {
	Limit    string // "memory" or "pids"
	Evidence string // the counter that moved
}

func (e *LimitError) Error() string { return "limit " + e.Limit + " exceeded: " + e.Evidence }

// LimitMessage is what a command stopped by a limit gets on its stderr,
// after its own output.
func LimitMessage(limit, evidence string) string {
	if limit == "memory" {
		return fmt.Sprintf("\nmanagoat: out of memory: the sandbox's memory limit (--memory) killed a process (%s)\n", evidence)
	}
	return fmt.Sprintf("\nmanagoat: the sandbox's %s limit stopped the command (%s)\n", limit, evidence)
}

func (m SessionMeta) marshal() []byte {
	b, _ := json.Marshal(m)
	return b
}
