package runner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Transport reasons of UnavailableError synthesised by the platform end
// (never on the wire). All are transient.
const (
	ReasonOffline      = "runner_offline"      // no connection registered for the runner
	ReasonDisconnected = "runner_disconnected" // the socket closed before the reply
	ReasonTimeout      = "runner_timeout"      // no reply within the caller's deadline
)

func errDisconnected() error { return sandbox.Unavailable(ReasonDisconnected, nil) }

// Subscription routes one spawn's or attach's stream frames into a
// Command's Stream. Make one with NewSubscription and pass it to Call.
//
// A stream-backed subscription never lets its Command's reader fall so
// far behind that the Stream drops it (sandbox.StreamLimit): one socket
// carries every session of a runner, so its reading cannot wait for one
// slow reader. When the reader has more than half the Stream's bound
// queued, the subscription stops delivering (it is behind) and calls its
// onBehind once, with the count of output bytes it delivered and their
// checksum; the Provider then attaches again and resumes from that
// offset of the session's journal (see Provider.resume). Output
// positions count stdout and stderr as one sequence, as the daemon's
// replay orders them. A resumed subscription checks that the replay's
// bytes it drops are the ones delivered before (CRC-32C): a replay that
// differs (the journal's cap dropped output the reader had not read, or
// the session is not the same) ends the Command with
// Unavailable{replay_mismatch} rather than deliver misplaced bytes.
type Subscription struct {
	stream *sandbox.Stream
	frames func(*wire.Stream) // instead of stream (NewFrameSubscription)

	// Set when the reply installs it.
	conn      *Conn
	sessionID string
	reqID     int64

	mu       sync.Mutex
	skip     int64                       // output bytes of the replay still to drop (a resumed subscription)
	want     uint32                      // the checksum the dropped bytes must have (a resumed subscription)
	sum      uint32                      // CRC-32C of every output byte seen, dropped ones included
	pos      int64                       // output bytes delivered to stream (after the skip)
	behind   bool                        // stopped delivering; onBehind was called
	onBehind func(pos int64, sum uint32) // nil: a reader that falls behind is dropped (the Stream's rule)
}

// NewSubscription returns a subscription that feeds s.
func NewSubscription(s *sandbox.Stream) *Subscription { return &Subscription{stream: s} }

// NewFrameSubscription returns a subscription that hands each stream frame
// to f as it arrives, in order, for a Caller that relays frames elsewhere
// (provider/runner/natshost). f runs under the connection's lock: it must
// not block or call back into the connection. A socket lost is a frame
// of kind error (runner_disconnected), as a stream would be failed.
func NewFrameSubscription(f func(*wire.Stream)) *Subscription { return &Subscription{frames: f} }

// SessionID is the session the subscription was installed on, "" before.
func (s *Subscription) SessionID() string { return s.sessionID }

// Deliver feeds one stream frame to the subscription's Command as a
// connection does (an exit whose code is malformed is a provider error,
// never a made-up code; unknown kinds deliver nothing). It is for a Caller
// that relays a runner's frames from elsewhere, such as another replica.
func (s *Subscription) Deliver(f *wire.Stream) { s.deliver(f) }

// Fail ends the subscription's Command with err (for a relaying Caller
// that lost the replica holding the runner's socket).
func (s *Subscription) Fail(err error) {
	if s.frames != nil {
		code, detail := wire.ErrorCode(err)
		s.frames(&wire.Stream{Kind: wire.StreamError, SessionID: s.sessionID, Error: code, Detail: detail})
		return
	}
	s.stream.Fail(err)
}

// Cancel removes the subscription from the connection that installed it,
// as Server.Unsubscribe does; total.
func (s *Subscription) Cancel() {
	if s != nil && s.conn != nil {
		s.conn.Unsubscribe(s)
	}
}

