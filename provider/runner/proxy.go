package runner

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// The proxy lets a process other than the platform (the CLI) use the
// runners connected to a platform: GET ProxyPath upgrades to a WebSocket on
// which the client speaks the runner protocol as the platform does to a
// daemon, with the Bearer key of serveRunner. The platform routes each
// request to the runner its name carries (list: the request's runner_id),
// relays the reply under the client's id, and forwards the frames of each
// subscription it installed tagged replay_for=<the client's request id>,
// so they reach exactly that subscription; a detach from the client drops
// its subscriptions to that session (the platform detaches the daemon when
// its own last listener goes). The extra op "runners" lists the caller's
// online runners. A client sees only the runners of its own account.

type proxySub struct {
	sid string
	sub *Subscription
	cmd *sandbox.Command
}

type proxyConn struct {
	s       *Server
	ws      *websocket.Conn
	account string
	ctx     context.Context

	mu   sync.Mutex
	subs map[int64]*proxySub
	wg   sync.WaitGroup

	calls  atomic.Int64 // requests in flight
	active atomic.Int64 // unix nanoseconds of the last frame either way
}

func (s *Server) serveProxy(w http.ResponseWriter, r *http.Request) {
	account, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if !isWebSocket(r) {
		httpError(w, http.StatusBadRequest, "not_a_websocket", "GET "+ProxyPath+" must be a WebSocket upgrade")
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		httpError(w, http.StatusServiceUnavailable, "shutting_down", "the platform is shutting down")
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return
	}
	ws.SetReadLimit(wire.ReadLimit)
	s.mu.Lock()
	s.proxies[ws] = struct{}{}
	s.mu.Unlock()
	ctx, cancel := context.WithCancel(context.Background())
	pc := &proxyConn{s: s, ws: ws, account: account, ctx: ctx, subs: map[int64]*proxySub{}}
	defer func() {
		cancel()
		_ = ws.CloseNow()
		pc.mu.Lock()
		subs := pc.subs
		pc.subs = map[int64]*proxySub{}
		pc.mu.Unlock()
		for _, ps := range subs {
			s.Unsubscribe(ps.sub)
			ps.cmd.Stream().Detach()
		}
		pc.wg.Wait()
		s.mu.Lock()
		delete(s.proxies, ws)
		s.mu.Unlock()
	}()
	pc.active.Store(time.Now().UnixNano())
	pc.wg.Add(1)
	go func() { defer pc.wg.Done(); pc.watchIdle() }()
	for {
		typ, b, err := ws.Read(ctx)
		if err != nil {
			return
		}
		pc.active.Store(time.Now().UnixNano())
		if typ != websocket.MessageText {
			_ = ws.Close(websocket.StatusUnsupportedData, "frames must be JSON text")
			return
		}
		if !json.Valid(b) {
			// Text that is not JSON is no request of this protocol: the
			// client speaks another one (as binary frames, 1003).
			_ = ws.Close(websocket.StatusUnsupportedData, "frames must be JSON text")
			return
		}
		req, err := wire.DecodeRequest(b)
		if err != nil {
			if req != nil && req.ID > 0 {
				_ = pc.write(wire.AppendError(nil, req.ID, wire.CodeInvalid, "bad frame: "+err.Error()))
			}
			continue
		}
		pc.wg.Add(1)
		pc.calls.Add(1)
		go func() {
			defer pc.wg.Done()
			defer pc.calls.Add(-1)
			pc.handle(req)
		}()
	}
}

func (pc *proxyConn) write(b []byte) error {
	ctx, cancel := context.WithTimeout(pc.ctx, pc.s.cfg.WriteTimeout)
	defer cancel()
	err := pc.ws.Write(ctx, websocket.MessageText, b)
	pc.active.Store(time.Now().UnixNano())
	return err
}

// watchIdle closes the client's socket (1001, idle) once nothing went
// either way for ProxyIdleTimeout while it had no request in flight and
// no subscription: a client that holds a socket and does nothing holds
// it no longer (a client reading a session's output is not idle).
func (pc *proxyConn) watchIdle() {
	idle := pc.s.cfg.ProxyIdleTimeout
	t := time.NewTicker(idle / 4)
	defer t.Stop()
	for {
		select {
		case <-pc.ctx.Done():
			return
		case <-t.C:
		}
		pc.mu.Lock()
		subs := len(pc.subs)
		pc.mu.Unlock()
		if subs == 0 && pc.calls.Load() == 0 && time.Since(time.Unix(0, pc.active.Load())) > idle {
			_ = pc.ws.Close(websocket.StatusGoingAway, "idle")
			return
		}
	}
}

