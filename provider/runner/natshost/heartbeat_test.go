package natshost_test

import (
	"context"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/runner/natshost"
)

// TestHeartbeatAfterTheSocketClosed: a heartbeat that began while the
// runner's socket was held here, and writes after the socket closed and
// its claim was removed, leaves no claim behind. It made the claim again
// (a vanished claim is made again), so the gone runner was listed online,
// placed on and announced online again, until the entry aged out (the
// TTL, 60 s by default).
func TestHeartbeatAfterTheSocketClosed(t *testing.T) {
	ns := startNATS(t)
	a := newReplica(t, ns, "a")
	if _, _, err := dialRunner(t, a, "laptop"); err != nil {
		t.Fatal(err)
	}
	id := onlineID(t, a.host)
	c := a.host.Whereis(id)
	natshost.SetHeartbeatHook(a.host, func() { a.host.Unregister(id, c) }) // the socket closes
	a.host.Heartbeat(id)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got := natshost.Holder(ctx, a.host, id); got != "" {
		t.Fatalf("the claim of a runner whose socket closed names %q after a late heartbeat, want none", got)
	}
	waitFor(t, "the runner offline", 5*time.Second, func() bool { return len(a.host.Online()) == 0 })
}
