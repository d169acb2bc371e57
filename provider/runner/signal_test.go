package runner_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// dialRawCaps is dialRaw with the handshake's caps.
func dialRawCaps(t testing.TB, pl *platform, name, caps string) *rawDaemon {
	t.Helper()
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}, wire.ParamCaps: {caps}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(wire.ReadLimit)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return &rawDaemon{t: t, ws: ws}
}

// spawnOnRaw spawns through p on the raw daemon, answering the spawn with
// session s1.
func spawnOnRaw(t *testing.T, p *prov.Provider, rd *rawDaemon, h *sandbox.Handle) *sandbox.Command {
	t.Helper()
	type res struct {
		c   *sandbox.Command
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := p.Spawn(context.Background(), h, sandbox.Cmd{Name: "sh"}, sandbox.SpawnOptions{Detachable: true})
		got <- res{c, err}
	}()
	req := rd.next()
	if req.Op != wire.OpSpawn {
		t.Fatalf("first request %+v, want spawn", req)
	}
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s1"}}`, req.ID))
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { _ = r.c.Stop() })
	return r.c
}

// TestSignalOverTheWire (issue 31, 5): the runner provider forwards a
// signal to a session as the signal op (session id and signal number),
// and only to a daemon that reported the signal capability: to any other
// (Fountain's daemon, which would answer not_supported) nothing is
// sent and the answer is ErrNotSupported, so a CLI falls back to what it
// did before.
func TestSignalOverTheWire(t *testing.T) {
	t.Run("Capable", func(t *testing.T) {
		pl := newPlatform(t, prov.ServerConfig{})
		rd := dialRawCaps(t, pl, "sig", wire.CapSignal)
		_, h := rawName(t, pl.online(t))
		p := pl.srv.Provider()
		c := spawnOnRaw(t, p, rd, h)
		done := make(chan error, 1)
		go func() { done <- p.SignalCommand(context.Background(), c, syscall.SIGINT) }()
		req := rd.next()
		if req.Op != wire.OpSignal || req.SessionID != "s1" || req.Signal != int(syscall.SIGINT) || req.Name != h.Name {
			t.Fatalf("signal request %+v, want op signal, session s1, signal 2, name %s", req, h.Name)
		}
		rd.send(sprintf(`{"id":%d,"ok":true,"result":{}}`, req.ID))
		if err := <-done; err != nil {
			t.Fatalf("signal: %v", err)
		}
		go func() { done <- p.SignalCommand(context.Background(), c, syscall.SIGTERM) }()
		req = rd.next()
		rd.send(sprintf(`{"id":%d,"ok":false,"error":"not_found","detail":"no session"}`, req.ID))
		if err := <-done; !errors.Is(err, sandbox.ErrCommandExited) {
			t.Fatalf("signal to a session gone: %v, want command exited", err)
		}
	})
	t.Run("Original", func(t *testing.T) {
		pl := newPlatform(t, prov.ServerConfig{})
		rd := dialRawCaps(t, pl, "old", "")
		_, h := rawName(t, pl.online(t))
		p := pl.srv.Provider()
		c := spawnOnRaw(t, p, rd, h)
		err := p.SignalCommand(context.Background(), c, syscall.SIGINT)
		if !errors.Is(err, sandbox.ErrNotSupported) {
			t.Fatalf("signal on a daemon without the capability: %v, want not supported", err)
		}
	})
}
