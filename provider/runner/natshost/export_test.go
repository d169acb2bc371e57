package natshost

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/runner"
)

// PutPresence writes the presence of a runner held by replica, as that
// replica's Register would, for benchmarks of many runners.
func PutPresence(ctx context.Context, h *Host, replica string, info runner.Info) error {
	return PutPresenceAt(ctx, h, replica, info, time.Now().UTC())
}

// PutPresenceAt is PutPresence with the entry stamped at stamp (an old
// stamp: its replica stopped heartbeating).
func PutPresenceAt(ctx context.Context, h *Host, replica string, info runner.Info, stamp time.Time) error {
	k := h.key(info.ID)
	_, err := h.kv.Put(ctx, k, h.sealEntry(k, entry{Replica: replica, Info: info, Stamp: stamp}))
	return err
}

// RemoteInboxes are the inboxes of the streams h relays from elsewhere.
func RemoteInboxes(h *Host) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, r := range h.remotes {
		out = append(out, r.inbox)
	}
	return out
}

// Waiting is how many relayed calls h is waiting on.
func Waiting(h *Host) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiting)
}

// Holder is the replica the presence of runner id names, "" for none.
func Holder(ctx context.Context, h *Host, id string) string {
	kve, err := h.kv.Get(ctx, h.key(id))
	if err != nil {
		return ""
	}
	e, _ := h.openEntry(kve.Key(), kve.Value())
	return e.Replica
}

// Relays is how many streams h relays for callers elsewhere.
func Relays(h *Host) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.relays)
}

// SetHeartbeatHook sets fn to run in h's next Heartbeat, after it found
// the runner's socket held here and before it writes the claim.
func SetHeartbeatHook(h *Host, fn func()) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.heartbeatHook = fn
}

// PresenceKey is the bucket key of runner id's presence.
func PresenceKey(h *Host, id string) string { return h.key(id) }

// Seal is a message as h would send it on subject with reply: class
// "request" (a call, a ping, a deletion, a keep-alive) or "answer" (an
// answer, a stream's numbered frame). Tests use it to speak as a replica
// (one that holds the cluster key).
func Seal(h *Host, class, subject, reply string, hdr nats.Header, data []byte) []byte {
	c := byte(classAnswer)
	if class == "request" {
		c = classRequest
	}
	return h.seal.seal(c, subject, reply, hdr, data)
}

// Open opens a message received on subject with reply as h would.
func Open(h *Host, msg []byte, subject, reply string) (nats.Header, []byte, error) {
	hdr, data, _, err := h.seal.open(append([]byte(nil), msg...), subject, reply, classRequest, classAnswer)
	return hdr, data, err
}

// Claiming makes h answer, until the returned func runs, that it holds
// runner id (as while its Register claims it).
func Claiming(h *Host, id string) func() {
	h.mu.Lock()
	h.joining[id] = true
	h.mu.Unlock()
	return func() {
		h.mu.Lock()
		delete(h.joining, id)
		h.mu.Unlock()
	}
}

// Dropped is how many messages h dropped as malformed or not sealed by a
// replica.
func Dropped(h *Host) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dropped
}