func (sub *Subscription) deliver(s *wire.Stream) {
	if sub.frames != nil {
		sub.frames(s)
		return
	}
	sub.mu.Lock()
	if sub.behind {
		// Everything from here on, the end too, comes again with the
		// resumed subscription's replay.
		sub.mu.Unlock()
		return
	}
	if sub.skip > 0 && (s.Kind == wire.StreamExit || s.Kind == wire.StreamError) {
		// The replay ended before the offset this reader had reached.
		sub.behind = true
		sub.mu.Unlock()
		sub.stream.Fail(errReplayMismatch())
		return
	}
	if s.Kind == wire.StreamStdout || s.Kind == wire.StreamStderr {
		data := s.Data
		if sub.skip > 0 {
			k := min(int64(len(data)), sub.skip)
			sub.skip -= k
			sub.sum = crc32.Update(sub.sum, castagnoli, data[:k])
			data = data[k:]
			if sub.skip == 0 && sub.sum != sub.want {
				sub.behind = true
				sub.mu.Unlock()
				sub.stream.Fail(errReplayMismatch())
				return
			}
		}
		if len(data) == 0 {
			sub.mu.Unlock()
			return
		}
		if sub.onBehind != nil && !hasRoom(sub.stream, len(data)) {
			sub.behind = true
			pos, sum, f := sub.pos, sub.sum, sub.onBehind
			sub.mu.Unlock()
			f(pos, sum)
			return
		}
		sub.pos += int64(len(data))
		if sub.onBehind != nil {
			sub.sum = crc32.Update(sub.sum, castagnoli, data)
		}
		sub.mu.Unlock()
		if s.Kind == wire.StreamStdout {
			sub.stream.Stdout(data)
		} else {
			sub.stream.Stderr(data)
		}
		return
	}
	sub.mu.Unlock()
	switch s.Kind {
	case wire.StreamExit:
		if s.Malformed {
			sub.stream.Fail(&sandbox.ProviderError{Provider: wire.ProviderName, Reason: "malformed_exit", Err: errors.New(s.Detail)})
		} else {
			sub.stream.Exit(s.Code)
		}
	case wire.StreamError:
		sub.stream.Fail(wire.ErrorFrom(s.Error, s.Detail))
	default:
		// Unknown stream kinds deliver nothing.
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func errReplayMismatch() error {
	return sandbox.Unavailable("replay_mismatch", errors.New("the session's replay differs from the output this reader had: its journal dropped output the reader had not read"))
}

// hasRoom reports, without waiting, whether st's reader has room for n
// more bytes (sandbox.Stream.WaitRoom's rule: at most half its bound
// queued after them).
func hasRoom(st *sandbox.Stream, n int) bool {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return st.WaitRoom(ctx, n) || st.Terminated() || st.Detached()
}

type pending struct {
	ch        chan callResult
	sub       *Subscription
	abandoned bool   // the caller gave up; a late reply installs nothing
	attachSid string // the session an attach with a subscription names
}

type callResult struct {
	reply *wire.Reply
	err   error
}

// Conn is the platform end of one runner's socket. Calls are multiplexed by
// request id (numbered from 1 per connection); stream frames fan out to the
// subscriptions of their session: a frame with replay_for N only to the
// subscription request N installed, a live frame to every subscription.
type Conn struct {
	srv          *Server // nil on a Client's connection
	info         Info
	ws           *websocket.Conn
	writeTimeout time.Duration
	log          *slog.Logger
	// binary: the daemon's output may come as binary stream frames
	// (wire.CapBinaryStream, reported and taken in the handshake).
	binary bool
	onEnd  func() // runs first when the connection ends

	ready     chan struct{} // closed once the socket is upgraded
	done      chan struct{} // closed when the connection ended
	closeOnce sync.Once

	nextID  atomic.Int64
	mu      sync.Mutex
	ended   bool
	pending map[int64]*pending
	subs    map[string][]*Subscription
	hb      *time.Timer
	// deferredDetach holds the sessions whose last subscription went while
	// an attach of them was in flight (Unsubscribe).
	deferredDetach map[string]bool

	lastSeen atomic.Int64              // unix nanos of the last frame or pong
	capacity atomic.Pointer[capReport] // the latest capacity report (capacity.go)
}

// Info describes the connected runner, with its latest capacity report.
func (c *Conn) Info() Info {
	i := c.info
	if r := c.capacity.Load(); r != nil {
		i.Capacity, i.CapacityAt = r.c, r.at
	}
	return i
}

// ID is the runner id.
func (c *Conn) ID() string { return c.info.ID }

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

func newConn(srv *Server, info Info) *Conn {
	c := &Conn{srv: srv, info: info, ready: make(chan struct{}), done: make(chan struct{}),
		pending: map[int64]*pending{}, subs: map[string][]*Subscription{}, deferredDetach: map[string]bool{}}
	if srv != nil {
		c.writeTimeout, c.log = srv.cfg.WriteTimeout, srv.log
		c.binary = info.HasCap(wire.CapBinaryStream)
		c.onEnd = func() {
			srv.cfg.Host.Unregister(info.ID, c)
			srv.cfg.Host.Presence(info, false)
		}
	}
	return c
}

// Close closes the socket with code and reason; the connection then ends as
// for any socket loss.
func (c *Conn) Close(code int, reason string) {
	select {
	case <-c.ready:
	case <-c.done:
		return
	}
	go func() { _ = c.ws.Close(websocket.StatusCode(code), reason) }()
}

// Call sends req (its ID is overwritten) and waits for the reply. With a
// subscription, a successful reply carrying a session_id installs it before
// the reply is handed back, so no frame of that session can be missed.
// Socket loss is Unavailable{runner_disconnected}; ctx's deadline is
// Unavailable{runner_timeout}. A failure reply is returned as the reply;
// Reply.Err maps it onto the taxonomy.
func (c *Conn) Call(ctx context.Context, req *wire.Request, sub *Subscription) (*wire.Reply, error) {
	select {
	case <-c.ready:
	case <-c.done:
		return nil, errDisconnected()
	case <-ctx.Done():
		return nil, ctxErr(ctx)
	}
	if err := c.accepts(req); err != nil {
		return nil, err
	}
	p := &pending{ch: make(chan callResult, 1), sub: sub}
	if sub != nil {
		p.attachSid = req.SessionID // "" for a spawn, whose session is new
	}
	c.mu.Lock()
	if c.ended {
		c.mu.Unlock()
		return nil, errDisconnected()
	}
	id := c.nextID.Add(1)
	req.ID = id
	c.pending[id] = p
	c.mu.Unlock()

	b, err := req.Encode()
	if err == nil {
		err = c.write(ctx, b)
	}
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		detach := c.settleDetachLocked(p.attachSid)
		c.mu.Unlock()
		if detach {
			c.detach(p.attachSid)
		}
		if ctx.Err() != nil {
			return nil, ctxErr(ctx)
		}
		return nil, errDisconnected()
	}
	select {
	case r := <-p.ch:
		return r.reply, r.err
	case <-ctx.Done():
		c.mu.Lock()
		if _, ok := c.pending[id]; ok {
			p.abandoned = true
			c.mu.Unlock()
			return nil, ctxErr(ctx)
		}
		c.mu.Unlock()
		r := <-p.ch // the reply won the race; honour it
		return r.reply, r.err
	}
}

// accepts refuses a request whose extension fields this connection's
// daemon did not report it takes: Fountain's daemon ignores unknown
// fields, so it would accept limits, a policy or a forced termination and
// drop them. The check is made here, on the connection that carries the
// request, and not only by the caller beforehand: a runner may reconnect
// as another daemon (an older build under the same id) between a
// caller's look at the online runners and its call.
func (c *Conn) accepts(req *wire.Request) error {
	if c.srv == nil {
		return nil // a Client's socket to a platform, which checks on the daemon's
	}
	need := ""
	switch {
	case req.Limits != nil && req.Limits.DiskBytes > 0:
		need = wire.CapDiskLimit
	case req.Limits != nil:
		need = wire.CapLimits
	case req.Allow != nil:
		need = string(sandbox.CapNetworkPolicy)
	case req.Force:
		need = string(sandbox.CapForceTerminateSession)
	case req.Op == wire.OpSignal:
		need = wire.CapSignal
	case req.Op == wire.OpReadFile:
		need = wire.CapReadFile
	case req.Offset != nil:
		need = wire.CapAttachOffset
	}
	if need != "" && !c.info.HasCap(need) {
		return fmt.Errorf("runner %s (%s) does not report %s, which %s needs: %w", c.info.Name, c.info.ID, need, req.Op, sandbox.ErrNotSupported)
	}
	return nil
}

func ctxErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return sandbox.Unavailable(ReasonTimeout, nil)
	}
	return ctx.Err()
}

