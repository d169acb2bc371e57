package natshost_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/sandbox"
)

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startCluster runs three NATS nodes with JetStream in this process,
// routed to each other, and returns them once JetStream answers.
func startCluster(t *testing.T) []*server.Server {
	t.Helper()
	ports := []int{freePort(t), freePort(t), freePort(t)}
	var nodes []*server.Server
	for i := range 3 {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		opts := &server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoLog: true, NoSigs: true, Cluster: server.ClusterOpts{Name: "managoat", Host: "127.0.0.1", Port: ports[i]}, Routes: server.RoutesFromStr(strings.Join(routes, ","))}
		ns, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		nodes = append(nodes, ns)
	}
	for _, ns := range nodes {
		if !ns.ReadyForConnections(10 * time.Second) {
			t.Fatal("a NATS node did not start")
		}
	}
	return nodes
}

// replicaOn is a replica connected to the nodes in the order given (so
// to the first while it lives), keeping presence on all three nodes.
func replicaOn(t *testing.T, name string, nodes ...*server.Server) *replica {
	t.Helper()
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.ClientURL())
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	var h *natshost.Host
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h, err = natshost.New(ctx, natshost.Config{Conn: nc, Replica: name, TTL: 5 * time.Second, KeepAlive: 100 * time.Millisecond,
			BucketReplicas: 3, Logger: quiet, ClusterKey: clusterKey})
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica %s: %v", name, err) // the cluster's JetStream never became ready
		}
		time.Sleep(200 * time.Millisecond)
	}
	return wrapReplica(t, nc, h)
}

