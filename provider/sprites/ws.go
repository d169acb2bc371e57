package sprites

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/managoat/managoat/sandbox"
)

// The exec protocol's stream ids: the first byte of every binary frame
// outside TTY mode.
const (
	streamStdin    = 0
	streamStdout   = 1
	streamStderr   = 2
	streamExit     = 3
	streamStdinEOF = 4
)

const (
	dialTimeout  = 20 * time.Second // TCP connect and upgrade, 10 s each in the Elixir adapter
	writeTimeout = 30 * time.Second // one stdin frame
	readLimit    = 8 << 20          // largest frame accepted from Sprites
	closeGrace   = time.Second      // after the exit, as the SDK's stop grace
)

// infoTimeout bounds Spawn's wait for session_info, which Sprites sends
// first on every exec socket (sprites-go waits 30 s for it). A variable
// only so that a test can shorten it.
var infoTimeout = 10 * time.Second

// ReasonNoSessionInfo is the UnavailableError reason of a detachable
// Spawn whose socket announced no session id within the bound.
const ReasonNoSessionInfo = "no_session_info"

// wsCommand is a Command's Private state: the socket and what the
// session_info control message said.
type wsCommand struct {
	conn   *websocket.Conn
	stream *sandbox.Stream
	cancel context.CancelFunc // ends the reader
	done   chan struct{}      // closed when the reader returned

	info     chan struct{} // closed at the first session_info, or at the exit
	infoOnce sync.Once

	mu        sync.Mutex
	tty       bool
	sessionID string
	stopped   bool
}

func (w *wsCommand) String() string { return "sprites exec" }

// SessionID returns the Sprites session id the server announced for this
// command, or "" when none was announced (yet).
func SessionID(c *sandbox.Command) string {
	w, ok := c.Private.(*wsCommand)
	if !ok {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sessionID
}

func (w *wsCommand) isTTY() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tty
}

// wsURL is the exec endpoint: the REST base with http→ws.
func (p *Provider) wsURL(path string, q url.Values) string {
	base := p.cfg.BaseURL
	switch {
	case strings.HasPrefix(base, "https://"):
		base = "wss://" + strings.TrimPrefix(base, "https://")
	case strings.HasPrefix(base, "http://"):
		base = "ws://" + strings.TrimPrefix(base, "http://")
	}
	u := base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	return u
}

// dial opens the exec WebSocket. A refused upgrade is mapped through the
// §3.2 table (the Elixir adapter left these un-normalised, so a 401 looked
// transient): 401/403 Denied, 404 ErrNotFound, 429 RateLimited, 5xx (a
// fresh sprite's 503) Unavailable, anything else Invalid.
func (p *Provider) dial(ctx context.Context, u string) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	hdr := http.Header{}
	hdr.Set("Authorization", "Bearer "+p.cfg.Token)
	hdr.Set("User-Agent", "managoat-sprites")
	conn, resp, err := websocket.Dial(dctx, u, &websocket.DialOptions{HTTPClient: p.ws, HTTPHeader: hdr})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var body []byte
			if resp.Body != nil {
				body, _ = io.ReadAll(io.LimitReader(resp.Body, 1024))
				resp.Body.Close()
			}
			return nil, statusError(resp.StatusCode, body, resp.Header)
		}
		if resp != nil && resp.Body != nil {
			resp.Body.Close()
		}
		return nil, p.transportError(ctx, dctx, err)
	}
	conn.SetReadLimit(readLimit)
	return conn, nil
}