// write sends one frame. It deliberately ignores the caller's context:
// coder/websocket closes the whole connection when a write's context ends
// mid-frame, and one caller's cancel must not cut off every other caller.
// Only a socket stuck for WriteTimeout is given up (and closed).
func (c *Conn) write(_ context.Context, b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.writeTimeout)
	defer cancel()
	return c.ws.Write(ctx, websocket.MessageText, b)
}

// Unsubscribe removes sub; when it was the session's last subscription on
// this connection, the daemon is told to detach (id 0, no reply expected),
// unless an attach of that session is in flight on this connection: the
// daemon would bind that attach and then unbind it on the detach, leaving
// its subscription with no live output. The detach then waits for the
// attach's reply (settleDetachLocked) and is sent only if no subscription
// came of it. It is total.
func (c *Conn) Unsubscribe(sub *Subscription) {
	if sub == nil {
		return
	}
	c.mu.Lock()
	sid := sub.sessionID
	removed := c.removeLocked(sub)
	last := removed && len(c.subs[sid]) == 0
	if last {
		delete(c.subs, sid)
		if c.attachPendingLocked(sid) {
			c.deferredDetach[sid] = true
			last = false
		}
	}
	c.mu.Unlock()
	if last {
		c.detach(sid)
	}
}

// attachPendingLocked reports whether an attach of session sid awaits its
// reply on this connection.
func (c *Conn) attachPendingLocked(sid string) bool {
	for _, p := range c.pending {
		if p.attachSid == sid {
			return true
		}
	}
	return false
}

