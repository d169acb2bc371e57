package natshost_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/platform/api"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// crash stops the replica as a crash would: its NATS connection drops
// first, so it removes no presence on the way (kill is an orderly stop
// as far as the bucket can tell).
func (r *replica) crash() {
	if r.dead.Swap(true) {
		return
	}
	r.nc.Close()
	r.srv.Close()
	r.ts.Close()
	r.host.Close()
}

// dialRunner connects a runner named name to r's endpoint as a daemon
// would, without a daemon: the socket is the test's to read.
func dialRunner(t *testing.T, r *replica, name string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	u := strings.Replace(r.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err == nil {
		t.Cleanup(func() { _ = ws.CloseNow() })
	}
	return ws, resp, err
}

// closeCode reads ws (answering the platform's pings) until it closes,
// and returns its close code; -1 when it stayed open for d.
func closeCode(ws *websocket.Conn, d time.Duration) websocket.StatusCode {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

// TestStaleClaimOfALiveReplica: the presence of a runner names replica b,
// which is alive but does not hold the runner's socket (its removal of
// the entry failed: NATS was unreachable when the socket closed). The
// runner connecting to replica a is admitted at once, not refused with
// 409 until the entry ages out.
func TestStaleClaimOfALiveReplica(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	id := prov.StableID("local", "laptop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := natshost.PutPresence(ctx, a.host, b.host.Replica(), prov.Info{ID: id, Account: "local", Name: "laptop", ConnectedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	_, resp, err := dialRunner(t, a, "laptop")
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("a runner claimed by a replica that does not hold it: %d %v, want admitted", code, err)
	}
	waitFor(t, "the runner held by a", 5*time.Second, func() bool { return a.host.Whereis(id) != nil })
}

// TestLostClaimClosesWith4409: replica b took the claim of a runner whose
// socket replica a still holds (a looked dead to b for a moment, and the
// runner connected to b). At its next heartbeat a finds the claim is
// b's, and b answers that it holds the runner: a closes its socket with
// 4409 instead of writing the claim back (two replicas both serving one
// runner id), and leaves b's claim in place.
func TestLostClaimClosesWith4409(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	ws, _, err := dialRunner(t, a, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	id := onlineID(t, b.host)
	info := a.host.Whereis(id).Info()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	defer natshost.Claiming(b.host, id)()
	if err := natshost.PutPresence(ctx, b.host, b.host.Replica(), info); err != nil {
		t.Fatal(err)
	}
	if code := closeCode(ws, 10*time.Second); code != wire.CloseDuplicate {
		t.Fatalf("a's socket of a runner claimed by b: close %d, want 4409", code)
	}
	waitFor(t, "a to let the runner go", 5*time.Second, func() bool { return a.host.Whereis(id) == nil })
	if got := natshost.Holder(ctx, b.host, id); got != "b" {
		t.Fatalf("the claim names %q after a let go, want b's kept", got)
	}
}

// TestCallToCrashedReplicaEndsBeforeDeadline: a call relayed to the
// replica holding the runner's socket is waiting (a long exec) when that
// replica crashes. The caller learns it from the replica's silence
// (three keep-alive intervals) and gets unavailable, long before the
// call's own deadline.
func TestCallToCrashedReplicaEndsBeforeDeadline(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	h, err := p.Create(context.Background(), namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, h, fakeCmd("sleep:90s", "out:late"), sandbox.ExecOptions{})
		done <- err
	}()
	waitFor(t, "the exec relayed to a", 10*time.Second, func() bool { return natshost.Waiting(b.host) == 1 })
	start := time.Now()
	a.crash()
	select {
	case err := <-done:
		var u *sandbox.UnavailableError
		if !errors.As(err, &u) || u.Reason != prov.ReasonDisconnected {
			t.Fatalf("exec on a crashed replica's runner: %v, want unavailable runner_disconnected", err)
		}
		t.Logf("unavailable %v after the crash", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		t.Fatal("the caller still waits 30 s after the replica holding the runner crashed")
	}
}

// TestMalformedStreamMessage: messages on a relayed stream's inbox that
// are not frames are dropped, logged once, and the stream goes on.
func TestMalformedStreamMessage(t *testing.T) {
	ns := startNATS(t)
	var logBuf syncBuf
	a := newReplica(t, ns, "a")
	b := newReplicaLog(t, ns, "b", slog.New(slog.NewTextHandler(&logBuf, nil)))
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	ctx := context.Background()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd("out:ready", "stay"), sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Stop() }()
	if ev := <-cmd.Events(); string(ev.Data) != "ready" {
		t.Fatalf("first event %+v", ev)
	}
	inboxes := natshost.RemoteInboxes(b.host)
	if len(inboxes) != 1 {
		t.Fatalf("%d relayed streams on b, want 1", len(inboxes))
	}
	for _, junk := range []string{"not json", `{"type":"nope"}`, "\xff\x00"} {
		if err := a.nc.Publish(inboxes[0], []byte(junk)); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, cmd, []byte("still")); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-cmd.Events():
		if string(ev.Data) != "echo:still" {
			t.Fatalf("after the junk: %+v", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stream stopped after the junk")
	}
	if n := strings.Count(logBuf.String(), "malformed message dropped"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logBuf.String())
	}
}

// TestStaleEntryReadConcurrently: calls for a runner whose presence entry
// is past its TTL (its replica stopped heartbeating) read the bucket
// again, many at once; none writes into the cached entry another reads
// (the race detector watches: decoding into a copy of the cached entry
// reused its Caps array).
func TestStaleEntryReadConcurrently(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	id := prov.StableID("local", "laptop")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info := prov.Info{ID: id, Account: "local", Name: "laptop", Caps: []string{"network_policy", "terminate_session"}, ConnectedAt: time.Now()}
	if err := natshost.PutPresenceAt(ctx, a.host, a.host.Replica(), info, time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see the entry", 5*time.Second, func() bool { _, ok := b.host.RunnerAccount(ctx, id); return ok })
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &wire.Request{Op: wire.OpGet, Name: "x"}
			_, err := b.host.Call(ctx, id, req, nil)
			var u *sandbox.UnavailableError
			if !errors.As(err, &u) {
				t.Errorf("a call for a runner its replica does not hold: %v, want unavailable", err)
			}
		}()
	}
	wg.Wait()
}

// TestAnswerInManyParts: on a NATS server whose max_payload is small, a
// call's request and answer travel in hundreds of parts; every part of
// the answer reaches the caller (none dropped for want of room while the
// caller reassembles), so the call completes instead of waiting for its
// deadline.
func TestAnswerInManyParts(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true, MaxPayload: 4096})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB: ~350 parts of 3 KiB each way
	for i := range 3 {
		res, err := p.Exec(ctx, h, fakeCmd("out:"+big), sandbox.ExecOptions{})
		if err != nil {
			t.Fatalf("exec %d of 1 MiB across replicas in parts: %v", i, err)
		}
		if string(res.Output) != big {
			t.Fatalf("exec %d: %d bytes back, want %d", i, len(res.Output), len(big))
		}
	}
}

