// Package natshost makes one runner platform of several `managoat serve`
// replicas: a runner.Host and runner.Caller over NATS, so that a call for
// a runner whose socket another replica holds travels there and its
// session frames come back, in order, to the caller.
//
//	h, err := natshost.New(ctx, natshost.Config{Conn: nc})
//	srv := runner.NewServer(runner.ServerConfig{Auth: auth, Host: h})
//	p := runner.NewProvider(h, runner.ProviderOptions{}) // reaches every replica's runners
//
// What each piece is:
//
//   - Presence is a JetStream key-value bucket: one entry per connected
//     runner (its Info and the replica holding its socket), created by the
//     registering replica, refreshed by every heartbeat, and aged out by
//     the bucket's TTL. Creating the entry is the cluster-wide claim, so a
//     second connection for one runner id, on any replica, is refused
//     (409 before the upgrade). A claim held by a replica that no longer
//     answers is taken over at once (a dead replica's runners reconnect
//     elsewhere without waiting for the TTL).
//   - A call is a NATS request to the holding replica's subject; it runs
//     there on the runner's socket as on one node, and its reply comes
//     back. A spawn or attach carries an inbox: the holder installs the
//     subscription on its socket (so replay_for frames reach only this
//     requester, as on one node) and publishes each of its frames there,
//     in order, plus a keep-alive while the stream lasts.
//   - A replica that dies: a request to it fails at once (no responders)
//     or at the call's deadline, unavailable either way, never a hang; a
//     stream relayed from it fails with runner_disconnected once its
//     keep-alives stop (3 intervals). The runners reconnect to another
//     replica and their sessions are attached again from there, replayed
//     from byte zero by the daemon.
//   - Deleting a runner is a message every replica hears; the one holding
//     the socket closes it with 4404.
//
// The subjects and the bucket are this package's own; every replica of a
// platform must use the same Prefix and Bucket.
package natshost

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Config configures a Host.
type Config struct {
	// Conn is the replica's NATS connection (JetStream enabled on the
	// server); required. The Host does not close it.
	Conn *nats.Conn
	// Replica names this replica, unique in the platform; default random.
	Replica string
	// Prefix of every subject (default "managoat.runners") and Bucket of
	// the presence entries (default "managoat_runners").
	Prefix, Bucket string
	// TTL is how long a presence entry outlives its last heartbeat
	// (default 60 s: three of the server's default heartbeats).
	TTL time.Duration
	// KeepAlive is the interval of a relayed stream's keep-alives
	// (default 2 s); a relayed stream silent for three of them fails
	// with runner_disconnected.
	KeepAlive time.Duration
	// OnPresence, if set, is called on this replica's presence changes.
	OnPresence func(info runner.Info, online bool)
	Logger     *slog.Logger
}

// Host is a runner.Host, runner.Caller and runner.Deleter over NATS.
type Host struct {
	cfg Config
	nc  *nats.Conn
	kv  jetstream.KeyValue
	log *slog.Logger

	subs []*nats.Subscription

	mu      sync.Mutex
	closed  bool
	local   map[string]*runner.Conn          // runners whose socket this replica holds
	relays  map[string]*relay                // streams this replica relays for callers elsewhere, by relay id
	remotes map[*runner.Subscription]*remote // this replica's callers' streams relayed from elsewhere
	wg      sync.WaitGroup
}

var (
	_ runner.Host            = (*Host)(nil)
	_ runner.Caller          = (*Host)(nil)
	_ runner.Deleter         = (*Host)(nil)
	_ runner.RunnerAccounter = (*Host)(nil)
)

// entry is a presence record.
type entry struct {
	Replica string      `json:"replica"`
	Info    runner.Info `json:"info"`
}

// callMsg is a call relayed to the replica holding the runner's socket.
type callMsg struct {
	Runner   string          `json:"runner"`
	Request  json.RawMessage `json:"request"`
	Deadline int64           `json:"deadline_unix_nano"`
	Inbox    string          `json:"inbox,omitempty"` // where a spawn's or attach's frames go
	Relay    string          `json:"relay,omitempty"` // the stream's id, for unsubscribe
}

// callAnswer is the holder's answer: the runner's reply frame, or the
// error the call met there.
type callAnswer struct {
	Reply  []byte `json:"reply,omitempty"`
	Code   string `json:"code,omitempty"`
	Detail string `json:"detail,omitempty"`
}

// keepAliveMsg is a relayed stream's keep-alive (not a wire frame).
var keepAliveMsg = []byte(`{"keepalive":true}`)