func (pc *proxyConn) fail(id int64, err error) {
	code, detail := wire.ErrorCode(err)
	_ = pc.write(wire.AppendError(nil, id, code, detail))
}

// runner returns the online runner id of the caller's account.
func (pc *proxyConn) runner(id string) bool {
	c := pc.s.cfg.Host.Whereis(id)
	return c != nil && c.Info().Account == pc.account
}

func (pc *proxyConn) handle(req *wire.Request) {
	cid := req.ID
	switch req.Op {
	case wire.OpDetach:
		pc.mu.Lock()
		var gone []*proxySub
		for id, ps := range pc.subs {
			if ps.sid == req.SessionID {
				gone = append(gone, ps)
				delete(pc.subs, id)
			}
		}
		pc.mu.Unlock()
		for _, ps := range gone {
			pc.s.Unsubscribe(ps.sub)
			ps.cmd.Stream().Detach()
		}
		if cid > 0 {
			_ = pc.write(wire.AppendOK(nil, cid, nil))
		}
		return
	case wire.OpRunners:
		var mine []Info
		for _, i := range pc.s.cfg.Host.Online() {
			if i.Account == pc.account {
				mine = append(mine, i)
			}
		}
		if mine == nil {
			mine = []Info{}
		}
		res, _ := json.Marshal(map[string]any{"runners": mine})
		_ = pc.write(wire.AppendOK(nil, cid, res))
		return
	}
	rid := req.RunnerID
	if req.Name != "" {
		var err error
		if rid, err = Parse(req.Name); err != nil {
			pc.fail(cid, err)
			return
		}
	}
	if !pc.runner(rid) {
		pc.fail(cid, sandbox.Unavailable(ReasonOffline, nil))
		return
	}
	fwd := *req
	fwd.RunnerID = ""
	var ps *proxySub
	if req.Op == wire.OpSpawn || req.Op == wire.OpAttach {
		cmd, stream := sandbox.NewCommand(nil, "", nil)
		ps = &proxySub{sub: NewSubscription(stream), cmd: cmd}
	}
	timeout := pc.s.cfg.CallTimeout
	if req.Op == wire.OpExec {
		timeout = 0
		if req.TimeoutMS != nil && *req.TimeoutMS > 0 {
			timeout = time.Duration(*req.TimeoutMS)*time.Millisecond + 10*time.Second
		}
	}
	ctx := pc.ctx
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var sub *Subscription
	if ps != nil {
		sub = ps.sub
	}
	r, err := pc.s.Call(ctx, rid, &fwd, sub)
	if err != nil {
		if ps != nil {
			ps.cmd.Stream().Detach()
		}
		pc.fail(cid, err)
		return
	}
	if !r.OK {
		if ps != nil {
			ps.cmd.Stream().Detach()
		}
		if r.Malformed {
			pc.fail(cid, r.Err())
		} else {
			_ = pc.write(wire.AppendError(nil, cid, r.Error, r.Detail))
		}
		return
	}
	if ps != nil && ps.sub.SessionID() == "" {
		ps.cmd.Stream().Detach()
		ps = nil
	}
	if ps != nil {
		ps.sid = ps.sub.SessionID()
		pc.mu.Lock()
		pc.subs[cid] = ps
		pc.mu.Unlock()
	}
	if err := pc.write(wire.AppendOK(nil, cid, r.Result)); err != nil || ps == nil {
		return
	}
	pc.forward(cid, ps)
}

