package natshost_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/trusted"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/local"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisorWith(openTrusted)
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// openTrusted is the mechanism of the benchmarks' local provider (no root
// needed); the supervisor's re-execution opens it by name.
func openTrusted(name, stateDir string) (mechanism.Mechanism, error) {
	if name != "trusted" {
		return local.OpenMechanism(name, stateDir)
	}
	return trusted.New(filepath.Join(stateDir, "mech", "trusted"))
}

const token = "s3cret"

// clusterKey is the test platform's cluster key.
var clusterKey = natshost.ClusterKey(bytes.Repeat([]byte("k"), natshost.MinKeyBytes))

var quiet = slog.New(slog.DiscardHandler)

// startNATS runs a NATS server with JetStream in this process, on a
// loopback port of its own.
func startNATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

// replica is one `managoat serve` of a platform: its NATS connection, its
// host and runner server, behind an HTTP server of its own.
type replica struct {
	nc   *nats.Conn
	host *natshost.Host
	srv  *prov.Server
	ts   *httptest.Server
	dead atomic.Bool
}

func newReplica(t testing.TB, ns *server.Server, name string) *replica {
	t.Helper()
	return newReplicaLog(t, ns, name, quiet)
}

func newReplicaLog(t testing.TB, ns *server.Server, name string, log *slog.Logger) *replica {
	t.Helper()
	return newReplicaWith(t, ns, natshost.Config{Replica: name, TTL: 5 * time.Second, KeepAlive: 100 * time.Millisecond, Logger: log})
}

// newReplicaWith is a replica of cfg (its Conn made here).
func newReplicaWith(t testing.TB, ns *server.Server, cfg natshost.Config) *replica {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.Name(cfg.Replica))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.Conn = nc
	if cfg.ClusterKey == nil {
		cfg.ClusterKey = clusterKey
	}
	h, err := natshost.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return wrapReplica(t, nc, h)
}

// wrapReplica serves a replica's runner endpoint over HTTP.
func wrapReplica(t testing.TB, nc *nats.Conn, h *natshost.Host) *replica {
	return wrapReplicaHB(t, nc, h, time.Second)
}

// wrapReplicaHB is wrapReplica with the runners' heartbeat interval hb.
func wrapReplicaHB(t testing.TB, nc *nats.Conn, h *natshost.Host, hb time.Duration) *replica {
	r := &replica{nc: nc, host: h}
	r.srv = prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken(token), Host: h, Logger: quiet, HeartbeatInterval: hb})
	r.ts = httptest.NewServer(r.srv)
	t.Cleanup(r.kill)
	return r
}

// kill stops the replica as a crash would, as far as the others can tell:
// its sockets and its NATS connection drop.
func (r *replica) kill() {
	if r.dead.Swap(true) {
		return
	}
	r.srv.Close()
	r.ts.Close()
	r.host.Close()
	r.nc.Close()
}

// balancer stands in for the load balancer in front of the replicas: it
// sends each new connection to the replica chosen now.
type balancer struct {
	ts     *httptest.Server
	target atomic.Pointer[replica]
}

func newBalancer(t *testing.T, r *replica) *balancer {
	b := &balancer{}
	b.target.Store(r)
	b.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b.target.Load().srv.ServeHTTP(w, req)
	}))
	t.Cleanup(b.ts.Close)
	return b
}

func startDaemon(t testing.TB, url, name string, p sandbox.Provider) {
	t.Helper()
	d, err := runner.New(runner.Config{URL: url, Token: token, Name: name, Provider: p, Logger: quiet,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; d.Close() })
}

