package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// ReconnectFor bounds how long a stream of a session (an attach, a
// detachable spawn) whose socket dropped is dialled again before its
// command ends Unavailable{closed_before_exit}.
var ReconnectFor = 15 * time.Second

// streamConn is a Command's socket.
type streamConn struct {
	c     *Client
	name  string
	start api.StreamStart // what a reconnect attaches with (Op attach)
	// resumable: the command is a session that outlives its socket, so a
	// dropped socket is dialled again and attached at delivered.
	resumable bool
	delivered int64 // output bytes passed on; read and written by read only
	ctx       context.Context
	cancel    context.CancelFunc

	mu      sync.Mutex
	ws      *websocket.Conn
	next    int64
	acks    map[int64]chan *api.Error
	stopped bool
	done    chan struct{} // closed when the reader ends
}

func (sc *streamConn) conn() *websocket.Conn {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.ws
}

// Spawn starts a command; its output streams over a WebSocket.
func (c *Client) Spawn(ctx context.Context, h *sandbox.Handle, cmd sandbox.Cmd, o sandbox.SpawnOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	return c.open(ctx, h.Name, api.StreamStart{Op: "spawn", Cmd: cmd.Name, Args: cmd.Args, Env: o.Env, Dir: o.Dir, Stdin: o.Stdin,
		TTY: o.TTY, Rows: o.TTYRows, Cols: o.TTYCols, Detachable: o.Detachable})
}

// Attach replays a session's output from byte zero, then tails it.
func (c *Client) Attach(ctx context.Context, h *sandbox.Handle, sessionID string, o sandbox.AttachOptions) (*sandbox.Command, error) {
	return c.AttachAt(ctx, h, sessionID, 0, o)
}

// AttachAt attaches to a session past its first offset output bytes
// (stdout and stderr together, in the journal's order): the platform
// skips those, so a caller that has them gets each byte once.
//
// The stream of a session (this, and a detachable Spawn) survives its
// socket: one that drops before the command's end is dialled again and
// attached at the bytes already delivered, for up to ReconnectFor, so no
// byte is lost or repeated. Stdin sent while the socket was down, or not
// acknowledged before it dropped, is Unavailable{transport}: it may or
// may not have been written.
func (c *Client) AttachAt(ctx context.Context, h *sandbox.Handle, sessionID string, offset int64, o sandbox.AttachOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	if offset < 0 {
		return nil, sandbox.Invalid("offset", "offset is a count of output bytes, 0 or more")
	}
	return c.open(ctx, h.Name, api.StreamStart{Op: "attach", SessionID: sessionID, Stdin: o.Stdin, Offset: offset})
}

func (c *Client) open(ctx context.Context, name string, start api.StreamStart) (*sandbox.Command, error) {
	ws, m, err := c.dial(ctx, name, start)
	if err != nil {
		return nil, err
	}
	sc := &streamConn{c: c, name: name, ws: ws, acks: map[int64]chan *api.Error{}, done: make(chan struct{}),
		resumable: m.SessionID != "" && (start.Op == "attach" || start.Detachable),
		start:     api.StreamStart{Op: "attach", SessionID: m.SessionID, Stdin: start.Stdin},
		delivered: start.Offset}
	sc.ctx, sc.cancel = context.WithCancel(context.Background())
	cmd, stream := sandbox.NewCommand(c, "", sc)
	cmd.SessionID = m.SessionID
	skip := int64(0)
	if start.Offset > 0 && m.Offset != start.Offset {
		skip = start.Offset // a server that predates offsets replays from 0
	}
	go sc.read(stream, skip)
	return cmd, nil
}

// dial opens the stream's socket and sends start; it returns the socket
// and the started message.
func (c *Client) dial(ctx context.Context, name string, start api.StreamStart) (*websocket.Conn, api.StreamMsg, error) {
	var m api.StreamMsg
	u := c.base.String() + c.path(name, "stream")
	u = "ws" + strings.TrimPrefix(u, "http")
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: c.http,
		HTTPHeader: http.Header{"Authorization": {"Bearer " + c.key}}, CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			var b []byte
			if resp.Body != nil {
				b, _ = io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			}
			return nil, m, api.DecodeError(resp.StatusCode, b, resp.Header.Get("Retry-After"))
		}
		if ctx.Err() != nil {
			return nil, m, ctx.Err()
		}
		return nil, m, sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	ws.SetReadLimit(sandbox.StreamLimit)
	fail := func(err error) (*websocket.Conn, api.StreamMsg, error) {
		_ = ws.CloseNow()
		if ctx.Err() != nil {
			return nil, m, ctx.Err()
		}
		return nil, m, err
	}
	b, _ := json.Marshal(start)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		return fail(sandbox.Unavailable(sandbox.ReasonTransport, err))
	}
	typ, msg, err := ws.Read(ctx)
	if err != nil {
		return fail(sandbox.Unavailable(sandbox.ReasonTransport, err))
	}
	if typ != websocket.MessageText || json.Unmarshal(msg, &m) != nil {
		return fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_stream_start"})
	}
	switch {
	case m.Type == api.MsgError && m.Error != nil:
		return fail(m.Error.Err())
	case m.Type != api.MsgStarted:
		return fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_stream_start"})
	}
	return ws, m, nil
}