// presenceLog records OnPresence notices as "online ID" / "offline ID".
type presenceLog struct {
	mu     sync.Mutex
	events []string
}

func (l *presenceLog) on(info prov.Info, online bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if online {
		l.events = append(l.events, "online "+info.ID)
	} else {
		l.events = append(l.events, "offline "+info.ID)
	}
}

func (l *presenceLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.events, ", ")
}

// TestPresenceClusterWide: every replica hears every runner come and go,
// wherever its socket is: a runner connecting to replica a is online on
// a and b, closing its socket is offline on both, and a replica that
// crashes holding it is offline on the other once its heartbeats are
// older than the TTL (no removal ever comes from the dead replica).
func TestPresenceClusterWide(t *testing.T) {
	ns := startNATS(t)
	var la, lb presenceLog
	cfg := func(name string, l *presenceLog) natshost.Config {
		return natshost.Config{Replica: name, TTL: 2 * time.Second, KeepAlive: 100 * time.Millisecond, Logger: quiet, OnPresence: l.on}
	}
	a, b := newReplicaWith(t, ns, cfg("a", &la)), newReplicaWith(t, ns, cfg("b", &lb))
	id := prov.StableID("local", "laptop")
	expect := func(l *presenceLog, where, want string) {
		t.Helper()
		waitFor(t, "presence on "+where+": "+want, 10*time.Second, func() bool { return l.String() == want })
	}
	ws, _, err := dialRunner(t, a, "laptop")
	if err != nil {
		t.Fatal(err)
	}
	expect(&la, "a", "online "+id)
	expect(&lb, "b", "online "+id)
	_ = ws.CloseNow()
	expect(&la, "a", "online "+id+", offline "+id)
	expect(&lb, "b", "online "+id+", offline "+id)

	if _, _, err := dialRunner(t, a, "laptop"); err != nil {
		t.Fatal(err)
	}
	expect(&lb, "b", "online "+id+", offline "+id+", online "+id)
	a.crash()
	expect(&lb, "b", "online "+id+", offline "+id+", online "+id+", offline "+id)
	if n := len(b.host.Online()); n != 0 {
		t.Fatalf("b lists %d runners after a's crash, want none", n)
	}
}

