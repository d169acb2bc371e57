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
//     the bucket's TTL; Online on any replica lists every replica's
//     runners, and Config.OnPresence on every replica hears each one come
//     and go. Creating the entry is the cluster-wide claim, so a
//     second connection for one runner id, on any replica, is refused
//     (409 before the upgrade). A claim whose replica no longer answers,
//     or answers that it does not hold the runner (its removal of the
//     entry failed), is taken over at once: a dead replica's runners
//     reconnect elsewhere without waiting for the TTL. Heartbeats write
//     the claim only over the revision their replica last wrote, so a
//     replica whose claim another took (it looked dead for a moment)
//     never writes it back: it closes its socket with 4409 instead.
//   - A call is a NATS request to the holding replica's subject; it runs
//     there on the runner's socket as on one node, and its reply comes
//     back. A spawn or attach carries an inbox: the holder installs the
//     subscription on its socket (so replay_for frames reach only this
//     requester, as on one node) and publishes each of its frames there,
//     in order, plus a keep-alive while the stream lasts.
//   - Core NATS delivers at most once, so a relayed stream's messages are
//     numbered: a gap (a NATS node died with messages in flight) ends the
//     caller's stream with runner_disconnected rather than leave a hole;
//     attached again, the session is replayed from byte zero. On a NATS
//     cluster, Config.BucketReplicas 3 keeps presence on three nodes.
//     Messages larger than the server's max_payload (a file write, an
//     exec's answer) travel in parts; a call's large data field travels
//     beside its JSON and reaches the runner's frame as it is (checked to
//     be base64), never decoded and encoded again on the way.
//   - Every relayed call names its account (Managoat-Account): CallAs's,
//     or for Call (whose caller checked) the account the runner's presence
//     records. The replica holding the runner's socket, which
//     authenticated it, serves it only when the runner is that account's:
//     another account's runner is not_found (as another account's
//     sandbox is 404) and is never reached, whatever the calling replica
//     checked. A call naming no account, or several, is refused the same
//     way; there is no switch that serves one. A deletion names its
//     account likewise and is ignored otherwise.
//   - A replica that dies: a request to it fails at once (no responders)
//     or, for a call already in flight there (a long exec), after three
//     of its pings go unanswered, one per keep-alive interval; at the
//     latest at the call's deadline; unavailable either way, never a
//     hang. A stream relayed from it fails with runner_disconnected once
//     its keep-alives stop (3 intervals). A replica whose caller of a
//     relayed stream dies finds it so (three unanswered pings of the
//     caller, one per interval) and stops relaying it; the session goes
//     on on the runner, attachable. The runners reconnect to another
//     replica and their sessions are attached again from there, replayed
//     from byte zero by the daemon.
//   - Deleting a runner is a message every replica hears; the one holding
//     the socket closes it with 4404.
//   - A message on these subjects that is not what a replica sends (not a
//     frame, not a call, a presence entry that is not JSON) is dropped;
//     the first one is logged, later ones are not.
//
// # Trust on the bus
//
// The bus trusts nothing it carries that a replica did not seal. Every
// replica holds Config.ClusterKey, a secret nothing else holds (not the
// records, not the NATS servers); every message between replicas (calls,
// answers, session frames, keep-alives, pings, unsubscribes, deletions)
// and every presence entry is sealed with it: AES-256-GCM under a key
// derived (HKDF-SHA256) from it and the sending replica's session,
// bound to the message's subject and reply subject (a presence entry: to
// its key), with all of its headers inside (seal.go). So payloads are
// confidential too: a NATS user subscribed to ">" sees only ciphertext,
// random subjects and part numbers; the bucket's keys are a keyed hash
// of the runner id, its values sealed. A request (a call, a ping, a
// deletion, an unsubscribe, a keep-alive) opens once per receiving
// replica (a window of the sender's counters) and only within a minute
// of the receiver's clock; an answer goes to a subject used once, and a
// stream's frames are numbered, so a replay finds nobody or ends the
// stream. A message that does not open is dropped (counted, the first
// logged), never answered; a presence entry that does not open is
// ignored, and the replica whose runner it named writes its claim back
// at its next heartbeat. A claim of another replica, sealed (an old one
// written back), lets a socket go only when that replica answers, sealed,
// that it holds the runner. What a NATS user without the key can still
// do is deny service: delete the bucket or its entries, flood a subject,
// forge a "no responders" status; NATS accounts or permissions that keep
// other users off these subjects (deploy/nats) are the remedy for that.
//
// The subjects and the bucket are this package's own; every replica of a
// platform must use the same Prefix, Bucket and ClusterKey.
package natshost

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
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
	// BucketReplicas is how many NATS nodes keep the presence bucket
	// (default 1); 3 on a three-node cluster, so that losing a node loses
	// no presence (a bucket on one node is unreachable while it is down).
	BucketReplicas int
	// KeepAlive is the interval of a relayed stream's keep-alives
	// (default 2 s); a relayed stream silent for three of them fails
	// with runner_disconnected.
	KeepAlive time.Duration
	// OnPresence, if set, is called on every replica for the presence
	// changes of every runner of the platform, wherever it is connected:
	// online when its entry appears (a registration on any replica, or a
	// heartbeat after it was counted offline), offline when its entry is
	// removed (the socket closed, the runner deleted) or its last
	// heartbeat is older than the TTL (its replica died). It runs on the
	// goroutine that keeps the presence cache, after the cache has the
	// change (Online agrees with the notice); it must not block. The
	// runners present when the Host joins get no notice (Online lists
	// them).
	OnPresence func(info runner.Info, online bool)
	// ClusterKey is the platform's secret, the same on every replica and
	// held by nothing else (at least MinKeyBytes; ParseKey, ReadKeyFile);
	// required. Every message between replicas and every presence entry
	// is sealed with it (see the package doc).
	ClusterKey ClusterKey
	Logger     *slog.Logger
}