// Spawn starts c over the exec WebSocket and returns once Sprites accepted
// the upgrade, which is its acknowledgement of the process.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, sandbox.Invalid("command", "empty command name")
	}
	q := url.Values{}
	q.Set("path", c.Name)
	for _, a := range c.Argv() {
		q.Add("cmd", a)
	}
	q.Set("stdin", strconv.FormatBool(opts.Stdin))
	if opts.Dir != "" {
		q.Set("dir", opts.Dir)
	}
	for _, e := range opts.Env {
		q.Add("env", e)
	}
	if opts.TTY {
		rows, cols := opts.TTYRows, opts.TTYCols
		if rows <= 0 {
			rows = 24
		}
		if cols <= 0 {
			cols = 80
		}
		q.Set("tty", "true")
		q.Set("rows", strconv.Itoa(rows))
		q.Set("cols", strconv.Itoa(cols))
	}
	if opts.Detachable {
		// Sprites keeps a non-TTY process 10 s after its socket goes
		// unless told otherwise; 0 is "forever", what a session that
		// must outlive its client needs (the exec API reference; the
		// detachable parameter is no longer documented).
		q.Set("max_run_after_disconnect", "0")
	}
	conn, err := p.dial(ctx, p.wsURL(p.spritePath(h.Name, "exec"), q))
	if err != nil {
		return nil, err
	}
	cmd := p.start(conn, opts.TTY)
	if !opts.Stdin && !opts.TTY {
		// Like the SDKs: a command without stdin gets its EOF at once.
		_ = p.send(cmd, []byte{streamStdinEOF})
	}
	// The session id is the process's PID, announced in session_info;
	// it is read, never guessed from a listing (which shows the session
	// only once the process exists).
	w := cmd.Private.(*wsCommand)
	t := time.NewTimer(infoTimeout)
	defer t.Stop()
	select {
	case <-w.info:
	case <-w.done: // ended before announcing itself: the stream says how
	case <-t.C:
		if opts.Detachable {
			_ = cmd.Stop()
			return nil, &sandbox.UnavailableError{Reason: ReasonNoSessionInfo,
				Err: errors.New("Sprites announced no session id within " + infoTimeout.String())}
		}
	case <-ctx.Done():
		// The process may be running already: learn its id (bounded) so
		// that a spawn given up by its caller does not leave it behind.
		t2 := time.NewTimer(infoTimeout)
		select {
		case <-w.info:
		case <-w.done:
		case <-t2.C:
		}
		t2.Stop()
		if id := SessionID(cmd); id != "" && !cmd.Finished() {
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = p.TerminateSession(kctx, h, id, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second})
			cancel()
		}
		_ = cmd.Stop()
		return nil, ctx.Err()
	}
	cmd.SessionID = SessionID(cmd)
	return cmd, nil
}

// Attach re-joins a session: Sprites replays its buffered output from byte
// zero, then tails it. The path form /exec/{id} is tried first; on a 404
// the legacy ?id= form is tried once, and a second 404 is ErrNotFound.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.AttachOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	q := url.Values{"stdin": {strconv.FormatBool(opts.Stdin)}}
	conn, err := p.dial(ctx, p.wsURL(p.spritePath(h.Name, "exec", escapeSegment(sessionID)), q))
	if errors.Is(err, sandbox.ErrNotFound) {
		q.Set("id", sessionID)
		conn, err = p.dial(ctx, p.wsURL(p.spritePath(h.Name, "exec"), q))
	}
	if err != nil {
		return nil, err
	}
	// The session's TTY mode arrives in its session_info message, before
	// any replayed output.
	cmd := p.start(conn, false)
	cmd.SessionID = sessionID
	return cmd, nil
}

// start wraps an open socket in a Command and runs its reader.
func (p *Provider) start(conn *websocket.Conn, tty bool) *sandbox.Command {
	rctx, cancel := context.WithCancel(context.Background())
	w := &wsCommand{conn: conn, cancel: cancel, done: make(chan struct{}), info: make(chan struct{}), tty: tty}
	cmd, stream := sandbox.NewCommand(p, "", w)
	w.stream = stream
	go w.read(rctx)
	return cmd
}

// read turns frames into events until the exit, then closes the socket.
// A socket that ends without an exit (a close frame or a dropped
// connection) is ClosedBeforeExit, never exit 0. Frames already queued
// before a close are read first, so a queued exit still wins.
func (w *wsCommand) read(ctx context.Context) {
	defer close(w.done)
	defer w.cancel()
	for {
		typ, data, err := w.conn.Read(ctx)
		if err != nil {
			w.mu.Lock()
			stopped := w.stopped
			w.mu.Unlock()
			if !stopped {
				var cause error
				if websocket.CloseStatus(err) == -1 {
					cause = err
				}
				w.stream.Fail(&sandbox.UnavailableError{Reason: sandbox.ReasonClosedBeforeExit, Err: cause})
			}
			_ = w.conn.CloseNow()
			return
		}
		if typ == websocket.MessageText {
			if code, ok := w.control(data); ok {
				w.finish(ctx, code)
				return
			}
			continue
		}
		if w.isTTY() {
			w.stream.Stdout(data)
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case streamStdout:
			w.stream.Stdout(data[1:])
		case streamStderr:
			w.stream.Stderr(data[1:])
		case streamExit:
			// One byte of code; an empty payload means 0 and trailing
			// bytes are ignored.
			code := 0
			if len(data) > 1 {
				code = int(data[1])
			}
			w.finish(ctx, code)
			return
		}
	}
}

// finish delivers the exit, then lets Sprites close the socket (its close
// frame is answered by Read) for at most closeGrace before closing it.
func (w *wsCommand) finish(ctx context.Context, code int) {
	w.stream.Exit(code)
	w.infoOnce.Do(func() { close(w.info) }) // no session_info comes after the exit
	ctx, cancel := context.WithTimeout(ctx, closeGrace)
	defer cancel()
	for {
		if _, _, err := w.conn.Read(ctx); err != nil {
			break
		}
	}
	_ = w.conn.CloseNow()
}

