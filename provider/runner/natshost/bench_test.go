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
	"github.com/nats-io/nats.go"

	"github.com/managoat/managoat/provider/local"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// pair is two replicas with a runner (provider/fake) on a, and a sandbox
// on it; same calls it through a, across through b.
func pair(b *testing.B) (same, across *prov.Provider, h *sandbox.Handle) {
	return pairOn(b, newFake(b))
}

func pairOn(b *testing.B, p sandbox.Provider) (same, across *prov.Provider, h *sandbox.Handle) {
	ns := startNATS(b)
	ra, rb := newReplica(b, ns, "a"), newReplica(b, ns, "b")
	startDaemon(b, ra.ts.URL, "laptop", p)
	id := onlineID(b, rb.host)
	same = prov.NewProvider(ra.host, prov.ProviderOptions{})
	across = prov.NewProvider(rb.host, prov.ProviderOptions{})
	h, err := same.Create(context.Background(), namer(b, id)(), sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return same, across, h
}

// BenchmarkExecAcrossReplicas: exec on a runner connected to another
// replica against the same call on the replica holding its socket, in one
// run (issue 19: at most 1.5×).
//
//	go test -run '^$' -bench ExecAcrossReplicas ./provider/runner/natshost/
func BenchmarkExecAcrossReplicas(b *testing.B) {
	same, across, h := pair(b)
	ctx := context.Background()
	cmd := fakeCmd("out:x")
	var per [2]float64
	var took [2]time.Duration
	for n := 0; n < b.N; n++ {
		for i, p := range []*prov.Provider{same, across} { // interleaved: the machine's noise falls on both
			start := time.Now()
			if _, err := p.Exec(ctx, h, cmd, sandbox.ExecOptions{}); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	for i := range per {
		per[i] = float64(took[i].Nanoseconds()) / float64(b.N)
	}
	b.ReportMetric(per[0], "ns/exec-same")
	b.ReportMetric(per[1], "ns/exec-across")
	b.ReportMetric(per[1]/per[0], "across/same")
}

// trustedLocal is a runner's provider/local on the trusted mechanism (no
// root needed).
func trustedLocal(b *testing.B) *local.Provider {
	dir := b.TempDir()
	m, err := openTrusted("trusted", dir)
	if err != nil {
		b.Fatal(err)
	}
	lp, err := local.New(local.Config{StateDir: dir, Mechanism: m})
	if err != nil {
		b.Fatal(err)
	}
	return lp
}

// BenchmarkExecTrueAcrossReplicas is issue 19's figure as it asks it:
// exec of `true` on a runner (provider/local, trusted mechanism) connected
// to another replica, against the same call on the replica holding the
// socket, interleaved in one run (target at most 1.5×).
//
//	go test -run '^$' -bench ExecTrueAcrossReplicas ./provider/runner/natshost/
func BenchmarkExecTrueAcrossReplicas(b *testing.B) {
	same, across, h := pairOn(b, trustedLocal(b))
	defer func() { _ = same.Destroy(context.Background(), h) }()
	ctx := context.Background()
	var took [2]time.Duration
	for n := 0; n < b.N; n++ {
		for i, p := range []*prov.Provider{same, across} {
			start := time.Now()
			if _, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(b.N), "ns/exec-same")
	b.ReportMetric(float64(took[1].Nanoseconds())/float64(b.N), "ns/exec-across")
	b.ReportMetric(float64(took[1])/float64(took[0]), "across/same")
}

// BenchmarkOutputAcrossReplicas: a session's output relayed from another
// replica against the same session read on the replica holding the
// socket, interleaved in one run (issue 19: at least 50%). The session is
// a real process on the runner (provider/local, trusted mechanism)
// writing 8 MiB; with provider/fake the output travelled in the spawn's
// own request too (its script), which measured the request's relay as
// much as the output's.
//
//	go test -run '^$' -bench OutputAcrossReplicas ./provider/runner/natshost/
func BenchmarkOutputAcrossReplicas(b *testing.B) {
	same, across, h := pairOn(b, trustedLocal(b))
	defer func() { _ = same.Destroy(context.Background(), h) }()
	ctx := context.Background()
	const total = 8 << 20
	cmd := sandbox.Cmd{Name: "head", Args: []string{"-c", fmt.Sprint(total), "/dev/zero"}}
	var took [2]time.Duration
	for n := 0; n < b.N; n++ {
		for i, p := range []*prov.Provider{same, across} { // interleaved
			start := time.Now()
			c, err := p.Spawn(ctx, h, cmd, sandbox.SpawnOptions{})
			if err != nil {
				b.Fatal(err)
			}
			got := 0
			for ev := range c.Events() {
				got += len(ev.Data)
				if ev.Terminal() {
					if ev.Kind != sandbox.Exit || ev.Code != 0 {
						b.Fatalf("the session ended with %+v", ev)
					}
					break
				}
			}
			_ = c.Stop()
			if got != total {
				b.Fatalf("got %d bytes, want %d", got, total)
			}
			took[i] += time.Since(start)
		}
	}
	var mbps [2]float64
	for i := range mbps {
		mbps[i] = float64(total*b.N) / took[i].Seconds() / (1 << 20)
	}
	b.ReportMetric(mbps[0], "MiB/s-same")
	b.ReportMetric(mbps[1], "MiB/s-across")
	b.ReportMetric(100*mbps[1]/mbps[0], "pct-same")
}

// BenchmarkScriptOutputAcrossReplicas is BenchmarkOutputAcrossReplicas
// on provider/fake, whose 3.75 MiB of output is the spawn's own script:
// the request carries it too, and a relayed request is decoded and encoded
// again by the replica holding the socket, so this measures that as much
// as the output (45-63% of the same replica on this 2-core machine, under
// load; the output alone is 64-86%).
//
//	go test -run '^$' -bench ScriptOutputAcrossReplicas ./provider/runner/natshost/
func BenchmarkScriptOutputAcrossReplicas(b *testing.B) {
	same, across, h := pair(b)
	ctx := context.Background()
	chunk := strings.Repeat("x", 60<<10)
	args := make([]string, 0, 64)
	for range 64 {
		args = append(args, "out:"+chunk)
	}
	total := 64 * len(chunk)
	var mbps [2]float64
	var took [2]time.Duration
	for n := 0; n < b.N; n++ {
		for i, p := range []*prov.Provider{same, across} { // interleaved
			start := time.Now()
			c, err := p.Spawn(ctx, h, fakeCmd(append(args, "exit:0")...), sandbox.SpawnOptions{})
			if err != nil {
				b.Fatal(err)
			}
			got := 0
			for ev := range c.Events() {
				got += len(ev.Data)
				if ev.Terminal() {
					break
				}
			}
			_ = c.Stop()
			if got != total {
				b.Fatalf("got %d bytes, want %d", got, total)
			}
			took[i] += time.Since(start)
		}
	}
	for i := range mbps {
		mbps[i] = float64(total*b.N) / took[i].Seconds() / (1 << 20)
	}
	b.ReportMetric(mbps[0], "MiB/s-same")
	b.ReportMetric(mbps[1], "MiB/s-across")
	b.ReportMetric(100*mbps[1]/mbps[0], "pct-same")
}

// BenchmarkWriteFileAcrossReplicas: a 16 MiB file written on a runner
// (provider/fake) connected to another replica, against the same write
// through the replica holding its socket, interleaved in one run. The
// request travels in parts (max_payload), its data beside its JSON
// (hdrDataAt): 97-98% of the same replica here (53-58% when the holder
// decoded the data from JSON and encoded it again).
//
//	go test -run '^$' -bench WriteFileAcrossReplicas ./provider/runner/natshost/
func BenchmarkWriteFileAcrossReplicas(b *testing.B) {
	same, across, h := pair(b)
	ctx := context.Background()
	data := bytes.Repeat([]byte("0123456789abcdef"), 1<<20)
	var took [2]time.Duration
	for n := 0; n < b.N; n++ {
		for i, p := range []*prov.Provider{same, across} {
			start := time.Now()
			if err := p.WriteFile(ctx, h, "/f", data, sandbox.WriteFileOptions{}); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(start)
		}
	}
	var mbps [2]float64
	for i := range mbps {
		mbps[i] = float64(len(data)*b.N) / took[i].Seconds() / (1 << 20)
	}
	b.ReportMetric(mbps[0], "MiB/s-same")
	b.ReportMetric(mbps[1], "MiB/s-across")
	b.ReportMetric(100*mbps[1]/mbps[0], "pct-same")
}

// BenchmarkOnlineThousandRunners: 1,000 runners connected (real
// WebSocket handshakes, each registered cluster-wide) across three
// replicas, with the default heartbeat (20 s) and TTL; the time of one
// Online() on a replica (issue 19: under 50 ms).
//
//	go test -run '^$' -bench OnlineThousandRunners ./provider/runner/natshost/
func BenchmarkOnlineThousandRunners(b *testing.B) {
	ns := startNATS(b)
	var reps []*replica
	for _, name := range []string{"a", "b", "c"} {
		nc, err := nats.Connect(ns.ClientURL(), nats.Name(name))
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		h, err := natshost.New(ctx, natshost.Config{Conn: nc, Replica: name, Logger: quiet, ClusterKey: clusterKey})
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		reps = append(reps, wrapReplicaHB(b, nc, h, 20*time.Second))
	}
	const n = 1000
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r := reps[i%3]
			u := strings.Replace(r.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {fmt.Sprintf("r%d", i)}}.Encode()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
			if err != nil {
				errs <- err
				return
			}
			b.Cleanup(func() { _ = ws.CloseNow() })
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("a runner's connection: %v", err)
	}
	waitFor(b, "1000 runners online on c", 30*time.Second, func() bool { return len(reps[2].host.Online()) == n })
	b.ResetTimer()
	for range b.N {
		if got := len(reps[2].host.Online()); got != n {
			b.Fatalf("%d online", got)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/1000, "ms/online")
}

// TestMalformedMessages: messages on a replica's subjects that are not
// what a replica sends are dropped (a call is answered invalid), logged
// once, and the replica goes on serving.
func TestMalformedMessages(t *testing.T) {
	ns := startNATS(t)
	var logBuf syncBuf
	a := newReplicaLog(t, ns, "a", slog.New(slog.NewTextHandler(&logBuf, nil)))
	b := newReplica(t, ns, "b")
	startDaemon(t, a.ts.URL, "laptop", newFake(t))
	id := onlineID(t, b.host)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	for range 3 {
		// Not a replica's (not sealed): dropped unanswered.
		m, err := nc.Request("managoat.runners.call.a", []byte("not json"), 200*time.Millisecond)
		if !errors.Is(err, nats.ErrTimeout) {
			t.Fatalf("a malformed call: %v %+v, want no answer", err, m)
		}
		// A replica's call that is not a request: answered invalid.
		ans, err := sealedCall(t, nc, a.host, "managoat.runners.call.a", nats.Header{"Managoat-Runner": {id}}, []byte("not json"))
		if err != nil || ans.Header.Get("Managoat-Code") != "invalid" {
			t.Fatalf("a sealed malformed call: %v %+v", err, ans)
		}
		_ = nc.Publish("managoat.runners.delete", []byte{0xff, 0})
		_ = nc.Publish("managoat.runners.unsub.a", []byte("{"))
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	p := prov.NewProvider(b.host, prov.ProviderOptions{})
	h, err := p.Create(context.Background(), namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("the replica stopped serving: %v", err)
	}
	if res, err := p.Exec(context.Background(), h, fakeCmd("out:fine"), sandbox.ExecOptions{}); err != nil || string(res.Output) != "fine" {
		t.Fatalf("exec after the garbage: %q %v", res.Output, err)
	}
	if n := strings.Count(logBuf.String(), "malformed message dropped"); n != 1 {
		t.Fatalf("logged %d times, want once:\n%s", n, logBuf.String())
	}
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