// Host is a runner.Host, runner.Caller and runner.Deleter over NATS.
type Host struct {
	cfg  Config
	nc   *nats.Conn
	kv   jetstream.KeyValue
	log  *slog.Logger
	seal *sealer

	subs []*nats.Subscription

	// The presence bucket as this replica last saw it, kept by a watcher
	// (Online and the account check read it without a round trip).
	watchStop  context.CancelFunc
	respPrefix string        // this replica's answers arrive on respPrefix + a call's token
	synced     chan struct{} // closed once the watcher has the whole bucket

	mu      sync.Mutex
	closed  bool
	cache   map[string]entry                 // presence by key
	calls   assembler                        // parted calls arriving here
	waiting map[string]*waiter               // calls waiting for their answers, by token
	badMsgs bool                             // a malformed message was logged
	dropped int                              // messages dropped as malformed or not a replica's
	local   map[string]*runner.Conn          // runners whose socket this replica holds
	revs    map[string]uint64                // the revision of each local runner's claim this replica last wrote
	joining map[string]bool                  // runners this replica is claiming (Register under way)
	relays  map[string]*relay                // streams this replica relays for callers elsewhere, by relay id
	remotes map[*runner.Subscription]*remote // this replica's callers' streams relayed from elsewhere
	wg      sync.WaitGroup

	heartbeatHook func() // tests: run once by the next Heartbeat before its write
}

var (
	_ runner.Host            = (*Host)(nil)
	_ runner.Caller          = (*Host)(nil)
	_ runner.Deleter         = (*Host)(nil)
	_ runner.RunnerAccounter = (*Host)(nil)
	_ runner.AccountCaller   = (*Host)(nil)
)

// entry is a presence record. Stamp is when its replica last wrote it
// (registration, heartbeat): an entry older than the TTL belongs to a
// replica that stopped heartbeating, and Online leaves it out even before
// the bucket ages it away.
type entry struct {
	Replica string      `json:"replica"`
	Info    runner.Info `json:"info"`
	Stamp   time.Time   `json:"stamp"`
}

// A relayed call is a NATS message whose data is the wire request as the
// runner would get it, and whose headers say which runner it is for, its
// deadline, and for a spawn or attach where the frames go (the inbox) and
// the relay's id (for an unsubscribe). The answer's data is the runner's
// reply frame, or empty with the error's code and detail in headers. No
// JSON wraps either: a request can be tens of MiB (a file write).
const (
	hdrRunner   = "Managoat-Runner"
	hdrDeadline = "Managoat-Deadline" // Unix nanoseconds
	hdrInbox    = "Managoat-Inbox"
	hdrRelay    = "Managoat-Relay"
	hdrCaller   = "Managoat-Caller"  // the calling replica, which the holder of a relayed stream pings
	hdrAccount  = "Managoat-Account" // the account a call is made for (CallAs); the holder refuses another's runner
	hdrCode     = "Managoat-Code"
	hdrDetail   = "Managoat-Detail"
)

// hdrKeepAlive marks a relayed stream's keep-alive (no data, not a wire
// frame, not numbered).
const hdrKeepAlive = "Managoat-Keep-Alive"