// control handles a JSON text frame: session_info records the session id
// and TTY mode; exit (TTY mode) carries the code as exit_code or code. The
// port notification is dropped: it is not a contract event.
func (w *wsCommand) control(data []byte) (int, bool) {
	var m struct {
		Type      string          `json:"type"`
		SessionID json.RawMessage `json:"session_id"`
		TTY       *bool           `json:"tty"`
		ExitCode  *int            `json:"exit_code"`
		Code      *int            `json:"code"`
	}
	if json.Unmarshal(data, &m) != nil {
		return 0, false
	}
	switch m.Type {
	case "session_info":
		w.mu.Lock()
		if m.TTY != nil {
			w.tty = *m.TTY
		}
		var s string
		if json.Unmarshal(m.SessionID, &s) == nil {
			w.sessionID = s
		} else if len(m.SessionID) > 0 && m.SessionID[0] != 'n' {
			w.sessionID = string(m.SessionID) // a number: the PID
		}
		w.mu.Unlock()
		w.infoOnce.Do(func() { close(w.info) })
	case "exit":
		switch {
		case m.ExitCode != nil:
			return *m.ExitCode, true
		case m.Code != nil:
			return *m.Code, true
		}
		return 0, true
	}
	return 0, false
}

func (p *Provider) send(c *sandbox.Command, frame []byte) error {
	w, ok := c.Private.(*wsCommand)
	if !ok || w == nil {
		return sandbox.ErrCommandExited
	}
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	return w.conn.Write(ctx, websocket.MessageBinary, frame)
}

// WriteStdin sends data as one stdin frame (raw bytes in TTY mode). A write
// that fails because the command exited, or because this end was stopped,
// is ErrCommandExited (the Elixir adapter returned a bare not_connected); any
// other failure is WriteFailed.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	if err := sandbox.CheckCommand(c, ProviderName); err != nil {
		return err
	}
	w, ok := c.Private.(*wsCommand)
	if !ok || w == nil {
		return sandbox.ErrCommandExited
	}
	if w.stream.Terminated() {
		// The exit or the drop was delivered; the socket may still take a
		// write (a peer's close is seen by the next read, not this write).
		return sandbox.ErrCommandExited
	}
	frame := data
	if !w.isTTY() {
		frame = append([]byte{streamStdin}, data...)
	}
	err := p.send(c, frame)
	if err == nil {
		return nil
	}
	// Give the reader a moment to see the exit that likely closed the
	// socket, so a write racing the exit reads as exited.
	select {
	case <-w.done:
	case <-time.After(time.Second):
	case <-ctx.Done():
	}
	w.mu.Lock()
	stopped := w.stopped
	w.mu.Unlock()
	if stopped || w.stream.Terminated() {
		return sandbox.ErrCommandExited
	}
	return &sandbox.WriteFailedError{Err: err}
}

// CloseStdin sends stdin EOF (frame 4; a raw ^D in TTY mode). It is fire
// and forget: nil even when the command is gone.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	if err := sandbox.CheckCommand(c, ProviderName); err != nil {
		return err
	}
	w, ok := c.Private.(*wsCommand)
	if !ok || w == nil {
		return nil
	}
	frame := []byte{streamStdinEOF}
	_ = p.send(c, frame) // in TTY mode 0x04 is the terminal's EOF character
	return nil
}

// StopCommand closes this end's socket. The remote process keeps running
// when it was spawned detachable. It is total.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if c == nil {
		return nil
	}
	w, ok := c.Private.(*wsCommand)
	if !ok || w == nil {
		return nil
	}
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
	_ = w.conn.CloseNow()
	w.cancel()
	<-w.done
	return nil
}

// Exec spawns c without stdin and collects its output under one deadline
// that output never renews. A socket that closes without an exit is
// Unavailable{closed_before_exit}, never the partial output.
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		budget := opts.Timeout
		if dl, ok := ctx.Deadline(); ok && budget <= 0 {
			budget = time.Until(dl)
		}
		cmd, err := p.Spawn(ctx, h, c, sandbox.SpawnOptions{Env: opts.Env, Dir: opts.Dir})
		if err != nil {
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return sandbox.ExecResult{}, sandbox.ExecTimeout(budget)
			}
			return sandbox.ExecResult{}, err
		}
		defer cmd.Stop()
		res, err := sandbox.CollectExecMax(ctx, cmd, opts.StderrToStdout, budget, opts.MaxOutput, nil)
		if sandbox.IsExecTimeout(err) && cmd.SessionID != "" {
			// Sprites runs a non-TTY process 10 s past its socket; an exec
			// past its deadline is killed now, through its session.
			kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			_ = p.TerminateSession(kctx, h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second})
			cancel()
		}
		return res, err
	})
}