func waitFor(t testing.TB, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onlineID waits until h lists exactly one runner and returns its id.
func onlineID(t testing.TB, h *natshost.Host) string {
	t.Helper()
	var id string
	waitFor(t, "the runner online", 10*time.Second, func() bool {
		rs := h.Online()
		if len(rs) == 1 {
			id = rs[0].ID
		}
		return id != ""
	})
	return id
}

func newFake(t testing.TB) *fake.Provider {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	return f
}

func namer(t testing.TB, id string) func() string {
	return func() string {
		n, err := prov.For(id)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
}

func fakeCmd(script ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: script} }

// TestConformanceAcrossReplicas: the runner's socket is on replica A and
// every call of the whole conformance suite arrives at replica B, which
// relays it over NATS: replies, session frames in order, replay_for only
// to the requester, stdin, attach.
func TestConformanceAcrossReplicas(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	if a.host.Whereis(id) == nil || b.host.Whereis(id) != nil {
		t.Fatal("the runner's socket is not on replica a alone")
	}
	sandboxtest.Run(t, prov.NewProvider(b.host, prov.ProviderOptions{}), sandboxtest.Fixtures{
		ExecOK: fakeCmd("out:hello"), ExecOKWant: "hello",
		ExecFail: fakeCmd("out:oops", "exit:3"), ExecFailCode: 3,
		SpawnOK:   fakeCmd("out:hello", "exit:0"),
		SpawnDrop: fakeCmd("out:partial", "drop"),
		SpawnStay: fakeCmd("out:ready", "stay"),
		Stderr:    fakeCmd("out:x", "err:warning"), StderrWant: "warning",
		EnvDir: fakeCmd("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
		Slow:   fakeCmd("out:tick", "sleep:10s", "out:done"),
	}, sandboxtest.WithNames(namer(t, id)), sandboxtest.WithTimeout(5*time.Second))
}

// TestOneConnectionPerRunner: a second connection for a runner connected
// to replica A is refused on replica B too; deleting the runner through
// B closes its socket on A with 4404, wherever it is.
func TestOneConnectionPerRunner(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)

	// A second daemon of the same name, on replica b: refused (409).
	req, _ := http.NewRequest(http.MethodGet, b.ts.URL+"/api/runners/ws?name=laptop", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Fatalf("a second connection on another replica: %d, want 409", resp.StatusCode)
	}

	// Deleted through b: a's socket closes (the daemon reconnects after).
	// (a writes the claim before it records the socket.)
	waitFor(t, "a to hold the socket", 5*time.Second, func() bool { return a.host.Whereis(id) != nil })
	conn := a.host.Whereis(id)
	if !b.host.DeleteRunner(id, conn.Info().Account) {
		t.Fatal("DeleteRunner through b found no runner")
	}
	select {
	case <-conn.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the runner's socket on a was not closed")
	}
	if b.host.DeleteRunner(id, "another-account") {
		t.Fatal("another account deleted the runner")
	}
}

// TestReplicaDies: the replica holding the runner's socket dies. A call
// through the other replica is unavailable within its deadline, never a
// hang; a stream relayed from the dead replica ends with
// runner_disconnected; the runner reconnects to the surviving replica
// and its session is attached again there, replayed from byte zero.
func TestReplicaDies(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	lb := newBalancer(t, a)
	f := newFake(t)
	startDaemon(t, lb.ts.URL, "laptop", f)
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{CallTimeout: 5 * time.Second})
	ctx := context.Background()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd("out:before", "stay"), sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	sid := cmd.SessionID
	var got strings.Builder
	ev := <-cmd.Events()
	got.Write(ev.Data)
	if got.String() != "before" {
		t.Fatalf("first output %q", got.String())
	}

	lb.target.Store(b) // new connections go to b from now on
	a.kill()

	// The stream relayed from a ends, with runner_disconnected, promptly.
	select {
	case ev, ok := <-cmd.Events():
		var u *sandbox.UnavailableError
		if !ok || ev.Kind != sandbox.Error || !errors.As(ev.Err, &u) || u.Reason != prov.ReasonDisconnected {
			t.Fatalf("after the holder died: %+v (open %v), want runner_disconnected", ev, ok)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the relayed stream hung after its holder died")
	}

	// The runner reconnects to b (taking over a's claim at once), and the
	// session is attached again from b, replayed from byte zero.
	waitFor(t, "the runner on replica b", 15*time.Second, func() bool { return b.host.Whereis(id) != nil })
	again, err := p.Attach(ctx, h, sid, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, again, []byte("after")); err != nil {
		t.Fatal(err)
	}
	var replay strings.Builder
	deadline := time.After(10 * time.Second)
	for !strings.Contains(replay.String(), "echo:after") {
		select {
		case ev := <-again.Events():
			replay.Write(ev.Data)
		case <-deadline:
			t.Fatalf("after the reattach: %q", replay.String())
		}
	}
	if !strings.HasPrefix(replay.String(), "before") {
		t.Fatalf("the reattach did not replay from byte zero: %q", replay.String())
	}
	_ = again.Stop()
}

// TestCallToDeadReplicaIsBounded: the presence of a runner still names a
// replica that died (before the runner reconnects anywhere); a call is
// unavailable at once (no responders) or within its deadline.
func TestCallToDeadReplicaIsBounded(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	// a dies without a word: its NATS connection drops, its presence
	// entries stay until their TTL.
	a.nc.Close()
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := p.Get(ctx, sandbox.BuildHandle(prov.Name, namer(t, id)()))
	var u *sandbox.UnavailableError
	if !errors.As(err, &u) {
		t.Fatalf("call to a dead replica's runner: %v, want unavailable", err)
	}
	if el := time.Since(start); el > 3*time.Second {
		t.Fatalf("the call took %v, past its deadline", el)
	}
}

// sealedCall sends a call to subject as the replica of sealer (h) would
// relay it, sealed with the cluster key, and returns its answer opened.
func sealedCall(t testing.TB, nc *nats.Conn, h *natshost.Host, subject string, hdr nats.Header, data []byte) (*nats.Msg, error) {
	t.Helper()
	reply := nats.NewInbox()
	sub, err := nc.SubscribeSync(reply)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishMsg(&nats.Msg{Subject: subject, Reply: reply, Data: natshost.Seal(h, "request", subject, reply, hdr, data)}); err != nil {
		return nil, err
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		return nil, err
	}
	ahdr, adata, err := natshost.Open(h, m.Data, m.Subject, "")
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: m.Subject, Header: ahdr, Data: adata}, nil
}