// New joins the platform: the presence bucket (created if missing) and
// this replica's subjects.
func New(ctx context.Context, cfg Config) (*Host, error) {
	if cfg.Conn == nil {
		return nil, errors.New("natshost: Config.Conn is required")
	}
	sl, err := newSealer(cfg.ClusterKey)
	if err != nil {
		return nil, err
	}
	cfg.ClusterKey = nil // the sealer keeps its own copy
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
	if cfg.BucketReplicas <= 0 {
		cfg.BucketReplicas = 1
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.Bucket, TTL: cfg.TTL, History: 1,
		Storage: jetstream.MemoryStorage, Replicas: cfg.BucketReplicas})
	if err != nil {
		return nil, fmt.Errorf("natshost: presence bucket %s: %w", cfg.Bucket, err)
	}
	h := &Host{cfg: cfg, nc: cfg.Conn, kv: kv, log: cfg.Logger, seal: sl, synced: make(chan struct{}), cache: map[string]entry{},
		waiting: map[string]*waiter{}, respPrefix: nats.NewInbox() + ".",
		local: map[string]*runner.Conn{}, revs: map[string]uint64{}, joining: map[string]bool{}, relays: map[string]*relay{}, remotes: map[*runner.Subscription]*remote{}}
	wctx, stop := context.WithCancel(context.Background())
	w, err := kv.WatchAll(wctx)
	if err != nil {
		stop()
		return nil, fmt.Errorf("natshost: watch presence: %w", err)
	}
	h.watchStop = stop
	h.wg.Add(1)
	go h.watch(w)
	for subj, f := range map[string]nats.MsgHandler{
		h.subject("call", cfg.Replica):  h.onCall,
		h.subject("unsub", cfg.Replica): h.onUnsub,
		h.subject("ping", cfg.Replica):  h.onPing,
		h.subject("delete"):             h.onDelete,
		h.respPrefix + "*":              h.onResponse,
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

// watch keeps the presence cache until Close, and tells OnPresence of
// its changes. Each TTL/4 it looks for entries whose last heartbeat is
// older than the TTL (a replica that died leaves its entries behind, and
// the bucket's expiry may come without a word to watchers).
func (h *Host) watch(w jetstream.KeyWatcher) {
	defer h.wg.Done()
	defer func() { _ = w.Stop() }()
	synced := false
	gone := map[string]bool{} // entries counted offline while still in the bucket
	sweep := time.NewTicker(h.cfg.TTL / 4)
	defer sweep.Stop()
	notify := func(info runner.Info, online bool) {
		if h.cfg.OnPresence != nil {
			h.cfg.OnPresence(info, online)
		}
	}
	for {
		select {
		case <-sweep.C:
			if !synced {
				continue
			}
			cutoff := time.Now().Add(-h.cfg.TTL)
			var stale []runner.Info
			h.mu.Lock()
			for k, e := range h.cache {
				if !gone[k] && !e.Stamp.IsZero() && e.Stamp.Before(cutoff) {
					gone[k] = true
					stale = append(stale, e.Info)
				}
			}
			h.mu.Unlock()
			for _, info := range stale {
				notify(info, false)
			}
			continue
		case upd, ok := <-w.Updates():
			if !ok {
				return
			}
			if upd == nil {
				if !synced {
					synced = true
					// Entries already stale at the join are offline, without a notice.
					cutoff := time.Now().Add(-h.cfg.TTL)
					h.mu.Lock()
					for k, e := range h.cache {
						if !e.Stamp.IsZero() && e.Stamp.Before(cutoff) {
							gone[k] = true
						}
					}
					h.mu.Unlock()
					close(h.synced)
				}
				continue
			}
			k := upd.Key()
			var e entry
			put := upd.Operation() == jetstream.KeyValuePut
			if put {
				var ok bool
				if e, ok = h.openEntry(k, upd.Value()); !ok {
					// Not a replica's: ignored, whatever it replaced
					// (a NATS user without the cluster key writes no
					// presence).
					h.badMessage("presence "+k, errUnsealed)
					continue
				}
			}
			h.mu.Lock()
			old, had := h.cache[k]
			if put {
				h.cache[k] = e
			} else {
				delete(h.cache, k)
			}
			h.mu.Unlock()
			wasOnline := had && !gone[k]
			delete(gone, k)
			if !synced {
				continue
			}
			switch {
			case put && !wasOnline:
				notify(e.Info, true)
			case !put && wasOnline:
				notify(old.Info, false)
			}
		}
	}
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

// key is a runner id's presence key: a keyed hash of the id (ids may
// hold characters a key may not, and the bucket's keys must not tell a
// NATS user the runners' ids).
func (h *Host) key(id string) string { return h.seal.keyOf(id) }

// sealEntry is e as the bucket holds it under key k: sealed, so that only
// a replica reads it and only a replica writes one that is taken.
func (h *Host) sealEntry(k string, e entry) []byte {
	b, _ := json.Marshal(e)
	return h.seal.seal(classPresence, h.cfg.Bucket, k, nil, b)
}

// openEntry opens a presence entry read under key k; false when it is not
// a replica's (not sealed with the cluster key, sealed for another key,
// or for another runner's).
func (h *Host) openEntry(k string, val []byte) (entry, bool) {
	_, b, _, err := h.seal.open(append([]byte(nil), val...), h.cfg.Bucket, k, classPresence)
	if err != nil {
		return entry{}, false
	}
	var e entry
	if json.Unmarshal(b, &e) != nil || h.key(e.Info.ID) != k {
		return entry{}, false
	}
	return e, true
}

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
	h.watchStop()
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
	if _, ok := h.local[id]; ok || h.joining[id] || h.closed {
		h.mu.Unlock()
		return runner.ErrAlreadyRegistered
	}
	// Until the claim is settled, this replica answers a holds-ping for
	// id as its holder (another replica must not take it meanwhile).
	h.joining[id] = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.joining, id)
		h.mu.Unlock()
	}()
	val := h.sealEntry(h.key(id), entry{Replica: h.cfg.Replica, Info: c.Info(), Stamp: time.Now().UTC()})
	ctx, cancel := opCtx()
	defer cancel()
	rev, err := h.kv.Create(ctx, h.key(id), val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		rev, err = h.takeOver(ctx, id, val)
	}
	if err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return runner.ErrAlreadyRegistered
	}
	h.local[id] = c
	h.revs[id] = rev
	return nil
}

// takeOver claims id from a replica that no longer holds its socket (it
// does not answer, or answers that it does not hold id: its removal of
// the entry failed); a holder that still has it keeps it
// (ErrAlreadyRegistered).
func (h *Host) takeOver(ctx context.Context, id string, val []byte) (uint64, error) {
	kve, err := h.kv.Get(ctx, h.key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		rev, err := h.kv.Create(ctx, h.key(id), val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, runner.ErrAlreadyRegistered
		}
		return rev, err
	}
	if err != nil {
		return 0, err
	}
	// An entry that is not a replica's claims nothing.
	e, ok := h.openEntry(kve.Key(), kve.Value())
	if ok && h.holds(ctx, e.Replica, id) {
		return 0, runner.ErrAlreadyRegistered
	}
	rev, err := h.kv.Update(ctx, h.key(id), val, kve.Revision())
	if err != nil {
		return 0, runner.ErrAlreadyRegistered // another replica took it first
	}
	h.log.Info("natshost: took over a runner from a replica that does not hold it", "runner", id, "replica", e.Replica)
	return rev, nil
}

// Answers to a holds-ping (a ping whose data is a runner id). An empty
// answer (a ping without data, or a replica of an earlier version) only
// says the replica is alive.
var (
	pongHeld = []byte("held")
	pongFree = []byte("free")
)

// onPing answers a ping: alive, and whether this replica holds (or is
// claiming) the runner id the ping names. A ping not sealed by a replica
// is not answered.
func (h *Host) onPing(m *nats.Msg) {
	_, data, _, err := h.seal.open(m.Data, m.Subject, m.Reply, classRequest)
	if err != nil || m.Reply == "" {
		h.badMessage(m.Subject, errUnsealed)
		return
	}
	var ans []byte
	if len(data) > 0 {
		id := string(data)
		h.mu.Lock()
		_, held := h.local[id]
		held = held || h.joining[id]
		h.mu.Unlock()
		ans = pongFree
		if held {
			ans = pongHeld
		}
	}
	_ = h.nc.Publish(m.Reply, h.seal.seal(classAnswer, m.Reply, "", nil, ans))
}