// forward relays one subscription's events to the client until its
// terminal event or a detach.
func (pc *proxyConn) forward(cid int64, ps *proxySub) {
	var buf []byte
	for ev := range ps.cmd.Events() {
		f := wire.Stream{SessionID: ps.sid, ReplayFor: cid}
		switch ev.Kind {
		case sandbox.Stdout:
			f.Kind, f.Data = wire.StreamStdout, ev.Data
		case sandbox.Stderr:
			f.Kind, f.Data = wire.StreamStderr, ev.Data
		case sandbox.Exit:
			f.Kind, f.Code = wire.StreamExit, ev.Code
		case sandbox.Error:
			f.Kind = wire.StreamError
			f.Error, f.Detail = wire.ErrorCode(ev.Err)
		}
		buf = wire.AppendStream(buf[:0], &f)
		if pc.write(buf) != nil {
			// The client does not take its frames (gone, or too slow
			// for WriteTimeout): stop queueing for it.
			_ = ps.cmd.Stop()
			return
		}
		if ev.Terminal() {
			pc.mu.Lock()
			if pc.subs[cid] == ps {
				delete(pc.subs, cid)
			}
			pc.mu.Unlock()
		}
	}
}

// Client is a Caller in a process other than the platform: it reaches the
// runners connected to a platform through the platform's proxy endpoint
// (see ProxyPath). It dials on first use and again after a disconnect.
//
//	c := runner.NewClient("http://127.0.0.1:8080", token)
//	defer c.Close()
//	p := runner.NewProvider(c, runner.ProviderOptions{})
type Client struct {
	base, token string

	mu     sync.Mutex
	conn   *Conn
	closed bool
	wg     sync.WaitGroup
}

// NewClient returns a client of the platform at baseURL (http or https).
func NewClient(baseURL, token string) *Client {
	return &Client{base: baseURL, token: token}
}

func (cl *Client) dial(ctx context.Context) (*Conn, error) {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	if cl.closed {
		return nil, sandbox.Unavailable("client_closed", nil)
	}
	if cl.conn != nil {
		select {
		case <-cl.conn.done:
		default:
			return cl.conn, nil
		}
	}
	u, err := url.Parse(strings.TrimRight(cl.base, "/"))
	if err != nil {
		return nil, sandbox.Invalid("url", err.Error())
	}
	switch u.Scheme {
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return nil, sandbox.Invalid("url", "platform URL must be http or https")
	}
	u.Path = strings.TrimRight(u.Path, "/") + ProxyPath
	ws, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPHeader:      http.Header{"Authorization": {"Bearer " + cl.token}},
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return nil, sandbox.FromHTTPStatus(resp.StatusCode, "", 0)
		}
		return nil, sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	ws.SetReadLimit(wire.ReadLimit)
	c := newConn(nil, Info{})
	c.writeTimeout = 30 * time.Second
	c.log = discardLogger
	c.ws = ws
	close(c.ready)
	cl.conn = c
	cl.wg.Add(1)
	go func() {
		defer cl.wg.Done()
		_ = c.readLoop(context.Background())
		_ = ws.CloseNow()
		c.end()
	}()
	return c, nil
}

// Call implements Caller.
func (cl *Client) Call(ctx context.Context, runnerID string, req *wire.Request, sub *Subscription) (*wire.Reply, error) {
	c, err := cl.dial(ctx)
	if err != nil {
		return nil, err
	}
	req.RunnerID = runnerID
	r, err := c.Call(ctx, req, sub)
	if err == nil && !r.OK && r.Error == wire.CodeUnavailable {
		// Transport reasons relayed by the platform keep their meaning.
		return r, nil
	}
	return r, err
}

// Unsubscribe implements Caller.
func (cl *Client) Unsubscribe(sub *Subscription) {
	if sub != nil && sub.conn != nil {
		sub.conn.Unsubscribe(sub)
	}
}

// Runners implements Caller: the caller's online runners.
func (cl *Client) Runners(ctx context.Context) ([]Info, error) {
	r, err := cl.Call(ctx, "", &wire.Request{Op: wire.OpRunners}, nil)
	if err != nil {
		return nil, err
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	var res struct {
		Runners []Info `json:"runners"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil {
		return nil, malformed("runners", r.Result)
	}
	SortByConnected(res.Runners)
	return res.Runners, nil
}

// Close closes the client's connection; later calls fail.
func (cl *Client) Close() error {
	cl.mu.Lock()
	cl.closed = true
	c := cl.conn
	cl.mu.Unlock()
	if c != nil {
		_ = c.ws.CloseNow()
	}
	cl.wg.Wait()
	return nil
}

var discardLogger = slog.New(slog.DiscardHandler)
