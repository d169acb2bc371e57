package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"path/filepath"
	"syscall"
	"time"

	"github.com/managoat/managoat/provider/local/journal"
)

// ErrNoSupervisor means no supervisor serves the sandbox: it is stopped.
var ErrNoSupervisor = errors.New("supervisor: not running")

// Error is an error the supervisor answered with.
type Error struct {
	Code string // one of the wire codes: not_found, command_exited, ...
	Msg  string
}

func (e *Error) Error() string { return "supervisor: " + e.Code + ": " + e.Msg }

// Error codes a caller can match on Error.Code.
const (
	CodeNotFound    = codeNotFound
	CodeExited      = codeExited
	CodeStdinClosed = codeStdinClosed
	CodeInvalid     = codeInvalid
	CodeCouldNotRun = codeCouldNotRun
	CodeUnavailable = codeUnavailable
	CodeNotRunning  = codeNotRunning
	CodeUnsupported = codeUnsupported
	CodeUnconfirmed = codeUnconfirmed
	CodeInternal    = codeInternal
)

// Client talks to the supervisor of the sandbox whose directory is Dir.
// Each call uses its own connection; a Client is safe for concurrent use.
// Dial opens one connection for a sequence of calls (a spawn and the
// follow of its output, say).
type Client struct {
	Dir string
}

func (c Client) dial(ctx context.Context) (net.Conn, error) {
	addr, done, err := sockAddr(filepath.Join(c.Dir, SocketName))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNoSupervisor
		}
		return nil, err
	}
	defer done()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", addr)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) || errors.Is(err, fs.ErrNotExist) {
			return nil, ErrNoSupervisor
		}
		return nil, fmt.Errorf("supervisor: dial: %w", err)
	}
	return conn, nil
}

// roundTrip sends one request on conn and reads the answer; ctx closes
// the connection when done.
func roundTrip(ctx context.Context, conn net.Conn, dec *json.Decoder, req request) (response, error) {
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		if ctx.Err() != nil {
			return response{}, ctx.Err()
		}
		return response{}, fmt.Errorf("%w: %v", ErrNoSupervisor, err)
	}
	var resp response
	if err := dec.Decode(&resp); err != nil {
		if ctx.Err() != nil {
			return response{}, ctx.Err()
		}
		return response{}, fmt.Errorf("%w: connection lost: %v", ErrNoSupervisor, err)
	}
	if resp.Err != nil {
		return resp, &Error{Code: resp.Err.Code, Msg: resp.Err.Msg}
	}
	return resp, nil
}

func (c Client) call(ctx context.Context, req request) (response, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return response{}, err
	}
	defer conn.Close()
	return roundTrip(ctx, conn, json.NewDecoder(conn), req)
}

// Conn is one connection to a supervisor, for calls made one after the
// other; it is not safe for concurrent use.
type Conn struct {
	conn net.Conn
	dec  *json.Decoder
}

// Dial connects to the supervisor. ErrNoSupervisor (unwrapped) means
// none listens: nothing was sent, so a request may be tried again after
// a Launch.
func (c Client) Dial(ctx context.Context) (*Conn, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, err
	}
	return &Conn{conn: conn, dec: json.NewDecoder(conn)}, nil
}

// Close closes the connection.
func (k *Conn) Close() error { return k.conn.Close() }

// Spawn is Client.Spawn on this connection. An *Error with
// CodeNotRunning means the sandbox does not run and nothing started.
func (k *Conn) Spawn(ctx context.Context, r SpawnRequest) (string, error) {
	resp, err := roundTrip(ctx, k.conn, k.dec, spawnRequest(r))
	return resp.ID, err
}

func spawnRequest(r SpawnRequest) request {
	return request{Op: "spawn", Argv: r.Argv, Env: r.Env, Dir: r.Dir, Stdin: r.Stdin, Command: r.Command, TTY: r.TTY, Rows: r.Rows, Cols: r.Cols, Budget: r.Budget}
}

