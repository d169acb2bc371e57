package natshost

import (
	"context"
	"encoding/json"
	"time"

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
	val, _ := json.Marshal(entry{Replica: replica, Info: info, Stamp: stamp})
	_, err := h.kv.Put(ctx, key(info.ID), val)
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
	kve, err := h.kv.Get(ctx, key(id))
	if err != nil {
		return ""
	}
	var e entry
	_ = json.Unmarshal(kve.Value(), &e)
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
