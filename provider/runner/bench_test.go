package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// blaster is the fake with a Spawn that streams total bytes of stdout in
// wire.MaxChunk pieces as fast as the consumer takes them.
type blaster struct {
	*fake.Provider
	total int
	seq   int
	mu    sync.Mutex
}

func (b *blaster) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.SpawnOptions) (*sandbox.Command, error) {
	if c.Name != "blast" {
		return b.Provider.Spawn(ctx, h, c, o)
	}
	cmd, s := sandbox.NewCommand(b, "", nil)
	b.mu.Lock()
	b.seq++
	cmd.SessionID = fmt.Sprintf("blast-%d", b.seq)
	b.mu.Unlock()
	chunk := bytes.Repeat([]byte("x"), wire.MaxChunk)
	go func() {
		for n := 0; n < b.total; n += len(chunk) {
			s.Stdout(chunk[:min(len(chunk), b.total-n)])
		}
		s.Exit(0)
	}()
	return cmd, nil
}

func (b *blaster) StopCommand(c *sandbox.Command) error {
	if strings.HasPrefix(c.SessionID, "blast-") {
		return nil
	}
	return b.Provider.StopCommand(c)
}

// wired is a platform with one daemon serving p; it returns the platform's
// provider and a fresh handle on the runner.
func wired(b testing.TB, p sandbox.Provider) (*prov.Provider, *sandbox.Handle) {
	pl := newPlatform(b, prov.ServerConfig{})
	startDaemon(b, pl.ts.URL, p, nil)
	id := pl.online(b)
	rp := pl.srv.Provider()
	h, err := rp.Create(context.Background(), namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return rp, h
}

// benchExecRatio times exec of c on p directly and through the wire, in
// the same run, and reports the ratio.
func benchExecRatio(b *testing.B, p sandbox.Provider, c sandbox.Cmd) {
	ctx := context.Background()
	rp, h := wired(b, p)
	hd, err := p.Create(ctx, h.Name, sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	one := func(p sandbox.Provider, h *sandbox.Handle) time.Duration {
		start := time.Now()
		res, err := p.Exec(ctx, h, c, sandbox.ExecOptions{})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", res, err)
		}
		return time.Since(start)
	}
	one(p, hd) // warm both paths
	one(rp, h)
	// Alternate the two so a load swing on a shared box hits both alike.
	var direct, viaWire time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		direct += one(p, hd)
		viaWire += one(rp, h)
	}
	b.StopTimer()
	b.ReportMetric(float64(viaWire.Nanoseconds())/float64(b.N), "wire-ns/op")
	b.ReportMetric(float64(direct.Nanoseconds())/float64(b.N), "direct-ns/op")
	b.ReportMetric(float64(viaWire)/float64(direct), "x-direct")
}

// BenchmarkExecFake is exec through the wire against provider/fake called
// directly: the fake answers in microseconds, so this ratio is the wire's
// whole cost, not the target's (the target is against provider/local; see
// BenchmarkExecLocal).
func BenchmarkExecFake(b *testing.B) {
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	benchExecRatio(b, f, fakeCmd("exit:0"))
}

// BenchmarkStdoutStreaming streams stdout through the socket and reports its
// throughput as a percentage of a raw loopback TCP copy of the same bytes.
func BenchmarkStdoutStreaming(b *testing.B) {
	const total = 64 << 20
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	bl := &blaster{Provider: f, total: total}
	rp, h := wired(b, bl)
	ctx := context.Background()
	stream := func() time.Duration {
		start := time.Now()
		c, err := rp.Spawn(ctx, h, sandbox.Cmd{Name: "blast"}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ev := range c.Events() {
			switch ev.Kind {
			case sandbox.Stdout:
				n += len(ev.Data)
			case sandbox.Error:
				b.Fatal(ev.Err)
			}
		}
		if n != total {
			b.Fatalf("got %d bytes, want %d", n, total)
		}
		return time.Since(start)
	}
	tcp := func() time.Duration {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		done := make(chan int64)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- 0
				return
			}
			n, _ := io.Copy(io.Discard, c)
			c.Close()
			done <- n
		}()
		start := time.Now()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		chunk := bytes.Repeat([]byte("x"), wire.MaxChunk)
		for n := 0; n < total; n += len(chunk) {
			if _, err := c.Write(chunk); err != nil {
				b.Fatal(err)
			}
		}
		c.Close()
		if <-done != total {
			b.Fatal("tcp copy short")
		}
		return time.Since(start)
	}
	// The ceiling the library sets: the same payload as bare coder/websocket
	// text frames of the size our frames have (base64 of 32 KiB plus JSON),
	// client to server, with no encoding at all.
	bare := func() time.Duration {
		done := make(chan int, 1)
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ws, err := websocket.Accept(w, r, nil)
			if err != nil {
				done <- 0
				return
			}
			ws.SetReadLimit(wire.ReadLimit)
			var buf bytes.Buffer
			n := 0
			for n < total {
				_, rd, err := ws.Reader(context.Background())
				if err != nil {
					break
				}
				buf.Reset()
				m, _ := buf.ReadFrom(rd)
				n += int(m) * 3 / 4
			}
			_ = ws.CloseNow()
			done <- n
		}))
		defer ts.Close()
		start := time.Now()
		ws, _, err := websocket.Dial(context.Background(), strings.Replace(ts.URL, "http", "ws", 1), nil)
		if err != nil {
			b.Fatal(err)
		}
		msg := bytes.Repeat([]byte("x"), base64.StdEncoding.EncodedLen(wire.MaxChunk))
		for n := 0; n < total; n += wire.MaxChunk {
			if err := ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
				b.Fatal(err)
			}
		}
		<-done
		d := time.Since(start)
		_ = ws.CloseNow()
		return d
	}
	stream()
	tcp()
	bare()
	b.ResetTimer()
	var ws, raw, bws time.Duration
	for i := 0; i < b.N; i++ {
		ws += stream()
		raw += tcp()
		bws += bare()
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mbps(ws), "wire-MiB/s")
	b.ReportMetric(mbps(raw), "tcp-MiB/s")
	b.ReportMetric(mbps(bws), "bare-ws-MiB/s")
	b.ReportMetric(100*float64(raw)/float64(ws), "pct-of-tcp")
	b.ReportMetric(100*float64(bws)/float64(ws), "pct-of-bare-ws")
	b.SetBytes(total)
}

