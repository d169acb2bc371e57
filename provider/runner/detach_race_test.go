package runner_test

import (
	"context"
	"testing"
	"time"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// TestNoDetachWhileAnAttachIsInFlight: a session's last subscription ends
// (its Command stopped) while an attach of the same session waits for its
// reply on the same connection. A detach sent then would reach the daemon
// after the attach and unbind it, leaving the new Command with no live
// output (natshost's relayed streams hung on keep-alives this way). The
// detach is held back until the attach is answered, and sent only when no
// subscription is left: when the second Command stops.
func TestNoDetachWhileAnAttachIsInFlight(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd := dialRawCaps(t, pl, "race", "")
	_, h := rawName(t, pl.online(t))
	p := pl.srv.Provider()
	c1 := spawnOnRaw(t, p, rd, h)

	type res struct {
		c   *sandbox.Command
		err error
	}
	attached := make(chan res, 1)
	go func() {
		c, err := p.Attach(context.Background(), h, "s1", sandbox.AttachOptions{})
		attached <- res{c, err}
	}()
	att := rd.next()
	if att.Op != wire.OpAttach || att.SessionID != "s1" {
		t.Fatalf("request %+v, want the attach of s1", att)
	}
	_ = c1.Stop() // its Unsubscribe runs before Stop returns
	// A marker call: whatever Stop wrote reached the socket before it.
	listed := make(chan error, 1)
	go func() { _, err := p.ListSessions(context.Background(), h); listed <- err }()
	if req := rd.next(); req.Op != wire.OpListSessions {
		t.Fatalf("after the first Command stopped, the daemon got %+v before the marker (want no detach while the attach is in flight)", req)
	} else {
		rd.send(sprintf(`{"id":%d,"ok":true,"result":{"sessions":[]}}`, req.ID))
	}
	if err := <-listed; err != nil {
		t.Fatal(err)
	}
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s1"}}`, att.ID))
	r := <-attached
	if r.err != nil {
		t.Fatal(r.err)
	}
	rd.send(string(wire.AppendStream(nil, &wire.Stream{Kind: wire.StreamStdout, SessionID: "s1", Data: []byte("live")})))
	if ev := recv(t, r.c, 5*time.Second); ev.Kind != sandbox.Stdout || string(ev.Data) != "live" {
		t.Fatalf("attached Command got %v %q, want the live output", ev.Kind, ev.Data)
	}
	_ = r.c.Stop()
	if req := rd.next(); req.Op != wire.OpDetach || req.SessionID != "s1" {
		t.Fatalf("after the last Command stopped the daemon got %+v, want a detach of s1", req)
	}
}