// ping asks replica whether it is alive and, with an id, whether it holds
// that runner: its sealed answer, or an error (no responders, no answer
// within a second). Answers on this replica's response subject that are
// not sealed by a replica for this ping are skipped, not taken.
func (h *Host) ping(ctx context.Context, replica string, id []byte) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	token := nats.NewInbox()[len(nats.InboxPrefix):]
	w := &waiter{wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.waiting[token] = w
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.waiting, token)
		h.mu.Unlock()
	}()
	subject, reply := h.subject("ping", replica), h.respPrefix+token
	if err := h.nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: h.seal.seal(classRequest, subject, reply, nil, id)}); err != nil {
		return nil, err
	}
	for {
		select {
		case <-w.wake:
			msgs, err := w.take()
			if err != nil {
				return nil, err
			}
			for _, m := range msgs {
				if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
					return nil, nats.ErrNoResponders
				}
				if _, data, _, err := h.seal.open(m.Data, m.Subject, "", classAnswer); err == nil {
					return data, nil
				}
				h.badMessage(m.Subject, errUnsealed)
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// holds reports whether replica answers a ping and does not deny holding
// runner id.
func (h *Host) holds(ctx context.Context, replica, id string) bool {
	if replica == h.cfg.Replica {
		h.mu.Lock()
		defer h.mu.Unlock()
		_, ok := h.local[id]
		return ok
	}
	ans, err := h.ping(ctx, replica, []byte(id))
	return err == nil && string(ans) != string(pongFree)
}

// alive reports whether replica answers a ping.
func (h *Host) alive(ctx context.Context, replica string) bool {
	if replica == h.cfg.Replica {
		return true
	}
	_, err := h.ping(ctx, replica, nil)
	return err == nil
}

// Unregister implements runner.Host.
func (h *Host) Unregister(id string, c *runner.Conn) {
	if h.dropLocal(id, c) {
		h.release(id)
	}
}

// dropLocal forgets c as the local connection of runner id; it reports
// false when c is no longer that connection (another took its place).
func (h *Host) dropLocal(id string, c *runner.Conn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.local[id] != c {
		return false
	}
	delete(h.local, id)
	delete(h.revs, id)
	return true
}

// release removes id's presence if this replica still holds it.
func (h *Host) release(id string) {
	ctx, cancel := opCtx()
	defer cancel()
	kve, err := h.kv.Get(ctx, h.key(id))
	if err != nil {
		return
	}
	if e, ok := h.openEntry(kve.Key(), kve.Value()); ok && e.Replica == h.cfg.Replica {
		_ = h.kv.Delete(ctx, h.key(id), jetstream.LastRevision(kve.Revision()))
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
	select {
	case <-h.synced:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	cutoff := time.Now().Add(-h.cfg.TTL)
	h.mu.Lock()
	out := make([]runner.Info, 0, len(h.cache))
	for _, e := range h.cache {
		if e.Stamp.IsZero() || e.Stamp.After(cutoff) {
			out = append(out, e.Info)
		}
	}
	h.mu.Unlock()
	runner.SortByConnected(out)
	return out, nil
}

// owner is the presence entry of id (its Replica holds the socket); a
// zero entry when it is offline.
func (h *Host) owner(ctx context.Context, id string) (entry, error) {
	h.mu.Lock()
	e, ok := h.cache[h.key(id)]
	h.mu.Unlock()
	// A cached entry naming this replica, whose socket is not here, is
	// one the watcher has not caught up on (a replayed claim the holder
	// has since written back over): the bucket decides.
	if ok && e.Replica != h.cfg.Replica && (e.Stamp.IsZero() || time.Since(e.Stamp) < h.cfg.TTL) {
		return e, nil
	}
	kve, err := h.kv.Get(ctx, h.key(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return entry{}, nil
	}
	if err != nil {
		return entry{}, sandbox.Unavailable("presence_unavailable", err)
	}
	// A fresh entry (decoded apart from the cached one, whose Caps
	// array the cache shares); one that is not a replica's names none.
	fresh, _ := h.openEntry(kve.Key(), kve.Value())
	return fresh, nil
}

// RunnerAccount implements runner.RunnerAccounter: the account of runner
// id, wherever it is connected.
func (h *Host) RunnerAccount(ctx context.Context, id string) (string, bool) {
	if c := h.Whereis(id); c != nil {
		return c.Info().Account, true
	}
	h.mu.Lock()
	e, ok := h.cache[h.key(id)]
	h.mu.Unlock()
	if ok {
		return e.Info.Account, true
	}
	kve, err := h.kv.Get(ctx, h.key(id))
	if err != nil {
		return "", false
	}
	fresh, ok := h.openEntry(kve.Key(), kve.Value())
	if !ok {
		return "", false
	}
	return fresh.Info.Account, true
}

// Heartbeat implements runner.Host: the runner's presence is refreshed
// (its TTL starts again) with a new last-seen time. The write is
// conditional on the revision this replica last wrote: a claim another
// replica took meanwhile (this one looked dead to it) is never written
// back; this replica closes its socket with 4409 and lets the runner go.
// A claim that vanished (aged out while NATS was unreachable, or lost with
// a node) is made again; one written after the socket closed meanwhile is
// removed again.
func (h *Host) Heartbeat(id string) {
	c := h.Whereis(id)
	if c == nil {
		return
	}
	info := c.Info()
	info.LastSeen = time.Now().UTC()
	val := h.sealEntry(h.key(id), entry{Replica: h.cfg.Replica, Info: info, Stamp: info.LastSeen})
	ctx, cancel := opCtx()
	defer cancel()
	h.mu.Lock()
	rev, hook := h.revs[id], h.heartbeatHook
	h.heartbeatHook = nil
	h.mu.Unlock()
	if hook != nil {
		hook()
	}
	nrev, err := h.kv.Update(ctx, h.key(id), val, rev)
	if err != nil {
		// Not the revision this replica wrote: see what the bucket holds.
		kve, gerr := h.kv.Get(ctx, h.key(id))
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound):
			nrev, err = h.kv.Create(ctx, h.key(id), val)
			if errors.Is(err, jetstream.ErrKeyExists) {
				h.lose(id, c, "")
				return
			}
		case gerr != nil:
			err = gerr
		default:
			// Another replica's claim lets go of the socket only when
			// that replica says it holds the runner: an entry that is
			// not a replica's, or an old one of a replica that no longer
			// holds it written back (replayed), is overwritten.
			if e, ok := h.openEntry(kve.Key(), kve.Value()); ok && e.Replica != h.cfg.Replica && h.holds(ctx, e.Replica, id) {
				h.lose(id, c, e.Replica)
				return
			}
			nrev, err = h.kv.Update(ctx, h.key(id), val, kve.Revision())
		}
	}
	if err != nil {
		h.log.Warn("natshost: heartbeat", "runner", id, "err", err)
		return
	}
	h.mu.Lock()
	held := h.local[id] == c
	if held {
		h.revs[id] = nrev
	}
	h.mu.Unlock()
	if !held {
		// The socket closed while this heartbeat wrote, and its release
		// came first: the claim written here would list a gone runner
		// online until the TTL. Remove it, unless someone wrote since.
		_ = h.kv.Delete(ctx, h.key(id), jetstream.LastRevision(nrev))
	}
}

// lose lets go of a local runner whose claim another replica holds: the
// socket is closed with 4409 (the daemon reconnects, through the
// balancer, to whichever replica then holds the claim or takes it).
func (h *Host) lose(id string, c *runner.Conn, other string) {
	if !h.dropLocal(id, c) {
		return
	}
	h.log.Warn("natshost: another replica holds this runner's claim; closing this socket", "runner", id, "replica", other)
	c.Close(wire.CloseDuplicate, "runner connected through another replica")
}

// Presence implements runner.Host. It does nothing: Config.OnPresence
// hears this replica's changes from the presence bucket, as every other
// replica does.
func (h *Host) Presence(runner.Info, bool) {}

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
	kve, err := h.kv.Get(ctx, h.key(id))
	if err != nil {
		return false
	}
	e, ok := h.openEntry(kve.Key(), kve.Value())
	if !ok || e.Info.Account != account {
		return false
	}
	b, _ := json.Marshal(map[string]string{"runner": id, "account": account})
	subject := h.subject("delete")
	return h.nc.Publish(subject, h.seal.seal(classRequest, subject, "", nil, b)) == nil && h.nc.FlushWithContext(ctx) == nil
}

// onDelete closes the socket of a deleted runner this replica holds, when
// the deletion is a replica's (sealed, and opened once: a replay is
// refused) and names the runner's account.
func (h *Host) onDelete(m *nats.Msg) {
	_, data, _, err := h.seal.open(m.Data, m.Subject, m.Reply, classRequest)
	if err != nil {
		h.badMessage(m.Subject, err)
		return
	}
	var d struct {
		Runner  string `json:"runner"`
		Account string `json:"account"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		h.badMessage(m.Subject, err)
		return
	}
	c := h.Whereis(d.Runner)
	if c == nil || d.Account == "" || d.Account != c.Info().Account {
		return
	}
	c.Close(wire.CloseDeleted, "runner deleted")
}

// Call implements runner.Caller: on this replica's socket when it holds
// the runner's, else relayed to the replica that does. It is for callers
// that checked the runner's account themselves: relayed, it names the
// account the runner's presence entry records (the holder refuses a call
// naming none), which the holder checks against its socket's as for
// CallAs. A platform's API calls through CallAs.
func (h *Host) Call(ctx context.Context, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	return h.call(ctx, nil, runnerID, req, sub)
}

// CallAs implements runner.AccountCaller: Call on behalf of account. The
// replica holding the runner's socket checks that the runner is
// account's, from the account its socket authenticated as, and refuses
// another's with not_found (runner.ErrNotAccounts), never reaching the
// runner; a relayed call carries the account for that check. An empty
// account owns no runner.
func (h *Host) CallAs(ctx context.Context, account, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	return h.call(ctx, &account, runnerID, req, sub)
}

func (h *Host) call(ctx context.Context, account *string, runnerID string, req *wire.Request, sub *runner.Subscription) (*wire.Reply, error) {
	if account != nil && *account == "" {
		return nil, runner.ErrNotAccounts // no account owns a runner for ""
	}
	if c := h.Whereis(runnerID); c != nil {
		if account != nil && *account != c.Info().Account {
			return nil, runner.ErrNotAccounts
		}
		return c.Call(ctx, req, sub)
	}
	oe, err := h.owner(ctx, runnerID)
	if err != nil {
		return nil, err
	}
	owner := oe.Replica
	if owner == "" || owner == h.cfg.Replica {
		return nil, sandbox.Unavailable(runner.ReasonOffline, nil)
	}
	if account == nil {
		account = &oe.Info.Account
	}
	hdr := nats.Header{hdrRunner: []string{runnerID}, hdrAccount: []string{*account}}
	body, err := encodeCall(req, hdr)
	if err != nil {
		return nil, err
	}
	if d, ok := ctx.Deadline(); ok {
		hdr.Set(hdrDeadline, strconv.FormatInt(d.UnixNano(), 10))
	}
	var rem *remote
	if sub != nil {
		rem, err = h.startRemote(owner, sub)
		if err != nil {
			return nil, err
		}
		hdr.Set(hdrInbox, rem.inbox)
		hdr.Set(hdrRelay, rem.id)
		hdr.Set(hdrCaller, h.cfg.Replica)
	}
	data, ahdr, err := h.request(ctx, owner, hdr, body)
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
		// No responders, or silent while the call waited: the holder is gone.
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, err)
	}
	if code := ahdr.Get(hdrCode); code != "" {
		if rem != nil {
			h.dropRemote(rem, false)
		}
		if code == wire.CodeNotFound && ahdr.Get(hdrDetail) == detailNotAccounts {
			return nil, runner.ErrNotAccounts // as a refusal on this replica reads
		}
		return nil, wire.ErrorFrom(code, ahdr.Get(hdrDetail))
	}
	f, err := wire.Decode(data)
	if err != nil || f.Kind != wire.KindReply {
		if rem != nil {
			h.dropRemote(rem, true)
		}
		return nil, sandbox.Unavailable(runner.ReasonDisconnected, fmt.Errorf("natshost: bad reply relayed from replica %s", owner))
	}
	if rem != nil {
		if !f.Reply.OK {
			h.dropRemote(rem, false)
		} else {
			// The stream is installed and its holder sends a keep-alive
			// each interval from now: silence for three ends it.
			rem.timer.Reset(3 * h.cfg.KeepAlive)
		}
	}
	return f.Reply, nil
}

// detailNotAccounts is the holder's refusal of a relayed call for
// another account's runner; the calling replica returns it as
// runner.ErrNotAccounts.
const detailNotAccounts = "no such runner in the caller's account"

// errHolderSilent fails a relayed call whose holder stopped answering
// pings while the call waited.
var errHolderSilent = errors.New("natshost: the replica holding the runner's socket stopped answering")

// request sends a call to replica owner (in parts if large) and waits for
// its answer (in parts if large), on this replica's one response
// subscription (a subscription per call cost a round trip of its own). No
// replica on the subject is nats.ErrNoResponders at once. While it waits
// longer than a keep-alive interval, the owner is pinged each interval: a
// replica that dies with the call in flight (a long exec) fails it after
// three unanswered pings (errHolderSilent), not at its deadline.
func (h *Host) request(ctx context.Context, owner string, hdr nats.Header, data []byte) ([]byte, nats.Header, error) {
	token := nats.NewInbox()[len(nats.InboxPrefix):]
	w := &waiter{wake: make(chan struct{}, 1)}
	h.mu.Lock()
	h.waiting[token] = w
	h.mu.Unlock()
	probe := time.NewTimer(h.cfg.KeepAlive)
	pong := make(chan bool, 1)
	pctx, stopProbe := context.WithCancel(ctx)
	probing, misses := false, 0
	defer func() {
		probe.Stop()
		stopProbe()
		if probing {
			<-pong
		}
		h.mu.Lock()
		delete(h.waiting, token)
		h.mu.Unlock()
	}()
	if err := h.publish(h.subject("call", owner), h.respPrefix+token, classRequest, hdr, data); err != nil {
		return nil, nil, err
	}
	var asm assembler
	for {
		select {
		case <-w.wake:
			msgs, err := w.take()
			if err != nil {
				return nil, nil, err
			}
			for _, m := range msgs {
				if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
					return nil, nil, nats.ErrNoResponders
				}
				out, whole, err := asm.add(m)
				if err != nil {
					return nil, nil, err
				}
				if !whole {
					continue
				}
				// Only the holder's sealed answer is taken; anything
				// else on this subject (a NATS user who saw it) is
				// skipped.
				ahdr, adata, _, err := h.seal.open(out, m.Subject, "", classAnswer)
				if err != nil {
					h.badMessage(m.Subject, err)
					continue
				}
				return adata, ahdr, nil
			}
		case <-probe.C:
			probing = true
			go func() { pong <- h.alive(pctx, owner) }()
		case ok := <-pong:
			probing = false
			if ok {
				misses = 0
			} else if misses++; misses >= 3 {
				return nil, nil, errHolderSilent
			}
			probe.Reset(h.cfg.KeepAlive)
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
}

// waiter holds the messages of one call's answer until its caller takes
// them: an answer in parts can be hundreds of messages arriving faster
// than the caller reassembles them (a fixed-size channel dropped the
// excess, and the call waited for its deadline). What it holds is bounded
// by maxAssembling bytes.
type waiter struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	bytes int
	over  bool          // the bound was passed: the answer is lost
	wake  chan struct{} // a token when msgs grew
}

var errAnswerTooLarge = errors.New("natshost: a relayed answer exceeded the reassembly bound")

// take returns the messages held since the last take, or
// errAnswerTooLarge once the bound was passed.
func (w *waiter) take() ([]*nats.Msg, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.over {
		return nil, errAnswerTooLarge
	}
	msgs := w.msgs
	w.msgs, w.bytes = nil, 0
	return msgs, nil
}

// onResponse hands an answer (or a part of one) to the call waiting for it.
func (h *Host) onResponse(m *nats.Msg) {
	token := m.Subject[len(h.respPrefix):]
	h.mu.Lock()
	w := h.waiting[token]
	h.mu.Unlock()
	if w == nil {
		return // the caller gave up
	}
	w.mu.Lock()
	if w.bytes+len(m.Data) > maxAssembling {
		w.over = true
	} else {
		w.msgs = append(w.msgs, m)
		w.bytes += len(m.Data)
	}
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
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
	seq              uint64 // the last message's number (hdrSeq)
	id, owner, inbox string
	sub              *runner.Subscription
	ns               *nats.Subscription
	timer            *time.Timer
	once             sync.Once
}

func (h *Host) startRemote(owner string, sub *runner.Subscription) (*remote, error) {
	r := &remote{id: nats.NewInbox()[len(nats.InboxPrefix):], owner: owner, sub: sub}
	r.inbox = nats.NewInbox()
	// Until the call's reply, its own deadline bounds the wait (Call
	// arms the timer then); from there, silence for three keep-alives
	// ends the stream.
	r.timer = time.AfterFunc(time.Hour, func() { h.endRemote(r, runner.ReasonDisconnected) })
	// One handler at a time, in arrival order: frames stay in order.
	ns, err := h.nc.Subscribe(r.inbox, func(m *nats.Msg) {
		// The holder's frames are sealed answers, numbered; its
		// keep-alives are sealed requests (each opens once). Anything
		// else on the inbox is dropped, and neither feeds the stream nor
		// keeps it alive.
		hdr, data, class, err := h.seal.open(m.Data, m.Subject, m.Reply, classAnswer, classRequest)
		if err != nil || (class == classRequest) != (hdr.Get(hdrKeepAlive) != "") || (class == classAnswer && hdr.Get(hdrSeq) == "") {
			h.badMessage(m.Subject, errUnsealed)
			return
		}
		r.timer.Reset(3 * h.cfg.KeepAlive)
		if class == classRequest {
			return // a keep-alive
		}
		m = &nats.Msg{Subject: m.Subject, Header: hdr, Data: data}
		if sq := m.Header.Get(hdrSeq); sq != "" {
			n, err := strconv.ParseUint(sq, 10, 64)
			if err != nil || n != r.seq+1 {
				h.log.Warn("natshost: a relayed stream lost messages; it ends and can be attached again", "relay", r.id, "want", r.seq+1, "got", sq)
				h.endRemote(r, runner.ReasonDisconnected)
				return
			}
			r.seq = n
		}
		switch m.Header.Get(hdrOut) {
		case "stdout":
			sub.Deliver(&wire.Stream{Kind: wire.StreamStdout, Data: m.Data})
			return
		case "stderr":
			sub.Deliver(&wire.Stream{Kind: wire.StreamStderr, Data: m.Data})
			return
		}
		f, err := wire.Decode(m.Data)
		if err == nil && f.Kind != wire.KindStream {
			err = errors.New("not a stream frame")
		}
		if err != nil {
			h.badMessage(m.Subject, err)
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
			subject := h.subject("unsub", r.owner)
			_ = h.nc.Publish(subject, h.seal.seal(classRequest, subject, "", nil, b))
		}
	})
}

// relay is a stream this replica relays to a caller on another replica.
// The connection's read loop queues its frames (relayFrame: a copy, under
// the connection's lock, so it must not publish there); the relay's own
// goroutine (forward) publishes them, consecutive output of one kind
// merged into messages of up to maxOutMsg, raw (no JSON, no base64), and
// sends keep-alives. Merging made output across replicas about 2× faster
// than a message per 32 KiB frame.
type relay struct {
	id     string
	caller string // the calling replica ("" from a replica that does not say)
	conn   *runner.Conn
	sub    *runner.Subscription
	inbox  string
	once   sync.Once
	done   chan struct{} // closed at an unsubscribe, an overflow or Close

	mu     sync.Mutex
	queue  []queued
	queued int           // output bytes in queue
	wake   chan struct{} // a token when the queue grew
	seq    uint64        // messages published (forward's own)
}

// queued is an output run of one kind, or a terminal frame (JSON).
type queued struct {
	kind     string // wire.StreamStdout/StreamStderr; "" for a terminal frame
	data     []byte
	terminal bool
}

// maxOutMsg bounds the output one relayed message carries; maxRelayQueue
// bounds what a relay may hold for a NATS connection that does not keep
// up: past it the caller's stream ends (runner_disconnected) and the
// session can be attached again.
const (
	maxOutMsg     = 256 << 10
	maxRelayQueue = 16 << 20
)

func (r *relay) stop() {
	r.once.Do(func() { close(r.done) })
}

// hdrSeq numbers a relayed stream's messages from 1. Core NATS delivers
// at most once: a node that dies can lose messages in flight while both
// replicas stay connected (to other nodes). A gap in the numbers ends the
// caller's stream with runner_disconnected, never a silent hole in its
// output; attached again, the session is replayed from byte zero.
const hdrSeq = "Managoat-Seq"

// hdrOut marks a relayed stream's output message, whose data is the raw
// bytes ("stdout" or "stderr"); exits, errors and keep-alives are JSON.
const hdrOut = "Managoat-Out"

// relayFrame queues one frame of rl; it runs under the connection's lock.
func (h *Host) relayFrame(rl *relay, f *wire.Stream) {
	rl.mu.Lock()
	switch f.Kind {
	case wire.StreamStdout, wire.StreamStderr:
		if rl.queued+len(f.Data) > maxRelayQueue {
			rl.mu.Unlock()
			h.log.Warn("natshost: a relayed stream fell too far behind; it ends and can be attached again", "relay", rl.id)
			rl.stop()
			return
		}
		if n := len(rl.queue); n > 0 && rl.queue[n-1].kind == f.Kind && len(rl.queue[n-1].data)+len(f.Data) <= maxOutMsg {
			rl.queue[n-1].data = append(rl.queue[n-1].data, f.Data...)
		} else {
			rl.queue = append(rl.queue, queued{kind: f.Kind, data: append(make([]byte, 0, min(maxOutMsg, 4*len(f.Data))), f.Data...)})
		}
		rl.queued += len(f.Data)
	case wire.StreamExit, wire.StreamError:
		g := *f
		g.ReplayFor = 0
		rl.queue = append(rl.queue, queued{data: wire.AppendStream(nil, &g), terminal: true})
	default:
		rl.mu.Unlock()
		return
	}
	rl.mu.Unlock()
	select {
	case rl.wake <- struct{}{}:
	default:
	}
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
		sealed, whole, err := h.calls.add(m)
		if err != nil {
			h.badMessage(m.Subject, err)
			return
		}
		if !whole {
			return // more parts to come
		}
		// Only a replica's call is served, once: one that is not sealed
		// with the cluster key (or was opened before: a replay, or a
		// stale one) is dropped unanswered.
		hdr, data, _, err := h.seal.open(sealed, m.Subject, m.Reply, classRequest)
		if err != nil {
			h.badMessage(m.Subject, err)
			return
		}
		fail := func(code, detail string) {
			if m.Reply != "" {
				_ = h.publish(m.Reply, "", classAnswer, nats.Header{hdrCode: []string{code}, hdrDetail: []string{detail}}, nil)
			}
		}
		req, err := decodeCall(data, hdr)
		if err != nil {
			h.badMessage(m.Subject, err)
			fail(wire.CodeInvalid, "bad relayed call")
			return
		}
		c := h.Whereis(hdr.Get(hdrRunner))
		if c == nil {
			fail(wire.CodeUnavailable, runner.ReasonOffline)
			return
		}
		// The call names its account, which must be the runner's: this
		// replica authenticated the runner's socket and does not take
		// the calling replica's word that it checked. A call naming no
		// account, or several, is refused.
		if acct := hdr[hdrAccount]; len(acct) != 1 || acct[0] == "" || acct[0] != c.Info().Account {
			fail(wire.CodeNotFound, detailNotAccounts)
			return
		}
		ctx := context.Background()
		if d, err := strconv.ParseInt(hdr.Get(hdrDeadline), 10, 64); err == nil && d > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, time.Unix(0, d))
			defer cancel()
		}
		var rl *relay
		if inbox := hdr.Get(hdrInbox); inbox != "" {
			rl = &relay{id: hdr.Get(hdrRelay), caller: hdr.Get(hdrCaller), conn: c, inbox: inbox, done: make(chan struct{}), wake: make(chan struct{}, 1)}
			rl.sub = runner.NewFrameSubscription(func(f *wire.Stream) { h.relayFrame(rl, f) })
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
			fail(wire.ErrorCode(err))
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
		if m.Reply != "" {
			_ = h.publish(m.Reply, "", classAnswer, nil, encodeReply(reply))
		}
	}()
}

// hdrDataAt, on a relayed call, is where in its data the request's JSON
// ends and its data field's base64 text begins: a large data field
// travels beside the JSON, so that the holder neither decodes it from
// JSON nor encodes it again (wire.Request.SetRawData). Relaying a 16 MiB
// write_file spent a quarter of its CPU there.
const hdrDataAt = "Managoat-Data-At"

// rawDataOver is the size from which a request's data travels beside it.
const rawDataOver = 64 << 10

// encodeCall is a relayed call's data: req's JSON, or with a large data
// field, req's JSON without it followed by its text (hdrDataAt, set in hdr).
func encodeCall(req *wire.Request, hdr nats.Header) ([]byte, error) {
	if req.Data == nil || len(*req.Data) < rawDataOver {
		return req.Encode()
	}
	bare := *req
	bare.Data = nil
	b, err := bare.Encode()
	if err != nil {
		return nil, err
	}
	hdr.Set(hdrDataAt, strconv.Itoa(len(b)))
	return append(b, *req.Data...), nil
}

// decodeCall is encodeCall's inverse; data that is not base64 text is an
// error (it goes into the runner's frame as it is).
func decodeCall(data []byte, hdr nats.Header) (*wire.Request, error) {
	at := hdr.Get(hdrDataAt)
	if at == "" {
		return wire.DecodeRequest(data)
	}
	n, err := strconv.Atoi(at)
	if err != nil || n < 0 || n > len(data) {
		return nil, fmt.Errorf("natshost: bad %s %q", hdrDataAt, at)
	}
	req, err := wire.DecodeRequest(data[:n])
	if err != nil {
		return nil, err
	}
	if err := req.SetRawData(data[n:]); err != nil {
		return nil, err
	}
	return req, nil
}

// encodeReply is a reply as the runner framed it.
func encodeReply(r *wire.Reply) []byte {
	if r.OK {
		return wire.AppendOK(nil, r.ID, r.Result)
	}
	return wire.AppendError(nil, r.ID, r.Error, r.Detail)
}

// badMessage logs the first malformed message this replica receives
// (later ones are dropped quietly: a flood must not flood the log).
func (h *Host) badMessage(subject string, err error) {
	h.mu.Lock()
	first := !h.badMsgs
	h.badMsgs = true
	h.dropped++
	h.mu.Unlock()
	if first {
		h.log.Warn("natshost: malformed message dropped (later ones are dropped without a word)", "subject", subject, "err", err)
	}
}

func (h *Host) endRelay(rl *relay) {
	rl.stop()
	rl.sub.Cancel()
	h.mu.Lock()
	if h.relays[rl.id] == rl {
		delete(h.relays, rl.id)
	}
	h.mu.Unlock()
}

// forward publishes a relayed stream's queued frames to its caller's
// inbox, in order and numbered (hdrSeq), with keep-alives, until its end,
// an unsubscribe, an overflow or Close; then it ends the relay. An
// overflow ends the caller's stream the way a gap does. Each keep-alive
// interval it pings the calling replica: one that died (its unsubscribe
// never comes) stops answering, and after three unanswered pings the
// relay ends, its subscription removed from the runner's connection,
// instead of relaying a session that never ends to nobody.
func (h *Host) forward(rl *relay) {
	defer h.wg.Done()
	defer h.endRelay(rl)
	tick := time.NewTicker(h.cfg.KeepAlive)
	defer tick.Stop()
	pong := make(chan bool, 1)
	pctx, stopProbe := context.WithCancel(context.Background())
	probing, misses := false, 0
	defer func() {
		stopProbe()
		if probing {
			<-pong
		}
	}()
	for {
		select {
		case <-rl.done:
			return
		case <-tick.C:
			_ = h.nc.Publish(rl.inbox, h.seal.seal(classRequest, rl.inbox, "", nats.Header{hdrKeepAlive: []string{"1"}}, nil))
			if rl.caller != "" && !probing {
				probing = true
				go func() { pong <- h.alive(pctx, rl.caller) }()
			}
			continue
		case ok := <-pong:
			probing = false
			if ok {
				misses = 0
			} else if misses++; misses >= 3 {
				h.log.Info("natshost: the caller of a relayed stream stopped answering; the relay ends", "relay", rl.id, "caller", rl.caller)
				return
			}
			continue
		case <-rl.wake:
		}
		rl.mu.Lock()
		items := rl.queue
		rl.queue, rl.queued = nil, 0
		rl.mu.Unlock()
		for _, it := range items {
			rl.seq++
			hdr := nats.Header{hdrSeq: []string{strconv.FormatUint(rl.seq, 10)}}
			if !it.terminal {
				hdr.Set(hdrOut, it.kind)
			}
			if err := h.nc.Publish(rl.inbox, h.seal.seal(classAnswer, rl.inbox, "", hdr, it.data)); err != nil {
				return
			}
			if it.terminal {
				return
			}
		}
	}
}

// onUnsub stops relaying a stream whose caller left.
func (h *Host) onUnsub(m *nats.Msg) {
	_, data, _, err := h.seal.open(m.Data, m.Subject, m.Reply, classRequest)
	if err != nil {
		h.badMessage(m.Subject, err)
		return
	}
	var u struct {
		Relay string `json:"relay"`
	}
	if err := json.Unmarshal(data, &u); err != nil {
		h.badMessage(m.Subject, err)
		return
	}
	h.mu.Lock()
	rl := h.relays[u.Relay]
	h.mu.Unlock()
	if rl != nil {
		h.endRelay(rl)
	}
}
