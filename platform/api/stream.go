package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// StreamReadLimit bounds one message a client sends on a stream (a stdin
// chunk with its JSON framing).
const StreamReadLimit = 4 << 20

// DefaultStreamMaxPerAccount is Config.StreamMaxPerAccount's default.
const DefaultStreamMaxPerAccount = 256

// streamSlot takes one of the account's open streams, or says no (the
// account is at the bound). release gives it back.
func (s *Server) streamSlot(accountID string) (release func(), ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.acctStreams[accountID] >= s.cfg.StreamMaxPerAccount {
		return nil, false
	}
	s.acctStreams[accountID]++
	return func() {
		s.mu.Lock()
		if s.acctStreams[accountID]--; s.acctStreams[accountID] <= 0 {
			delete(s.acctStreams, accountID)
		}
		s.mu.Unlock()
	}, true
}

// stream is GET /v1/sandboxes/{name}/stream, a WebSocket: the client's first
// text message is a StreamStart (spawn or attach); the server answers
// started (with the session id) or error, then sends the command's output
// as binary messages (a tag byte, then the bytes), and one exit or error
// text message, and closes. An attach's offset (StreamStart.Offset)
// resumes it: the first offset bytes of the session's output, which the
// client already has, are skipped as the journal replays them. The client sends stdin, stdin_close,
// signal (a signal number for the command's process group, as a CLI
// forwards Ctrl-C) and resize (rows and cols of a tty's window, as a
// terminal's SIGWINCH) text messages, each acknowledged by id; closing the
// socket detaches (the command of a detachable spawn goes on, to be
// attached again). A reader that falls behind slows the socket, and the
// command's provider then slows its reading of the session's journal (or
// resumes from it by offset, on a runner): no output is dropped.
//
// An account has at most Config.StreamMaxPerAccount streams open at once
// on this server: one more is 429 rate_limited{streams} with Retry-After,
// answered before the upgrade (and before the sandbox is woken).
func (s *Server) stream(w http.ResponseWriter, r *http.Request, k store.Key) {
	if !strings.Contains(strings.ToLower(r.Header.Get("Upgrade")), "websocket") {
		writeErr(w, &apiError{http.StatusBadRequest, &Error{Kind: "invalid", Reason: "not_a_websocket", Message: "the stream is a WebSocket: send Upgrade: websocket"}})
		return
	}
	release, ok := s.streamSlot(k.AccountID)
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "streams", RetryAfterMS: 1000,
			Message: fmt.Sprintf("this account has %d streams open, the most it may: close one", s.cfg.StreamMaxPerAccount)}})
		return
	}
	defer release()
	rec, p, err := s.use(r.Context(), k, r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		writeErr(w, sandbox.Unavailable("shutting_down", nil))
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	ws.SetReadLimit(StreamReadLimit)
	s.mu.Lock()
	s.streams[ws] = struct{}{}
	key := recKey(rec.AccountID, rec.Name)
	s.active[key]++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.streams, ws)
		if s.active[key]--; s.active[key] <= 0 {
			delete(s.active, key)
		}
		s.mu.Unlock()
		s.activity(rec.AccountID, rec.Name)
		_ = ws.CloseNow()
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	sctx, scancel := context.WithTimeout(ctx, 30*time.Second)
	typ, msg, err := ws.Read(sctx)
	scancel()
	if err != nil {
		return
	}
	var start StreamStart
	if typ != websocket.MessageText || json.Unmarshal(msg, &start) != nil {
		s.sendErr(ctx, ws, badJSON("start", "the first message must be a JSON stream start"))
		return
	}
	reg := sandbox.NewRegistry(p)
	h := handleOf(rec)
	var cmd *sandbox.Command
	switch {
	case start.Offset < 0:
		err = badJSON("offset", "offset is a count of output bytes, 0 or more")
	case start.Offset > 0 && start.Op != "attach":
		err = badJSON("offset", "offset resumes an attach; a spawn starts at 0")
	}
	switch {
	case err != nil:
	case start.Op == "spawn":
		cmd, err = reg.Spawn(ctx, h, sandbox.Cmd{Name: start.Cmd, Args: start.Args}, sandbox.SpawnOptions{
			Env: withURL(start.Env, rec), Dir: start.Dir, Stdin: start.Stdin, TTY: start.TTY, TTYRows: start.Rows, TTYCols: start.Cols, Detachable: start.Detachable})
	case start.Op == "attach":
		if err = s.SessionUsable(ctx, rec, start.SessionID); err == nil {
			cmd, err = reg.Attach(ctx, h, start.SessionID, sandbox.AttachOptions{Stdin: start.Stdin})
		}
	default:
		err = badJSON("op", "op must be spawn or attach")
	}
	if err != nil {
		s.sendErr(ctx, ws, err)
		return
	}
	defer cmd.Stop()
	if err := s.send(ctx, ws, StreamMsg{Type: MsgStarted, SessionID: cmd.SessionID, Offset: start.Offset}); err != nil {
		return
	}
	// The client's messages: stdin and stdin_close, acknowledged; a
	// closed socket is a detach.
	gone := make(chan struct{})
	// inflight is held from a message's handling to its ack: the terminal
	// event waits for it, so a stdin write the command read before it
	// exited is acknowledged before the exit, never lost to the close.
	var inflight sync.Mutex
	go func() {
		defer close(gone)
		for {
			typ, b, err := ws.Read(ctx)
			if err != nil {
				return
			}
			inflight.Lock()
			var m StreamMsg
			if typ != websocket.MessageText || json.Unmarshal(b, &m) != nil {
				inflight.Unlock()
				_ = ws.Close(websocket.StatusUnsupportedData, "text JSON messages only")
				return
			}
			var werr error
			switch m.Type {
			case MsgStdin:
				werr = cmd.WriteStdin(ctx, m.Data)
			case MsgStdinClose:
				werr = cmd.CloseStdin(ctx)
			case MsgSignal:
				werr = signal(ctx, p, cmd, m.Signal)
			case MsgResize:
				werr = resize(ctx, p, cmd, m.Rows, m.Cols)
			default:
				werr = badJSON("type", "type must be stdin, stdin_close, signal or resize")
			}
			ack := StreamMsg{Type: MsgAck, ID: m.ID}
			if werr != nil {
				_, ack.Error = ErrorOf(werr)
			}
			err = s.send(ctx, ws, ack)
			inflight.Unlock()
			if err != nil {
				return
			}
		}
	}()
	events := cmd.Events()
	var held *sandbox.Event // an event read ahead while coalescing
	// skip is what is left of an attach's offset: output the client
	// has, dropped as the journal replays it (never held).
	skip := start.Offset
	for {
		var ev sandbox.Event
		if held != nil {
			ev, held = *held, nil
		} else {
			select {
			case <-gone:
				return // the client left: detach (Stop, deferred)
			case e, ok := <-events:
				if !ok {
					return
				}
				ev = e
			}
		}
		var err error
		switch ev.Kind {
		case sandbox.Stdout, sandbox.Stderr:
			if skip > 0 {
				if int64(len(ev.Data)) <= skip {
					skip -= int64(len(ev.Data))
					continue
				}
				ev.Data, skip = ev.Data[skip:], 0
			}
			tag := TagStdout
			if ev.Kind == sandbox.Stderr {
				tag = TagStderr
			}
			buf := make([]byte, 1, 1+len(ev.Data))
			buf[0] = tag
			buf = append(buf, ev.Data...)
			// Output already queued of the same stream goes in the same
			// message (up to maxMessage): fewer, larger frames.
		more:
			for len(buf) < maxMessage {
				select {
				case e, ok := <-events:
					if !ok {
						break more
					}
					if e.Kind != ev.Kind {
						held = &e
						break more
					}
					buf = append(buf, e.Data...)
				default:
					break more
				}
			}
			err = ws.Write(ctx, websocket.MessageBinary, buf)
		case sandbox.Exit:
			code := ev.Code
			inflight.Lock() // an ack on its way goes first
			err = s.send(ctx, ws, StreamMsg{Type: MsgExit, Code: &code})
			inflight.Unlock()
		case sandbox.Error:
			_, e := ErrorOf(ev.Err)
			err = s.send(ctx, ws, StreamMsg{Type: MsgError, Error: e})
		}
		if err != nil {
			return
		}
		if ev.Terminal() {
			s.closeAfter(ws, gone)
			return
		}
	}
}