// New joins the platform: the presence bucket (created if missing) and
// this replica's subjects.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.Conn == nil {
		return nil, errors.New("natshost: Config.Conn is required")
	}
	if cfg.Replica == "" {
		cfg.Replica = nats.NewInbox()[len(nats.InboxPrefix):]
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "managoat.runners"
	}
	if cfg.Bucket == "" {
		cfg.Bucket = "managoat_runners"
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 60 * time.Second
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if _, ok := ctx.Deadline(); !ok {
		// JetStream calls need a deadline.
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, fmt.Errorf("natshost: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Bucket, TTL: cfg.TTL, History: 1, Storage: jetstream.MemoryStorage})
	if err != nil {
		return nil, fmt.Errorf("natshost: presence bucket %s: %w", cfg.Bucket, err)
	}
	h := &Host{cfg: cfg, nc: cfg.Conn, kv: kv, log: cfg.Logger,
		local: map[string]*runner.Conn{}, relays: map[string]*relay{}, remotes: map[*runner.Subscription]*remote{}}
	for subj, f := range map[string]nats.MsgHandler{
		h.subject("call", cfg.Replica):  h.onCall,
		h.subject("unsub", cfg.Replica): h.onUnsub,
		h.subject("ping", cfg.Replica):  func(m *nats.Msg) { _ = m.Respond(nil) },
		h.subject("delete"):             h.onDelete,
	} {
		s, err := cfg.Conn.Subscribe(subj, f)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("natshost: subscribe %s: %w", subj, err)
		}
		h.subs = append(h.subs, s)
	}
	if err := cfg.Conn.FlushWithContext(ctx); err != nil {
		h.Close()
		return nil, fmt.Errorf("natshost: %w", err)
	}
	return h, nil
}

// Replica is this replica's name.
func (h *Host) Replica() string { return h.cfg.Replica }

func (h *Host) subject(parts ...string) string {
	s := h.cfg.Prefix
	for _, p := range parts {
		s += "." + p
	}
	return s
}

// key is a runner id's presence key (ids may hold characters a key may
// not, so it is their base64url).
func key(id string) string { return "r_" + base64.RawURLEncoding.EncodeToString([]byte(id)) }

func opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

// Close leaves the platform: this replica's runners' presence is removed
// (their sockets are the Server's to close) and relayed streams end.
func (h *Host) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	ids := make([]string, 0, len(h.local))
	for id := range h.local {
		ids = append(ids, id)
	}
	relays := make([]*relay, 0, len(h.relays))
	for _, r := range h.relays {
		relays = append(relays, r)
	}
	remotes := make([]*remote, 0, len(h.remotes))
	for _, r := range h.remotes {
		remotes = append(remotes, r)
	}
	h.mu.Unlock()
	for _, s := range h.subs {
		_ = s.Unsubscribe()
	}
	for _, id := range ids {
		h.release(id)
	}
	for _, r := range relays {
		r.stop()
	}
	for _, r := range remotes {
		h.endRemote(r, runner.ReasonDisconnected)
	}
	h.wg.Wait()
}

// Register implements runner.Host: the cluster-wide claim of id.
func (h *Host) Register(id string, c *runner.Conn) error {
	h.mu.Lock()
	if _, ok := h.local[id]; ok || h.closed {
		h.mu.Unlock()
		return runner.ErrAlreadyRegistered
	}
	h.mu.Unlock()
	val, _ := json.Marshal(entry{Replica: h.cfg.Replica, Info: c.Info()})
	ctx, cancel := opCtx()
	defer cancel()
	_, err := h.kv.Create(ctx, key(id), val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		err = h.takeOver(ctx, id, val)
	}
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.local[id]; ok || h.closed {
		return runner.ErrAlreadyRegistered
	}
	h.local[id] = c
	return nil
}

// takeOver claims id from a replica that no longer answers; a live
// holder keeps it (ErrAlreadyRegistered).
func (h *Host) takeOver(ctx context.Context, id string, val []byte) error {
	kve, err := h.kv.Get(ctx, key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_, err = h.kv.Create(ctx, key(id), val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return runner.ErrAlreadyRegistered
		}
		return err
	}
	if err != nil {
		return err
	}
	var e entry
	if json.Unmarshal(kve.Value(), &e) == nil && h.alive(ctx, e.Replica) {
		return runner.ErrAlreadyRegistered
	}
	if _, err := h.kv.Update(ctx, key(id), val, kve.Revision()); err != nil {
		return runner.ErrAlreadyRegistered // another replica took it first
	}
	h.log.Info("natshost: took over a runner from a replica that does not answer", "runner", id, "replica", e.Replica)
	return nil
}