// TestNATSNodeDiesMidStream is issue 19's chaos case: a session streams
// from a runner on replica a to a caller on replica b while the NATS node
// replica a is connected to dies. Whatever was lost in flight, the caller
// never gets a silent hole: its stream goes on whole, or ends with
// runner_disconnected and the session, attached again, is replayed from
// byte zero; either way every byte arrives exactly once, in order.
func TestNATSNodeDiesMidStream(t *testing.T) {
	nodes := startCluster(t)
	a := replicaOn(t, "a", nodes[0], nodes[1], nodes[2])
	b := replicaOn(t, "b", nodes[1], nodes[2], nodes[0])
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{CallTimeout: 10 * time.Second})
	ctx := context.Background()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var script []string
	var want strings.Builder
	for i := range 60 {
		line := fmt.Sprintf("line %02d|", i)
		script = append(script, "out:"+line, "sleep:40ms")
		want.WriteString(line)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd(append(script, "exit:0")...), sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	sid := cmd.SessionID
	killed := time.AfterFunc(time.Second, func() { nodes[0].Shutdown() })
	defer killed.Stop()

	var got strings.Builder
	ended := false
	for !ended {
		select {
		case ev := <-cmd.Events():
			switch ev.Kind {
			case sandbox.Stdout:
				got.Write(ev.Data)
			case sandbox.Exit:
				ended = true
			case sandbox.Error:
				// Lost in flight: attach again (from b, once a is back on
				// another node) and take the replay from byte zero.
				t.Logf("stream ended after %d bytes: %v; attaching again", got.Len(), ev.Err)
				got.Reset()
				deadline := time.Now().Add(30 * time.Second)
				for {
					cmd, err = p.Attach(ctx, h, sid, sandbox.AttachOptions{})
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("attach again: %v", err)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("the stream hung after %d bytes", got.Len())
		}
	}
	if got.String() != want.String() {
		t.Fatalf("got %q\nwant %q", got.String(), want.String())
	}
}

// TestGapEndsTheStream: a relayed message that does not follow the last
// one (one lost in flight) ends the caller's stream with
// runner_disconnected instead of leaving a hole in its output.
func TestGapEndsTheStream(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	ctx := context.Background()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd("out:ready", "stay"), sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := <-cmd.Events(); string(ev.Data) != "ready" {
		t.Fatalf("first event %+v", ev)
	}
	inboxes := natshost.RemoteInboxes(b.host)
	if len(inboxes) != 1 {
		t.Fatalf("%d relayed streams on b, want 1", len(inboxes))
	}
	// As replica a would send it (sealed), but out of order.
	m := &nats.Msg{Subject: inboxes[0], Data: natshost.Seal(a.host, "answer", inboxes[0], "", nats.Header{"Managoat-Out": {"stdout"}, "Managoat-Seq": {"7"}}, []byte("x"))}
	if err := a.nc.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	select {
	case ev := <-cmd.Events():
		var u *sandbox.UnavailableError
		if ev.Kind != sandbox.Error || !errors.As(ev.Err, &u) || u.Reason != prov.ReasonDisconnected {
			t.Fatalf("after a gap: %+v, want runner_disconnected", ev)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a gap went unnoticed")
	}
}

// TestReplicaAndNATSNodeDieMidStream is issue 19's chaos case in full:
// four sessions stream from a runner whose socket replica a holds to a
// caller on replica b when replica a crashes and, at the same moment, the
// NATS node it is connected to dies. Every relayed stream ends (a's
// frames stop) with runner_disconnected; the runner reconnects through
// the balancer to replica c, which takes a's claim over; each session,
// attached again from b, is replayed from byte zero; and every session's
// bytes arrive exactly once, in order.
func TestReplicaAndNATSNodeDieMidStream(t *testing.T) {
	nodes := startCluster(t)
	a := replicaOn(t, "a", nodes[0], nodes[1], nodes[2])
	b := replicaOn(t, "b", nodes[1], nodes[2], nodes[0])
	c := replicaOn(t, "c", nodes[2], nodes[1], nodes[0])
	lb := newBalancer(t, a)
	startDaemon(t, lb.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	if a.host.Whereis(id) == nil {
		t.Fatal("the runner is not on replica a")
	}
	p := prov.NewProvider(b.host, prov.ProviderOptions{CallTimeout: 10 * time.Second})
	ctx := context.Background()
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const sessions, lines = 4, 60
	type result struct {
		i, reattached int
		got, want     string
		err           error
	}
	results := make(chan result, sessions)
	streaming := make(chan struct{}, sessions)
	for i := range sessions {
		var script []string
		var want strings.Builder
		for j := range lines {
			line := fmt.Sprintf("s%d line %02d|", i, j)
			script = append(script, "out:"+line, "sleep:40ms")
			want.WriteString(line)
		}
		cmd, err := p.Spawn(ctx, h, fakeCmd(append(script, "exit:0")...), sandbox.SpawnOptions{Detachable: true})
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			got, n, err := readExactlyOnce(p, h, cmd, streaming)
			results <- result{i: i, reattached: n, got: got, want: want.String(), err: err}
		}()
	}
	// Mid-stream (each session has output, and runs 2.4 s): replica a
	// and NATS node n1 die together; new connections go to replica c.
	for range sessions {
		select {
		case <-streaming:
		case <-time.After(10 * time.Second):
			t.Fatal("the sessions did not start streaming")
		}
	}
	lb.target.Store(c)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a.crash() }()
	go func() { defer wg.Done(); nodes[0].Shutdown() }()
	wg.Wait()

	for range sessions {
		r := <-results
		switch {
		case r.err != nil:
			t.Errorf("session %d: %v", r.i, r.err)
		case r.got != r.want:
			t.Errorf("session %d: got %q\nwant %q", r.i, r.got, r.want)
		case r.reattached == 0:
			t.Errorf("session %d was not cut by the crash of the replica relaying it", r.i)
		default:
			t.Logf("session %d: %d bytes exactly once, after %d reattach(es)", r.i, len(r.got), r.reattached)
		}
	}
	if c.host.Whereis(id) == nil {
		t.Fatal("the runner is not on replica c after a's crash")
	}
}

// readExactlyOnce reads cmd to its exit. A stream that ends with an
// error is attached again (retried up to 30 s while the runner
// reconnects) and read from the replay's byte zero: what it returns is
// the session's output as the last attach delivered it, whole. Its first
// output is told on streaming.
func readExactlyOnce(p *prov.Provider, h *sandbox.Handle, cmd *sandbox.Command, streaming chan<- struct{}) (string, int, error) {
	ctx := context.Background()
	sid := cmd.SessionID
	var got strings.Builder
	reattached := 0
	for {
		select {
		case ev := <-cmd.Events():
			switch ev.Kind {
			case sandbox.Stdout:
				if streaming != nil {
					streaming <- struct{}{}
					streaming = nil
				}
				got.Write(ev.Data)
			case sandbox.Exit:
				return got.String(), reattached, nil
			case sandbox.Error:
				var u *sandbox.UnavailableError
				if !errors.As(ev.Err, &u) {
					return got.String(), reattached, fmt.Errorf("stream ended with %v, not unavailable", ev.Err)
				}
				got.Reset()
				reattached++
				deadline := time.Now().Add(30 * time.Second)
				for {
					var err error
					cmd, err = p.Attach(ctx, h, sid, sandbox.AttachOptions{})
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						return "", reattached, fmt.Errorf("attach again: %w", err)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		case <-time.After(30 * time.Second):
			return got.String(), reattached, fmt.Errorf("the stream hung after %d bytes", got.Len())
		}
	}
}
