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
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/managoat/managoat/provider/runner"
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
