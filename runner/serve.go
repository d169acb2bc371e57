package runner

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// conn is one platform connection.
type conn struct {
	d      *Daemon
	ws     *websocket.Conn
	ctx    context.Context // cancelled when the connection ends
	closed atomic.Bool
	// binary: output goes as binary stream frames (wire.CapBinaryStream,
	// taken by the platform in the upgrade's wire.HeaderAccept).
	binary bool

	qmu    sync.Mutex
	queues map[string]*opQueue // per-session stdin/stdin_close, in arrival order

	ops chan struct{} // a place per request served (Config.MaxOpsPerConn)
}

// opQueue runs one session's stdin requests in arrival order (Fountain's daemon
// ran each request in its own goroutine, so two writes could swap, D4).
type opQueue struct {
	items []queued
}

// queued is a stdin request and the release of its place (admit).
type queued struct {
	req     *wire.Request
	release func()
}

// enqueue runs req after the earlier stdin requests of its session; each
// holds its place (admit) until it was served.
func (c *conn) enqueue(req *wire.Request, release func(), wg *sync.WaitGroup) {
	key := req.Name + "\x00" + req.SessionID
	c.qmu.Lock()
	q := c.queues[key]
	if q != nil {
		q.items = append(q.items, queued{req, release})
		c.qmu.Unlock()
		return
	}
	q = &opQueue{items: []queued{{req, release}}}
	c.queues[key] = q
	c.qmu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c.qmu.Lock()
			if len(q.items) == 0 {
				delete(c.queues, key)
				c.qmu.Unlock()
				return
			}
			next := q.items[0]
			q.items = q.items[1:]
			c.qmu.Unlock()
			c.handle(next.req)
			next.release()
		}
	}()
}

// write sends one text frame; a failed write is logged and dropped (the
// frame stays in the journal).
func (c *conn) write(b []byte) error { return c.writeAs(websocket.MessageText, b) }

// writeBinary sends one binary stream frame (only when c.binary).
func (c *conn) writeBinary(b []byte) error { return c.writeAs(websocket.MessageBinary, b) }

func (c *conn) writeAs(typ websocket.MessageType, b []byte) error {
	if c == nil || c.closed.Load() {
		return errClosed
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.d.cfg.WriteTimeout)
	defer cancel()
	err := c.ws.Write(ctx, typ, b)
	if err != nil {
		c.d.log.Debug("runner: write failed", "err", err)
	}
	return err
}

var errClosed = errors.New("runner: connection closed")

func (d *Daemon) serve(ctx context.Context, ws *websocket.Conn, binary bool) error {
	cctx, cancel := context.WithCancel(ctx)
	c := &conn{d: d, ws: ws, ctx: cctx, binary: binary, queues: map[string]*opQueue{}, ops: make(chan struct{}, d.cfg.MaxOpsPerConn)}
	var wg sync.WaitGroup
	defer func() {
		c.closed.Store(true)
		cancel()
		_ = ws.CloseNow()
		wg.Wait()
		// Sessions this socket listened to are detached, as if the
		// platform had said so: durable ones leave memory.
		d.mu.Lock()
		ss := make([]*session, 0, len(d.sessions))
		for _, s := range d.sessions {
			ss = append(ss, s)
		}
		d.mu.Unlock()
		for _, s := range ss {
			s.detach(c)
		}
	}()
	pingErr := make(chan error, 1)
	if d.cfg.PingInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(d.cfg.PingInterval)
			defer t.Stop()
			for {
				select {
				case <-cctx.Done():
					return
				case <-t.C:
				}
				pctx, pcancel := context.WithTimeout(cctx, d.cfg.PingTimeout)
				err := ws.Ping(pctx)
				pcancel()
				if err != nil && cctx.Err() == nil {
					pingErr <- fmt.Errorf("runner: keep-alive ping unanswered: %w", err)
					_ = ws.CloseNow()
					return
				}
			}
		}()
	}
	for {
		typ, b, err := ws.Read(cctx)
		if err != nil {
			select {
			case perr := <-pingErr:
				return perr
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway:
				return nil
			case wire.CloseDeleted:
				return fmt.Errorf("runner: this runner was deleted on the platform; it will re-register on reconnect: %w", err)
			case wire.CloseDuplicate:
				return fmt.Errorf("runner: a runner named %q is already connected: %w", d.cfg.Name, err)
			}
			return fmt.Errorf("runner: connection lost: %w", err)
		}
		if typ != websocket.MessageText {
			d.log.Warn("runner: bad frame (binary); skipped")
			continue
		}
		req, err := wire.DecodeRequest(b)
		if err != nil {
			d.log.Warn("runner: bad frame; skipped", "err", err)
			if req != nil && req.ID > 0 {
				_ = c.write(wire.AppendError(nil, req.ID, wire.CodeInvalid, "bad frame: "+err.Error()))
			}
			continue
		}
		release, ok := c.admit(req)
		if !ok {
			if cctx.Err() == nil {
				code, detail := wire.ErrorCode(&sandbox.RateLimitedError{RetryAfter: time.Second})
				_ = c.write(wire.AppendError(nil, req.ID, code, detail))
			}
			continue
		}
		if req.Op == wire.OpStdin || req.Op == wire.OpStdinClose {
			c.enqueue(req, release, &wg)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release()
			c.handle(req)
		}()
	}
}

// admit takes req's place among the connection's requests served at once
// (and, for a file op, among the daemon's file ops), waiting up to
// BusyWait with the socket unread; ok false: no place came.
func (c *conn) admit(req *wire.Request) (release func(), ok bool) {
	t := time.NewTimer(c.d.cfg.BusyWait)
	defer t.Stop()
	select {
	case c.ops <- struct{}{}:
	case <-t.C:
		return nil, false
	case <-c.ctx.Done():
		return nil, false
	}
	if req.Op != wire.OpWriteFile {
		// (A read_file waits for its file place in its own goroutine,
		// holding nothing large: readFile.)
		return func() { <-c.ops }, true
	}
	// A write_file's frame is large: it waits here, so at most MaxFileOps
	// of them are held.
	select {
	case c.d.fileOps <- struct{}{}:
		return func() { <-c.d.fileOps; <-c.ops }, true
	case <-t.C:
	case <-c.ctx.Done():
	}
	<-c.ops
	return nil, false
}

// handle runs one request and writes its reply (and, for spawn and attach,
// the replay).
func (c *conn) handle(req *wire.Request) {
	d := c.d
	result, err := d.do(c, req)
	if errors.Is(err, errReplied) {
		return
	}
	if err != nil {
		code, detail := wire.ErrorCode(err)
		var oe *opError
		if errors.As(err, &oe) {
			detail = oe.op
		}
		if code == wire.CodeUnavailable || code == wire.CodeProvider {
			d.log.Warn("runner: op failed", "op", req.Op, "err", err)
		}
		_ = c.write(wire.AppendError(nil, req.ID, code, detail))
		return
	}
	_ = c.write(wire.AppendOK(nil, req.ID, result))
}

var errReplied = errors.New("replied")