// settleDetachLocked is called when a pending attach of sid is done (replied
// to or given up): it reports whether the detach Unsubscribe held back is
// now due (no other attach of sid in flight, no subscription of it here).
func (c *Conn) settleDetachLocked(sid string) bool {
	if sid == "" || !c.deferredDetach[sid] || c.attachPendingLocked(sid) {
		return false
	}
	delete(c.deferredDetach, sid)
	return len(c.subs[sid]) == 0
}

func (c *Conn) detach(sid string) {
	b, _ := (&wire.Request{ID: 0, Op: wire.OpDetach, SessionID: sid}).Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.write(ctx, b)
}

func (c *Conn) removeLocked(sub *Subscription) bool {
	list := c.subs[sub.sessionID]
	for i, s := range list {
		if s == sub {
			c.subs[sub.sessionID] = append(list[:i:i], list[i+1:]...)
			return true
		}
	}
	return false
}

// readLoop handles inbound frames strictly in order until the socket ends.
// A binary frame is a stream frame (wire.DecodeBinaryStream) on a
// connection that negotiated wire.CapBinaryStream, read no further than
// wire.MaxBinaryFrame; elsewhere it closes the socket with 1003, and a
// malformed one with 1007 (1009 when too big).
func (c *Conn) readLoop(ctx context.Context) error {
	var buf bytes.Buffer
	for {
		typ, r, err := c.ws.Reader(ctx)
		if err != nil {
			return err
		}
		if typ == websocket.MessageBinary {
			if !c.binary {
				_ = c.ws.Close(websocket.StatusUnsupportedData, "frames must be JSON text")
				return errors.New("binary frame")
			}
			r = io.LimitReader(r, wire.MaxBinaryFrame+1)
		}
		buf.Reset()
		if _, err := buf.ReadFrom(r); err != nil {
			return err
		}
		b := buf.Bytes()
		if buf.Cap() > 1<<20 {
			buf = bytes.Buffer{} // do not keep a huge frame's buffer
		}
		c.lastSeen.Store(time.Now().UnixNano())
		if typ == websocket.MessageBinary {
			s, err := wire.DecodeBinaryStream(b)
			if err != nil {
				code := websocket.StatusCode(wire.CloseBadFrame)
				if len(b) > wire.MaxBinaryFrame {
					code = wire.CloseTooBig
				}
				reason := err.Error()
				if len(reason) > 120 {
					reason = reason[:120]
				}
				_ = c.ws.Close(code, reason)
				return err
			}
			s.Data = bytes.Clone(s.Data) // b is reused for the next frame
			c.onStream(s)
			continue
		}
		f, err := wire.Decode(b)
		if err != nil {
			_ = c.ws.Close(websocket.StatusUnsupportedData, "frames must be JSON text")
			return err
		}
		switch f.Kind {
		case wire.KindReply:
			c.onReply(f.Reply)
		case wire.KindStream:
			c.onStream(f.Stream)
		default:
			c.log.Debug("runner: unexpected frame ignored", "runner", c.info.ID)
		}
	}
}