// signal sends sig to cmd's process group through its provider, the way
// a CLI forwards its Ctrl-C; a provider that cannot is not_supported.
func signal(ctx context.Context, p sandbox.Provider, cmd *sandbox.Command, sig int) error {
	if sig <= 0 || sig > 64 {
		return badJSON("signal", "signal must be a signal number, 1 to 64")
	}
	sg, ok := p.(sandbox.CommandSignaler)
	if !ok {
		return sandbox.ErrNotSupported
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return sg.SignalCommand(sctx, cmd, syscall.Signal(sig))
}

// resize changes the window size of cmd's pty through its provider, as
// a terminal's SIGWINCH asks; a provider that cannot is not_supported.
func resize(ctx context.Context, p sandbox.Provider, cmd *sandbox.Command, rows, cols int) error {
	if rows < 1 || cols < 1 || rows > 1000 || cols > 1000 {
		return badJSON("rows", "rows and cols must be 1 to 1000")
	}
	rz, ok := p.(sandbox.TTYResizer)
	if !ok {
		return sandbox.ErrNotSupported
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return rz.ResizeTTY(rctx, cmd, rows, cols)
}

// maxMessage bounds one output message of a stream.
const maxMessage = 1 << 20

// closeAfter closes the socket normally, giving the client a moment to read
// the terminal message and answer the close.
func (s *Server) closeAfter(ws *websocket.Conn, gone <-chan struct{}) {
	done := make(chan struct{})
	go func() {
		_ = ws.Close(websocket.StatusNormalClosure, "")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = ws.CloseNow()
		<-done
	}
	<-gone
}

func (s *Server) send(ctx context.Context, ws *websocket.Conn, m StreamMsg) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return ws.Write(wctx, websocket.MessageText, b)
}

func (s *Server) sendErr(ctx context.Context, ws *websocket.Conn, err error) {
	_, e := ErrorOf(err)
	if s.send(ctx, ws, StreamMsg{Type: MsgError, Error: e}) == nil {
		_ = ws.Close(websocket.StatusNormalClosure, "")
	}
}