// alive reports whether replica answers a ping.
func (h *Host) alive(ctx context.Context, replica string) bool {
	if replica == h.cfg.Replica {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := h.nc.RequestWithContext(ctx, h.subject("ping", replica), nil)
	return err == nil
}

// Unregister implements runner.Host.
func (h *Host) Unregister(id string, c *runner.Conn) {
	h.mu.Lock()
	if h.local[id] != c {
		h.mu.Unlock()
		return
	}
	delete(h.local, id)
	h.mu.Unlock()
	h.release(id)
}

// release removes id's presence if this replica still holds it.
func (h *Host) release(id string) {
	ctx, cancel := opCtx()
	defer cancel()
	kve, err := h.kv.Get(ctx, key(id))
	if err != nil {
		return
	}
	var e entry
	if json.Unmarshal(kve.Value(), &e) == nil && e.Replica == h.cfg.Replica {
		_ = h.kv.Delete(ctx, key(id), jetstream.LastRevision(kve.Revision()))
	}
}

// Whereis implements runner.Host: this replica's connection for id, or
// nil (another replica's runner is reached through Call).
func (h *Host) Whereis(id string) *runner.Conn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.local[id]
}

// Online implements runner.Host: every runner connected to any replica,
// most recently connected first.
func (h *Host) Online() []runner.Info {
	ctx, cancel := opCtx()
	defer cancel()
	out, _ := h.online(ctx)
	return out
}

func (h *Host) online(ctx context.Context) ([]runner.Info, error) {
	lister, err := h.kv.ListKeys(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = lister.Stop() }()
	out := []runner.Info{}
	for k := range lister.Keys() {
		kve, err := h.kv.Get(ctx, k)
		if err != nil {
			continue // gone meanwhile
		}
		var e entry
		if json.Unmarshal(kve.Value(), &e) == nil {
			out = append(out, e.Info)
		}
	}
	runner.SortByConnected(out)
	return out, nil
}

// owner is the replica holding id's socket, "" when it is offline.
func (h *Host) owner(ctx context.Context, id string) (string, error) {
	kve, err := h.kv.Get(ctx, key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", sandbox.Unavailable("presence_unavailable", err)
	}
	var e entry
	if err := json.Unmarshal(kve.Value(), &e); err != nil {
		return "", nil
	}
	return e.Replica, nil
}

// RunnerAccount implements runner.RunnerAccounter: the account of runner
// id, wherever it is connected.
func (h *Host) RunnerAccount(ctx context.Context, id string) (string, bool) {
	if c := h.Whereis(id); c != nil {
		return c.Info().Account, true
	}
	kve, err := h.kv.Get(ctx, key(id))
	if err != nil {
		return "", false
	}
	var e entry
	if json.Unmarshal(kve.Value(), &e) != nil {
		return "", false
	}
	return e.Info.Account, true
}

// Heartbeat implements runner.Host: the runner's presence is refreshed
// (its TTL starts again) with a new last-seen time.
func (h *Host) Heartbeat(id string) {
	c := h.Whereis(id)
	if c == nil {
		return
	}
	info := c.Info()
	info.LastSeen = time.Now().UTC()
	val, _ := json.Marshal(entry{Replica: h.cfg.Replica, Info: info})
	ctx, cancel := opCtx()
	defer cancel()
	if _, err := h.kv.Put(ctx, key(id), val); err != nil {
		h.log.Warn("natshost: heartbeat", "runner", id, "err", err)
	}
}

// Presence implements runner.Host.
func (h *Host) Presence(info runner.Info, online bool) {
	if h.cfg.OnPresence != nil {
		h.cfg.OnPresence(info, online)
	}
}

// Runners implements runner.Caller.
func (h *Host) Runners(ctx context.Context) ([]runner.Info, error) {
	out, err := h.online(ctx)
	if err != nil {
		return nil, sandbox.Unavailable("presence_unavailable", err)
	}
	return out, nil
}

// DeleteRunner implements runner.Deleter: the replica holding the socket
// of runner id, if account owns it, closes it with 4404.
func (h *Host) DeleteRunner(id, account string) bool {
	ctx, cancel := opCtx()
	defer cancel()
	kve, err := h.kv.Get(ctx, key(id))
	if err != nil {
		return false
	}
	var e entry
	if json.Unmarshal(kve.Value(), &e) != nil || e.Info.Account != account {
		return false
	}
	b, _ := json.Marshal(map[string]string{"runner": id})
	return h.nc.Publish(h.subject("delete"), b) == nil && h.nc.FlushWithContext(ctx) == nil
}