// PingTimeout bounds Ping: a supervisor that accepts but does not answer
// within it is reported as an error other than ErrNoSupervisor.
const PingTimeout = 5 * time.Second

// Ping reports the supervisor's pid, or ErrNoSupervisor.
func (c Client) Ping(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	r, err := c.call(ctx, request{Op: "ping"})
	return r.Pid, err
}

// SpawnRequest describes a session to start.
type SpawnRequest struct {
	Argv  []string
	Env   []string
	Dir   string
	Stdin bool
	// Budget, when positive, is how long the command may run: then the
	// supervisor kills it (SIGKILL) and says so on its stderr.
	Budget time.Duration
	// TTY runs the command on a pseudo-terminal of Rows×Cols (default
	// 24×80): its output is all stdout, stdin is the terminal's input.
	TTY        bool
	Rows, Cols int
	// Command is the command line the session reports (ListSessions);
	// "" means Argv joined by spaces.
	Command string
}

// Spawn starts a session and returns its id once the process started.
func (c Client) Spawn(ctx context.Context, r SpawnRequest) (string, error) {
	resp, err := c.call(ctx, spawnRequest(r))
	return resp.ID, err
}

// WriteStdin writes data to session id's stdin.
func (c Client) WriteStdin(ctx context.Context, id string, data []byte) error {
	_, err := c.call(ctx, request{Op: "stdin", ID: id, Data: data})
	return err
}

// CloseStdin closes session id's stdin.
func (c Client) CloseStdin(ctx context.Context, id string) error {
	_, err := c.call(ctx, request{Op: "close_stdin", ID: id})
	return err
}

// Terminate stops session id: SIGTERM, then SIGKILL after grace; force
// sends SIGKILL at once. It returns once the process was reaped.
func (c Client) Terminate(ctx context.Context, id string, force bool, grace time.Duration) error {
	_, err := c.call(ctx, request{Op: "terminate", ID: id, Force: force, Timeout: grace})
	return err
}

// Start makes the supervisor start its sandbox again (after the
// mechanism's sandbox stopped under a live supervisor).
func (c Client) Start(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: "start"})
	return err
}

// Suspend freezes the sandbox (or, where its backend cannot, stops every
// live session with SIGSTOP); Resume continues it.
func (c Client) Suspend(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: "suspend"})
	return err
}

// Resume continues what Suspend stopped.
func (c Client) Resume(ctx context.Context) error {
	_, err := c.call(ctx, request{Op: "resume"})
	return err
}

// UpdateEgress replaces the sandbox's egress allowlist.
func (c Client) UpdateEgress(ctx context.Context, allow []string) error {
	if allow == nil {
		allow = []string{}
	}
	_, err := c.call(ctx, request{Op: "policy", Allow: allow})
	return err
}

// Shutdown kills every session, stops (or destroys) the sandbox and makes
// the supervisor exit.
func (c Client) Shutdown(ctx context.Context, destroy bool) error {
	_, err := c.call(ctx, request{Op: "shutdown", Destroy: destroy})
	return err
}

// Outcome is how a followed session ended.
type Outcome struct {
	// Exited is true when the journal holds the exit record.
	Exited bool
	Code   int
	Signal int
	// Lost is true when the session's supervisor went away before the
	// exit was recorded: its output is complete as far as it was written,
	// and its exit status is unknown.
	Lost bool
}

// Follow replays session id's journal from byte zero through emit, then
// tails it until the exit record (or the session is lost). emit returning
// false, or ctx ending, stops the follow with ctx's error or nil.
// A session that is not recorded is an *Error with CodeNotFound.
func (c Client) Follow(ctx context.Context, id string, emit func(journal.Record) bool) (Outcome, error) {
	return c.FollowOn(ctx, nil, id, emit)
}