// thousandSessions spawns n sessions on one connection at once, each
// printing its own payload, and checks every byte and exit arrives.
func thousandSessions(tb testing.TB, rp *prov.Provider, h *sandbox.Handle, n int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			want := fmt.Sprintf("session-%d-%s", i, strings.Repeat("y", 100))
			c, err := rp.Spawn(ctx, h, fakeCmd("out:"+want, "exit:0"), sandbox.SpawnOptions{})
			if err != nil {
				errs <- err
				return
			}
			var out bytes.Buffer
			exits := 0
			timer := time.NewTimer(60 * time.Second)
			defer timer.Stop()
			for {
				select {
				case ev, ok := <-c.Events():
					if !ok {
						if out.String() != want || exits != 1 {
							errs <- fmt.Errorf("session %d: %q, %d exits", i, out.String(), exits)
						}
						return
					}
					switch ev.Kind {
					case sandbox.Stdout:
						out.Write(ev.Data)
					case sandbox.Exit:
						exits++
					case sandbox.Error:
						errs <- ev.Err
					}
				case <-timer.C:
					errs <- fmt.Errorf("session %d: no exit", i)
					_ = c.Stop()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Error(err)
	}
}

// TestThousandConcurrentSessions: 1,000 sessions on one connection, no
// byte or exit lost.
func TestThousandConcurrentSessions(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	rp, h := wired(t, f)
	thousandSessions(t, rp, h, 1000)
}

func BenchmarkThousandConcurrentSessions(b *testing.B) {
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	rp, h := wired(b, f)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		thousandSessions(b, rp, h, 1000)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/session")
}

// BenchmarkIdleConnMemory opens idle runner connections (minimal raw
// clients: a TCP socket and a hand-written upgrade) and reports the
// platform's heap and stack growth per connection. The clients' own
// sockets are counted too, so the figure is an upper bound.
func BenchmarkIdleConnMemory(b *testing.B) {
	const n = 500
	pl := newPlatform(b, prov.ServerConfig{})
	addr := strings.TrimPrefix(pl.ts.URL, "http://")
	measure := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse + ms.StackInuse
	}
	for i := 0; i < b.N; i++ {
		before := measure()
		conns := make([]net.Conn, 0, n)
		for j := 0; j < n; j++ {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(c, "GET %s?name=idle-%d-%d HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
				"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", wire.Path, i, j, token)
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				b.Fatalf("upgrade: %v %v", resp, err)
			}
			conns = append(conns, c)
		}
		waitFor(b, "all online", 30*time.Second, func() bool { return len(pl.host.Online()) == n })
		after := measure()
		b.ReportMetric(float64(after-before)/n, "B/conn")
		for _, c := range conns {
			c.Close()
		}
		waitFor(b, "all offline", 30*time.Second, func() bool { return len(pl.host.Online()) == 0 })
	}
}

// BenchmarkExecLocal is the target: exec of `true` through the
// platform, the wire and the daemon, against provider/local (on trusted)
// called directly, in the same run.
func BenchmarkExecLocal(b *testing.B) {
	p := newLocal(b, "trusted", b.TempDir())
	benchExecRatio(b, p, sandbox.Cmd{Name: "true"})
}