// reconnect dials the session again after its socket dropped, attached
// at the bytes delivered, retrying what is transient for ReconnectFor.
// The acknowledgements the old socket owed are answered
// Unavailable{transport}. It returns the bytes the new socket's server
// replays that the caller must skip (a server that predates offsets),
// or an error: the last refusal, or ClosedBeforeExit.
func (sc *streamConn) reconnect() (int64, error) {
	sc.mu.Lock()
	for id, ch := range sc.acks {
		ch <- &api.Error{Kind: "unavailable", Reason: sandbox.ReasonTransport, Message: "the stream's socket dropped before the answer: it may or may not have been written"}
		delete(sc.acks, id)
	}
	old := sc.ws
	sc.mu.Unlock()
	_ = old.CloseNow()
	ctx, cancel := context.WithTimeout(sc.ctx, ReconnectFor)
	defer cancel()
	start := sc.start
	start.Offset = sc.delivered
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		ws, m, err := sc.c.dial(ctx, sc.name, start)
		if err == nil {
			sc.mu.Lock()
			if sc.stopped {
				sc.mu.Unlock()
				_ = ws.CloseNow()
				return 0, sandbox.ClosedBeforeExit()
			}
			sc.ws = ws
			sc.mu.Unlock()
			if m.Offset != start.Offset {
				return start.Offset, nil
			}
			return 0, nil
		}
		if !sandbox.Transient(err) && ctx.Err() == nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, sandbox.ClosedBeforeExit()
		case <-time.After(wait):
		}
	}
}

// read feeds the stream until the command ends. A socket that ends
// without an exit or an error message is dialled again where the command
// is a session (reconnect); otherwise, or when that fails, it is
// ClosedBeforeExit (or the refusal), never an exit. skip is output the
// server replays that the stream has already had.
func (sc *streamConn) read(stream *sandbox.Stream, skip int64) {
	defer close(sc.done)
	var failed error
	defer func() {
		sc.mu.Lock()
		stopped := sc.stopped
		for id, ch := range sc.acks {
			ch <- nil
			delete(sc.acks, id)
		}
		ws := sc.ws
		sc.mu.Unlock()
		switch {
		case stopped:
		case failed != nil && !sandbox.IsClosedBeforeExit(failed):
			stream.Fail(failed)
		default:
			stream.Close()
		}
		_ = ws.CloseNow()
	}()
	ended := false // a terminal message came
	for {
		typ, r, err := sc.conn().Reader(context.Background())
		if err == nil && typ == websocket.MessageBinary {
			var n int64
			n, skip, err = readOutput(r, stream, skip)
			sc.delivered += n
		}
		if err != nil {
			sc.mu.Lock()
			stopped := sc.stopped
			sc.mu.Unlock()
			if ended || stopped || !sc.resumable {
				return
			}
			if skip, failed = sc.reconnect(); failed != nil {
				return
			}
			continue
		}
		if typ == websocket.MessageBinary {
			continue
		}
		b, err := io.ReadAll(r)
		if err != nil {
			return
		}
		var m api.StreamMsg
		if json.Unmarshal(b, &m) != nil {
			stream.Fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_stream_message"})
			return
		}
		switch m.Type {
		case api.MsgExit:
			if m.Code == nil {
				stream.Fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_exit"})
				return
			}
			ended = true
			stream.Exit(*m.Code)
		case api.MsgError:
			ended = true
			var err error = sandbox.ClosedBeforeExit()
			if m.Error != nil {
				err = m.Error.Err()
			}
			stream.Fail(err)
		case api.MsgAck:
			sc.mu.Lock()
			ch := sc.acks[m.ID]
			delete(sc.acks, m.ID)
			sc.mu.Unlock()
			if ch != nil {
				e := m.Error
				if e == nil {
					e = &api.Error{}
				}
				ch <- e
			}
		}
	}
}

// outputChunk is the most one output event carries from the client.
const outputChunk = 64 << 10