func (c *Conn) onReply(r *wire.Reply) {
	c.mu.Lock()
	p := c.pending[r.ID]
	if p == nil || r.ID == 0 {
		c.mu.Unlock()
		return // a reply to no request (late, id 0, unknown): dropped
	}
	delete(c.pending, r.ID)
	detachSid := ""
	if r.OK && p.sub != nil {
		var res struct {
			SessionID string `json:"session_id"`
		}
		if json.Unmarshal(r.Result, &res) == nil && res.SessionID != "" {
			if p.abandoned {
				if len(c.subs[res.SessionID]) == 0 {
					detachSid = res.SessionID
				}
			} else {
				p.sub.conn, p.sub.sessionID, p.sub.reqID = c, res.SessionID, r.ID
				c.subs[res.SessionID] = append(c.subs[res.SessionID], p.sub)
			}
		}
	}
	if detachSid == "" && c.settleDetachLocked(p.attachSid) {
		detachSid = p.attachSid
	}
	c.mu.Unlock()
	if detachSid != "" {
		go c.detach(detachSid)
	}
	if !p.abandoned {
		p.ch <- callResult{reply: r}
	}
}

func (c *Conn) onStream(s *wire.Stream) {
	c.mu.Lock()
	defer c.mu.Unlock()
	list := c.subs[s.SessionID]
	if len(list) == 0 {
		return
	}
	terminal := s.Kind == wire.StreamExit || s.Kind == wire.StreamError
	var keep []*Subscription
	for _, sub := range list {
		if s.ReplayFor != 0 && sub.reqID != s.ReplayFor {
			keep = append(keep, sub)
			continue
		}
		sub.deliver(s)
		if !terminal {
			keep = append(keep, sub)
		}
	}
	// A terminal frame ends the subscriptions it reached: a live one all of
	// them, a replayed one only its requester's (Fountain's platform dropped every
	// subscription on a replayed exit, stranding a concurrent attacher
	// whose own replay had not arrived yet).
	if len(keep) == 0 {
		delete(c.subs, s.SessionID)
	} else {
		c.subs[s.SessionID] = keep
	}
}

// end runs once when the socket is gone: unregister, then presence offline,
// then every waiting call fails with runner_disconnected and every
// subscription gets a terminal runner_disconnected error, never an exit.
func (c *Conn) end() {
	c.closeOnce.Do(func() {
		if c.onEnd != nil {
			c.onEnd()
		}
		c.mu.Lock()
		c.ended = true
		if c.hb != nil {
			c.hb.Stop()
		}
		pend, subs := c.pending, c.subs
		c.pending, c.subs = map[int64]*pending{}, map[string][]*Subscription{}
		c.mu.Unlock()
		for _, p := range pend {
			if !p.abandoned {
				p.ch <- callResult{err: errDisconnected()}
			}
		}
		for _, list := range subs {
			for _, sub := range list {
				sub.Fail(errDisconnected())
			}
		}
		close(c.done)
	})
}

// heartbeat runs every HeartbeatInterval: the host's heartbeat, a ping, and
// the idle check (no frame or pong for IdleTimeout closes the socket).
func (c *Conn) heartbeat() {
	cfg := &c.srv.cfg
	c.refreshCapacity()
	c.srv.cfg.Host.Heartbeat(c.info.ID)
	idle := time.Since(time.Unix(0, c.lastSeen.Load()))
	if idle >= cfg.IdleTimeout {
		c.srv.log.Info("runner: idle timeout", "runner", c.info.ID, "idle", idle)
		_ = c.ws.CloseNow()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(cfg.HeartbeatInterval, cfg.IdleTimeout-idle))
	err := c.ws.Ping(ctx)
	cancel()
	if err == nil {
		c.lastSeen.Store(time.Now().UnixNano())
	}
	c.mu.Lock()
	if !c.ended {
		c.hb.Reset(cfg.HeartbeatInterval)
	}
	c.mu.Unlock()
}