func (h *Host) onDelete(m *nats.Msg) {
	var d struct {
		Runner string `json:"runner"`
	}
	if json.Unmarshal(m.Data, &d) != nil {
		return
	}
	if c := h.Whereis(d.Runner); c != nil {
		c.Close(wire.CloseDeleted, "runner deleted")
	}
}

// Call implements runner.Caller: on this replica's socket when it holds
// the runner's, else relayed to the replica that does.
func (h *Host) Call(ctx context.Context, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	if c := h.Whereis(runnerID); c != nil {
		return c.Call(ctx, req, sub)
	}
	owner, err := h.owner(ctx, runnerID)
	if err != nil {
		return nil, err
	}
	if owner == "" || owner == h.cfg.Replica {
		return nil, sandbox.Unavailable(runner.ReasonOffline, nil)
	}
	body, err := req.Encode()
	if err != nil {
		return nil, err
	}
	msg := callMsg{Runner: runnerID, Request: body}
	if d, ok := ctx.Deadline(); ok {
		msg.Deadline = d.UnixNano()
	}
	var rem *remote
	if sub != nil {
		rem, err = h.startRemote(owner, sub)
		if err != nil {
			return nil, err
		}
		msg.Inbox, msg.Relay = rem.inbox, rem.id
	}
	b, _ := json.Marshal(msg)
	resp, err := h.nc.RequestWithContext(ctx, h.subject("call", owner), b)
	if err != nil {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return nil, sandbox.Unavailable(runner.ReasonTimeout, nil)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		}
		// No responders: the holder is gone.
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, err)
	}
	var a callAnswer
	if err := json.Unmarshal(resp.Data, &a); err != nil {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, fmt.Errorf("natshost: bad answer from replica %s", owner))
	}
	if a.Code != "" {
		if rem != nil {
			h.dropRemote(rem, false)
		}
		return nil, wire.ErrorFrom(a.Code, a.Detail)
	}
	f, err := wire.Decode(a.Reply)
	if err != nil || f.Kind != wire.KindReply {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, fmt.Errorf("natshost: bad reply relayed from replica %s", owner))
	}
	if rem != nil && !f.Reply.OK {
		h.dropRemote(rem, false)
	}
	return f.Reply, nil
}

// Unsubscribe implements runner.Caller.
func (h *Host) Unsubscribe(sub *runner.Subscription) {
	if sub == nil {
		return
	}
	h.mu.Lock()
	rem := h.remotes[sub]
	h.mu.Unlock()
	if rem == nil {
		sub.Cancel()
		return
	}
	h.dropRemote(rem, true)
}

// remote is a caller's stream relayed from the replica holding its
// runner's socket.
type remote struct {
	id, owner, inbox string
	sub              *runner.Subscription
	ns               *nats.Subscription
	timer            *time.Timer
	once             sync.Once
}

func (h *Host) startRemote(owner string, sub *runner.Subscription) (*remote, error) {
	r := &remote{id: nats.NewInbox()[len(nats.InboxPrefix):], owner: owner, sub: sub}
	r.inbox = nats.NewInbox()
	// Until the first frame or keep-alive, the call's own deadline bounds
	// the wait; then silence for three keep-alives ends the stream.
	r.timer = time.AfterFunc(time.Hour, func() { h.endRemote(r, runner.ReasonDisconnected) })
	// One handler at a time, in arrival order: frames stay in order.
	ns, err := h.nc.Subscribe(r.inbox, func(m *nats.Msg) {
		r.timer.Reset(3 * h.cfg.KeepAlive)
		if string(m.Data) == string(keepAliveMsg) {
			return
		}
		f, err := wire.Decode(m.Data)
		if err != nil || f.Kind != wire.KindStream {
			return
		}
		f.Stream.ReplayFor = 0
		sub.Deliver(f.Stream)
		if f.Stream.Kind == wire.StreamExit || f.Stream.Kind == wire.StreamError {
			h.dropRemote(r, false)
		}
	})
	if err != nil {
		r.timer.Stop()
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, err)
	}
	r.ns = ns
	h.mu.Lock()
	h.remotes[sub] = r
	h.mu.Unlock()
	return r, nil
}

// endRemote fails a relayed stream whose holder fell silent.
func (h *Host) endRemote(r *remote, reason string) {
	r.sub.Fail(sandbox.Unavailable(reason, errors.New("natshost: the replica holding the runner's socket stopped answering")))
	h.dropRemote(r, true)
}

