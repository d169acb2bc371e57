package runner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func fakeCmd(script ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: script} }

var fakeFixtures = sandboxtest.Fixtures{
	ExecOK: fakeCmd("out:hello"), ExecOKWant: "hello",
	ExecFail: fakeCmd("out:oops", "exit:3"), ExecFailCode: 3,
	SpawnOK:   fakeCmd("out:hello", "exit:0"),
	SpawnDrop: fakeCmd("out:partial", "drop"),
	SpawnStay: fakeCmd("out:ready", "stay"),
	Stderr:    fakeCmd("out:x", "err:warning"), StderrWant: "warning",
	EnvDir:  fakeCmd("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
	Slow:    fakeCmd("out:tick", "sleep:10s", "out:done"),
	Connect: func(addr string) sandbox.Cmd { return fakeCmd("connect:" + addr) },
}

// TestConformanceOverWireWithFake runs the whole suite through the platform
// end, a real WebSocket on loopback and the real daemon, with provider/fake
// behind the daemon.
func TestConformanceOverWireWithFake(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	sandboxtest.Run(t, pl.srv.Provider(), fakeFixtures, sandboxtest.WithNames(namer(id)), sandboxtest.WithTimeout(5*time.Second))
}

// TestConformanceThroughProxy runs the suite from "another process": a
// Client talking to the platform's proxy endpoint, which relays to the
// daemon. This is the path of `managoat --provider runner` against a
// `managoat serve`.
func TestConformanceThroughProxy(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	cl := prov.NewClient(pl.ts.URL, token)
	t.Cleanup(func() { _ = cl.Close() })
	sandboxtest.Run(t, prov.NewProvider(cl, prov.ProviderOptions{}), fakeFixtures,
		sandboxtest.WithNames(namer(id)), sandboxtest.WithTimeout(5*time.Second))
}

// TestSessionSurvivesReconnect is invariant 9 end to end: the runner is
// deleted on the platform (4404), the subscriber sees runner_disconnected
// (never an exit), the daemon reconnects, and list_sessions + attach deliver
// the replay and then live output on the new socket.
func TestSessionSurvivesReconnect(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	p := pl.srv.Provider()
	ctx := context.Background()
	h, err := p.Create(ctx, namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Spawn(ctx, h, fakeCmd("out:ready", "stay"), sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, c, 5*time.Second); string(ev.Data) != "ready" {
		t.Fatalf("%+v", ev)
	}
	pl.host.Delete(id)
	ev := recv(t, c, 5*time.Second)
	var una *sandbox.UnavailableError
	if ev.Kind != sandbox.Error || !errors.As(ev.Err, &una) || una.Reason != prov.ReasonDisconnected {
		t.Fatalf("want runner_disconnected, got %+v", ev)
	}
	if err := c.WriteStdin(ctx, []byte("x")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("stdin on the ended handle: %v", err)
	}
	if id2 := pl.online(t); id2 != id {
		t.Fatalf("runner id changed across the reconnect: %s → %s", id, id2)
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || ss[0].ID != c.SessionID {
		t.Fatalf("sessions %+v, %v", ss, err)
	}
	a, err := p.Attach(ctx, h, c.SessionID, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	if ev := recv(t, a, 5*time.Second); string(ev.Data) != "ready" {
		t.Fatalf("replay %+v", ev)
	}
	if err := a.WriteStdin(ctx, []byte("again")); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, a, 5*time.Second); string(ev.Data) != "echo:again" {
		t.Fatalf("live %+v", ev)
	}
	if err := a.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, a, 5*time.Second); ev.Kind != sandbox.Exit || ev.Code != 0 {
		t.Fatalf("exit %+v", ev)
	}
}

// Destroying a sandbox ends its attached sessions with a terminal event
// through the wire (the daemon does not cut its listeners off first).
func TestDestroyEndsAttachedSessions(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	p := pl.srv.Provider()
	ctx := context.Background()
	h, err := p.Create(ctx, namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Spawn(ctx, h, fakeCmd("out:ready", "stay"), sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, c, 5*time.Second)
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, c, 5*time.Second); !ev.Terminal() {
		t.Fatalf("after destroy: %+v", ev)
	}
	if _, err := p.Get(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get after destroy: %v", err)
	}
}

// A caller that cancels (or times out) never takes the runner's socket
// down for everyone else.
func TestCancelledCallersKeepTheSocket(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	conn := pl.host.Whereis(id)
	p := pl.srv.Provider()
	h, err := p.Create(context.Background(), namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 1<<20)
	for i := 0; i < 20; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(i%5)*50*time.Microsecond)
		_ = p.WriteFile(ctx, h, "big", big, sandbox.WriteFileOptions{})
		cancel()
	}
	if _, err := p.Get(context.Background(), h); err != nil {
		t.Fatalf("after cancelled callers: %v", err)
	}
	if pl.host.Whereis(id) != conn {
		t.Fatal("the socket was replaced: a cancelled caller closed it")
	}
}
