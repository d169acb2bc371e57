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

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// streamConn is a Command's socket.
type streamConn struct {
	ws *websocket.Conn

	mu      sync.Mutex
	next    int64
	acks    map[int64]chan *api.Error
	stopped bool
	done    chan struct{} // closed when the reader ends
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
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	return c.open(ctx, h.Name, api.StreamStart{Op: "attach", SessionID: sessionID, Stdin: o.Stdin})
}

func (c *Client) open(ctx context.Context, name string, start api.StreamStart) (*sandbox.Command, error) {
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
			return nil, api.DecodeError(resp.StatusCode, b, resp.Header.Get("Retry-After"))
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	ws.SetReadLimit(sandbox.StreamLimit)
	fail := func(err error) (*sandbox.Command, error) {
		_ = ws.CloseNow()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	b, _ := json.Marshal(start)
	if err := ws.Write(ctx, websocket.MessageText, b); err != nil {
		return fail(sandbox.Unavailable(sandbox.ReasonTransport, err))
	}
	typ, msg, err := ws.Read(ctx)
	if err != nil {
		return fail(sandbox.Unavailable(sandbox.ReasonTransport, err))
	}
	var m api.StreamMsg
	if typ != websocket.MessageText || json.Unmarshal(msg, &m) != nil {
		return fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_stream_start"})
	}
	switch {
	case m.Type == api.MsgError && m.Error != nil:
		return fail(m.Error.Err())
	case m.Type != api.MsgStarted:
		return fail(&sandbox.ProviderError{Provider: Name, Reason: "malformed_stream_start"})
	}
	sc := &streamConn{ws: ws, acks: map[int64]chan *api.Error{}, done: make(chan struct{})}
	cmd, stream := sandbox.NewCommand(c, "", sc)
	cmd.SessionID = m.SessionID
	go sc.read(stream)
	return cmd, nil
}

// read feeds the stream until the socket ends. A socket that ends without
// an exit or an error message is ClosedBeforeExit, never an exit.
func (sc *streamConn) read(stream *sandbox.Stream) {
	defer close(sc.done)
	defer func() {
		sc.mu.Lock()
		stopped := sc.stopped
		for id, ch := range sc.acks {
			ch <- nil
			delete(sc.acks, id)
		}
		sc.mu.Unlock()
		if !stopped {
			stream.Close()
		}
		_ = sc.ws.CloseNow()
	}()
	for {
		typ, r, err := sc.ws.Reader(context.Background())
		if err != nil {
			return
		}
		if typ == websocket.MessageBinary {
			if readOutput(r, stream) != nil {
				return
			}
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
			stream.Exit(*m.Code)
		case api.MsgError:
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
func readOutput(r io.Reader, stream *sandbox.Stream) error {
	var tag [1]byte
	if _, err := io.ReadFull(r, tag[:]); err != nil {
		if err == io.EOF {
			return nil // an empty message
		}
		return err
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
		n, err := io.ReadFull(r, buf)
		// A reader that falls behind slows the socket (backpressure, down
		// to the platform's reading of the command), never drops the
		// stream: the read waits for room before it queues.
		if n > 0 && emit != nil && stream.WaitRoom(context.Background(), n) {
			emit(buf[:n])
		}
		switch {
		case err == io.EOF || err == io.ErrUnexpectedEOF:
			return nil
		case err != nil:
			return err
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
	sc.mu.Unlock()
	b, _ := json.Marshal(m)
	if err := sc.ws.Write(ctx, websocket.MessageText, b); err != nil {
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
	sc.mu.Unlock()
	_ = sc.ws.CloseNow()
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