// dropRemote ends the relay of r; tell: ask the holder to stop too.
func (h *Host) dropRemote(r *remote, tell bool) {
	r.once.Do(func() {
		r.timer.Stop()
		_ = r.ns.Unsubscribe()
		h.mu.Lock()
		if h.remotes[r.sub] == r {
			delete(h.remotes, r.sub)
		}
		h.mu.Unlock()
		if tell {
			b, _ := json.Marshal(map[string]string{"relay": r.id})
			_ = h.nc.Publish(h.subject("unsub", r.owner), b)
		}
	})
}

// relay is a stream this replica relays to a caller on another replica.
type relay struct {
	id    string
	conn  *runner.Conn
	sub   *runner.Subscription
	cmd   *sandbox.Command
	inbox string
	once  sync.Once
	done  chan struct{}
}

func (r *relay) stop() {
	r.once.Do(func() {
		close(r.done)
		r.sub.Cancel()
		_ = r.cmd.Stop()
	})
}

// onCall runs a relayed call on this replica's socket.
func (h *Host) onCall(m *nats.Msg) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		answer := func(a callAnswer) {
			b, _ := json.Marshal(a)
			_ = m.Respond(b)
		}
		var msg callMsg
		if err := json.Unmarshal(m.Data, &msg); err != nil {
			answer(callAnswer{Code: wire.CodeInvalid, Detail: "bad relayed call"})
			return
		}
		req, err := wire.DecodeRequest(msg.Request)
		if err != nil {
			answer(callAnswer{Code: wire.CodeInvalid, Detail: err.Error()})
			return
		}
		c := h.Whereis(msg.Runner)
		if c == nil {
			answer(callAnswer{Code: wire.CodeUnavailable, Detail: runner.ReasonOffline})
			return
		}
		ctx := context.Background()
		if msg.Deadline != 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.Unix(0, msg.Deadline))
			defer cancel()
		}
		var rl *relay
		if msg.Inbox != "" {
			cmd, stream := sandbox.NewCommand(nil, "", nil)
			rl = &relay{id: msg.Relay, conn: c, sub: runner.NewSubscription(stream), cmd: cmd, inbox: msg.Inbox, done: make(chan struct{})}
			h.mu.Lock()
			h.relays[rl.id] = rl
			h.mu.Unlock()
		}
		var sub *runner.Subscription
		if rl != nil {
			sub = rl.sub
		}
		reply, err := c.Call(ctx, req, sub)
		if err != nil {
			if rl != nil {
				h.endRelay(rl)
			}
			code, detail := wire.ErrorCode(err)
			answer(callAnswer{Code: code, Detail: detail})
			return
		}
		if rl != nil && (!reply.OK || rl.sub.SessionID() == "") {
			h.endRelay(rl)
			rl = nil
		}
		if rl != nil {
			h.wg.Add(1)
			go h.forward(rl)
		}
		answer(callAnswer{Reply: encodeReply(reply)})
	}()
}

// encodeReply is a reply as the runner framed it.
func encodeReply(r *wire.Reply) []byte {
	if r.OK {
		return wire.AppendOK(nil, r.ID, r.Result)
	}
	return wire.AppendError(nil, r.ID, r.Error, r.Detail)
}

func (h *Host) endRelay(rl *relay) {
	rl.stop()
	h.mu.Lock()
	if h.relays[rl.id] == rl {
		delete(h.relays, rl.id)
	}
	h.mu.Unlock()
}

// forward publishes a relayed stream's frames to its caller's inbox, in
// order, with keep-alives, until its end or an unsubscribe.
func (h *Host) forward(rl *relay) {
	defer h.wg.Done()
	defer h.endRelay(rl)
	tick := time.NewTicker(h.cfg.KeepAlive)
	defer tick.Stop()
	sid := rl.sub.SessionID()
	var buf []byte
	events := rl.cmd.Events()
	for {
		select {
		case <-rl.done:
			return
		case <-tick.C:
			_ = h.nc.Publish(rl.inbox, keepAliveMsg)
			continue
		case ev, ok := <-events:
			if !ok {
				return
			}
			f := wire.Stream{SessionID: sid}
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
			default:
				continue
			}
			buf = wire.AppendStream(buf[:0], &f)
			if err := h.nc.Publish(rl.inbox, buf); err != nil {
				return
			}
			if ev.Terminal() {
				return
			}
		}
	}
}

// onUnsub stops relaying a stream whose caller left.
func (h *Host) onUnsub(m *nats.Msg) {
	var u struct {
		Relay string `json:"relay"`
	}
	if json.Unmarshal(m.Data, &u) != nil {
		return
	}
	h.mu.Lock()
	rl := h.relays[u.Relay]
	h.mu.Unlock()
	if rl != nil {
		h.endRelay(rl)
	}
}
