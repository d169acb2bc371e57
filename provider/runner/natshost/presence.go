package natshost

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Presence: which replica holds each runner's socket (the sealed
// key-value entries), taking it over, pinging its holder, and the
// runners online across replicas.

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

// whereisSettled is Whereis for a relayed call: a runner whose claim this
// replica is still settling (Register wrote the bucket, which another
// replica may already have seen, but has not recorded the socket yet) is
// waited for, at most joinWait, instead of answering runner_offline for
// a runner this replica is about to hold.
func (h *Host) whereisSettled(id string) *runner.Conn {
	for deadline := time.Now().Add(joinWait); ; time.Sleep(5 * time.Millisecond) {
		h.mu.Lock()
		c, joining := h.local[id], h.joining[id]
		h.mu.Unlock()
		if c != nil || !joining || time.Now().After(deadline) {
			return c
		}
	}
}

// joinWait bounds whereisSettled's wait (a claim is one bucket write).
const joinWait = 5 * time.Second

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