// FollowOn is Follow on k, a connection of Dial's (nil: Follow dials
// its own), which it closes when done: the connection a spawn was made
// on follows its output, with no connection of its own.
func (c Client) FollowOn(ctx context.Context, k *Conn, id string, emit func(journal.Record) bool) (Outcome, error) {
	if k != nil {
		defer k.Close()
	}
	if !HasSession(c.Dir, id) {
		return Outcome{}, &Error{Code: codeNotFound, Msg: fmt.Sprintf("no session %q", id)}
	}
	r, err := journal.Open(JournalPath(c.Dir, id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Outcome{}, &Error{Code: codeNotFound, Msg: fmt.Sprintf("no session %q", id)}
		}
		return Outcome{}, err
	}
	defer r.Close()
	var out Outcome
	stopped := false
	var noted int64
	var conn net.Conn
	var dec *json.Decoder
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	// The follower tells the supervisor where it is, from the start and
	// every followReport bytes (readers.go): while it is behind, the
	// journal's cap drops nothing it has not read, and the command waits.
	if k != nil {
		conn, dec = k.conn, k.dec
	} else if cn, err := c.dial(ctx); err == nil {
		conn, dec = cn, json.NewDecoder(cn)
	}
	if conn != nil {
		_, _ = roundTrip(ctx, conn, dec, request{Op: "at", ID: id, Offset: 0})
	}
	var reported int64
	deliver := func(rec journal.Record) error {
		if s := r.Skipped(); s > noted {
			// The journal's cap dropped older output: say so, in order.
			if !emit(journal.Record{Kind: journal.KindStderr, Data: []byte(DroppedMessage(s - noted))}) {
				stopped = true
				return errStopRead
			}
			noted = s
		}
		if rec.Kind == journal.KindExit {
			out = Outcome{Exited: true, Code: rec.Code, Signal: rec.Signal}
			return errStopRead
		}
		if !emit(rec) {
			stopped = true
			return errStopRead
		}
		if conn != nil && rec.Offset-reported >= followReport {
			reported = rec.Offset
			if _, err := roundTrip(ctx, conn, dec, request{Op: "at", ID: id, Offset: rec.Offset}); err != nil && ctx.Err() == nil {
				conn.Close() // gone: the wait below dials again, or finds it gone
				conn = nil
			}
		}
		return nil
	}
	read := func(limit int64) (bool, error) {
		_, err := r.Read(limit, deliver)
		if err == errStopRead {
			return true, nil
		}
		return false, err
	}
	// finish reads what is left after the supervisor is gone.
	finish := func() (Outcome, error) {
		if end, err := read(-1); err != nil || end {
			return out, err
		}
		if k, data, ok := r.Tail(); ok && len(data) > 0 {
			if !emit(journal.Record{Kind: k, Data: data}) {
				return out, nil
			}
		}
		return Outcome{Lost: true}, nil
	}
	for {
		if ctx.Err() != nil {
			return out, ctx.Err()
		}
		// Read whatever whole records are on disk already; ask the
		// supervisor only when there is nothing new (a record still being
		// written stays pending until it is whole).
		before := r.Offset()
		if end, err := read(-1); err != nil || end || stopped {
			return out, err
		}
		if r.Offset() != before {
			continue
		}
		if conn == nil {
			conn, err = c.dial(ctx)
			if err != nil {
				if errors.Is(err, ErrNoSupervisor) {
					return finish()
				}
				return out, err
			}
			dec = json.NewDecoder(conn)
		}
		resp, err := roundTrip(ctx, conn, dec, request{Op: "wait", ID: id, Offset: r.Offset()})
		if err != nil {
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			var se *Error
			if errors.As(err, &se) && se.Code == codeNotFound {
				return out, err
			}
			// The supervisor went away: what is on disk is all there is.
			return finish()
		}
		if !resp.Live {
			return finish()
		}
		end, err := read(resp.Size)
		if err != nil || end || stopped {
			return out, err
		}
		if resp.Done {
			return finish()
		}
	}
}

var errStopRead = errors.New("stop")

// DroppedMessage is the line a follower gets where the session's journal
// cap dropped n bytes of older output before it read them.
func DroppedMessage(n int64) string {
	return fmt.Sprintf("[managoat: %d bytes of older output were dropped: the session's journal keeps only its latest output]\n", n)
}
