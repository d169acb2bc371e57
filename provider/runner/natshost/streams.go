package natshost

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Remote streams: a subscription on one replica to a session whose runner
// is held by another, relayed in order with sequence numbers and
// keep-alives.

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