// readOutput passes on one output message (a tag byte, then the bytes) in
// events of at most outputChunk, each in a buffer of its own read straight
// off the socket: a whole message read first (Conn.Read) grew its buffer
// from 512 bytes up to the message's megabyte, copying and clearing at
// each step, a fifth of the client's CPU on a fast stream.
//
// skip is output already delivered (a server that replays from 0 after
// a reconnect): that many bytes are read and dropped. It returns the
// bytes passed on and what is left of skip.
func readOutput(r io.Reader, stream *sandbox.Stream, skip int64) (n, left int64, err error) {
	var tag [1]byte
	if _, err := io.ReadFull(r, tag[:]); err != nil {
		if err == io.EOF {
			return 0, skip, nil // an empty message
		}
		return 0, skip, err
	}
	if skip > 0 {
		k, err := io.CopyN(io.Discard, r, skip)
		skip -= k
		if err == io.EOF {
			return 0, skip, nil
		}
		if err != nil {
			return 0, skip, err
		}
	}
	emit := stream.Stdout
	switch tag[0] {
	case api.TagStdout:
	case api.TagStderr:
		emit = stream.Stderr
	default:
		emit = nil // a stream this client does not know: read and dropped
	}
	for {
		buf := make([]byte, outputChunk)
		k, err := io.ReadFull(r, buf)
		// A reader that falls behind slows the socket (backpressure, down
		// to the platform's reading of the command), never drops the
		// stream: the read waits for room before it queues.
		if k > 0 && emit != nil && stream.WaitRoom(context.Background(), k) {
			emit(buf[:k])
		}
		n += int64(k) // an unknown stream's bytes count: the server's offset counts them
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return n, 0, nil
		case err != nil:
			return n, 0, err
		}
	}
}

// request sends a stdin or stdin_close message and waits for its answer.
func (sc *streamConn) request(ctx context.Context, m api.StreamMsg) error {
	ch := make(chan *api.Error, 1)
	sc.mu.Lock()
	if sc.stopped {
		sc.mu.Unlock()
		return sandbox.ErrCommandExited
	}
	sc.next++
	m.ID = sc.next
	sc.acks[m.ID] = ch
	ws := sc.ws
	sc.mu.Unlock()
	b, _ := json.Marshal(m)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		sc.mu.Lock()
		delete(sc.acks, m.ID)
		sc.mu.Unlock()
		select {
		case <-sc.done:
			return sandbox.ErrCommandExited
		default:
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &sandbox.WriteFailedError{Err: err}
	}
	select {
	case e := <-ch:
		if e == nil { // the socket ended before the answer
			return sandbox.ErrCommandExited
		}
		if e.Kind == "" {
			return nil
		}
		return e.Err()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func private(cmd *sandbox.Command) (*streamConn, error) {
	if err := sandbox.CheckCommand(cmd, Name); err != nil {
		return nil, err
	}
	sc, ok := cmd.Private.(*streamConn)
	if !ok {
		return nil, sandbox.Invalid(sandbox.ReasonHandle, "command of another client")
	}
	return sc, nil
}

// WriteStdin sends data to the command's stdin and waits for the platform
// to have written it.
func (c *Client) WriteStdin(ctx context.Context, cmd *sandbox.Command, data []byte) error {
	sc, err := private(cmd)
	if err != nil {
		return err
	}
	err = sc.request(ctx, api.StreamMsg{Type: api.MsgStdin, Data: data})
	if errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.ErrCommandExited
	}
	return err
}

// CloseStdin sends end-of-file to the command's stdin.
func (c *Client) CloseStdin(ctx context.Context, cmd *sandbox.Command) error {
	sc, err := private(cmd)
	if err != nil {
		return err
	}
	err = sc.request(ctx, api.StreamMsg{Type: api.MsgStdinClose})
	if errors.Is(err, sandbox.ErrCommandExited) && cmd.Finished() {
		return nil
	}
	return err
}

// StopCommand closes this end's socket: a detach; the command goes on
// where it is detachable.
func (c *Client) StopCommand(cmd *sandbox.Command) error {
	sc, err := private(cmd)
	if err != nil {
		return nil
	}
	sc.mu.Lock()
	sc.stopped = true
	ws := sc.ws
	sc.mu.Unlock()
	sc.cancel()
	_ = ws.CloseNow()
	<-sc.done
	return nil
}

var _ sandbox.CommandSignaler = (*Client)(nil)

// SignalCommand sends sig to the command's process group through the
// platform (a stream's signal message), as a CLI forwards its Ctrl-C:
// the command's trap runs, where closing the stream would only detach.
// A command that ended is ErrCommandExited; a provider behind the
// platform that cannot signal is ErrNotSupported.
func (c *Client) SignalCommand(ctx context.Context, cmd *sandbox.Command, sig syscall.Signal) error {
	sc, err := private(cmd)
	if err != nil {
		return err
	}
	if cmd.Finished() {
		return sandbox.ErrCommandExited
	}
	err = sc.request(ctx, api.StreamMsg{Type: api.MsgSignal, Signal: int(sig)})
	if errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.ErrCommandExited
	}
	return err
}

var _ sandbox.TTYResizer = (*Client)(nil)

// ResizeTTY changes a terminal command's window size through the
// platform (a stream's resize message). A command that ended is
// ErrCommandExited; a provider behind the platform that cannot resize is
// ErrNotSupported.
func (c *Client) ResizeTTY(ctx context.Context, cmd *sandbox.Command, rows, cols int) error {
	sc, err := private(cmd)
	if err != nil {
		return err
	}
	if cmd.Finished() {
		return sandbox.ErrCommandExited
	}
	err = sc.request(ctx, api.StreamMsg{Type: api.MsgResize, Rows: rows, Cols: cols})
	if errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.ErrCommandExited
	}
	return err
}