// TestAnotherAccountsRunnerAcrossReplicas: replica b, seen from an
// account (as the platform's API sees it, api.AccountRunners over the
// Host), never lists or serves a runner of another account connected to
// replica a: a call is runner_offline and the runner is never reached;
// its own account's view reaches it.
func TestAnotherAccountsRunnerAcrossReplicas(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if acct, online := b.host.RunnerAccount(ctx, id); acct != "local" || !online {
		t.Fatalf("RunnerAccount on b: %q %v, want local online", acct, online)
	}
	other := api.AccountRunners(b.host, "mallory")
	if rs, err := other.Runners(ctx); err != nil || len(rs) != 0 {
		t.Fatalf("another account's runners on b: %v %v, want none", rs, err)
	}
	p := prov.NewProvider(other, prov.ProviderOptions{})
	_, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	var u *sandbox.UnavailableError
	if !errors.As(err, &u) || u.Reason != prov.ReasonOffline {
		t.Fatalf("another account's create on the runner through b: %v, want runner_offline", err)
	}
	if b.host.DeleteRunner(id, "mallory") {
		t.Fatal("another account deleted the runner through b")
	}
	mine := prov.NewProvider(api.AccountRunners(b.host, "local"), prov.ProviderOptions{})
	if _, err := mine.Create(ctx, namer(t, id)(), sandbox.CreateOptions{}); err != nil {
		t.Fatalf("the runner's own account through b: %v", err)
	}
}

// TestHolderSilentAfterReply: the replica holding a runner's socket
// answers a spawn and then dies before its stream's first message or
// keep-alive. The caller's stream ends with runner_disconnected after
// three keep-alive intervals, not after an hour.
func TestHolderSilentAfterReply(t *testing.T) {
	ns := startNATS(t)
	b := newReplica(t, ns, "b")
	// Replica z is a NATS subscriber standing in for a replica: it
	// answers a spawn as the runner would, then says nothing more.
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.Subscribe("managoat.runners.call.z", func(m *nats.Msg) {
		_ = nc.Publish(m.Reply, natshost.Seal(b.host, "answer", m.Reply, "", nil, wire.AppendOK(nil, 1, []byte(`{"session_id":"s1"}`))))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	id := prov.StableID("local", "laptop")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := natshost.PutPresence(ctx, b.host, "z", prov.Info{ID: id, Account: "local", Name: "laptop", ConnectedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see z's runner", 5*time.Second, func() bool { return len(b.host.Online()) == 1 })
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	cmd, err := p.Spawn(ctx, sandbox.BuildHandle(prov.Name, namer(t, id)()), fakeCmd("out:x"), sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-cmd.Events():
		var u *sandbox.UnavailableError
		if ev.Kind != sandbox.Error || !errors.As(ev.Err, &u) || u.Reason != prov.ReasonDisconnected {
			t.Fatalf("a stream whose holder fell silent after its reply: %+v, want runner_disconnected", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stream whose holder fell silent after its reply still waits after 10 s")
	}
}

// TestCallerReplicaDies: the replica a session's caller is on crashes
// while the replica holding the runner's socket relays it. Its
// unsubscribe never comes; the holder finds the caller gone (three
// unanswered pings) and ends the relay, instead of relaying a session
// that never ends to nobody. The session itself goes on, attachable.
func TestCallerReplicaDies(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	ctx := context.Background()
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd("out:ready", "stay"), sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Stop() }()
	if ev := <-cmd.Events(); string(ev.Data) != "ready" {
		t.Fatalf("first event %+v", ev)
	}
	if n := natshost.Relays(a.host); n != 1 {
		t.Fatalf("a relays %d streams, want 1", n)
	}
	b.crash()
	waitFor(t, "a to end the relay of a dead caller", 10*time.Second, func() bool { return natshost.Relays(a.host) == 0 })
	pa := prov.NewProvider(a.host, prov.ProviderOptions{})
	again, err := pa.Attach(ctx, h, cmd.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatalf("the session after its caller's replica died: %v", err)
	}
	defer func() { _ = again.Stop() }()
	if ev := <-again.Events(); string(ev.Data) != "ready" {
		t.Fatalf("the session attached again on a: %+v", ev)
	}
}

// TestRelayedDataIsBase64: a relayed call whose data travels beside its
// JSON (Managoat-Data-At) is refused invalid when that data is not base64
// text (it would go into the runner's frame as it is: a quote would add
// fields of its own), and the replica goes on serving; a large file
// written and read back across replicas arrives whole.
func TestRelayedDataIsBase64(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	bare := []byte(`{"id":1,"op":"write_file","name":"` + h.Name + `","path":"/x"}`)
	// As replica b would relay it (sealed), with data that is not base64.
	ans, err := sealedCall(t, nc, b.host, "managoat.runners.call.a", nats.Header{"Managoat-Runner": {id}, "Managoat-Account": {"local"},
		"Managoat-Data-At": {fmt.Sprint(len(bare))}}, append(bare, `aGk=","path":"/etc/evil`...))
	if err != nil || ans.Header.Get("Managoat-Code") != "invalid" {
		t.Fatalf("a relayed call with data that is not base64: %v %+v", err, ans)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB: travels beside the JSON
	if err := p.WriteFile(ctx, h, "/big", big, sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := p.ReadFile(ctx, h, "/big")
	if err != nil || !bytes.Equal(got, big) {
		t.Fatalf("the file read back across replicas: %d bytes, %v", len(got), err)
	}
}
