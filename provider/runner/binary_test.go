package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// randBlaster is the fake with a Spawn of "rand" that streams total bytes
// of seeded random output, stdout and stderr mixed, in pieces of varying
// sizes (some over wire.MaxChunk, which the daemon splits).
type randBlaster struct {
	*fake.Provider
	total int
	mu    sync.Mutex
	seq   int

	once       sync.Once // the payload, made once (not timed)
	pOut, pErr []byte
	pPieces    []int
}

// randPayload is the output of randBlaster: per stream, in order.
func randPayload(total int) (stdout, stderr []byte, pieces []int) {
	r := rand.New(rand.NewPCG(31, uint64(total)))
	buf := make([]byte, total)
	for i := 0; i+8 <= total; i += 8 {
		binary.LittleEndian.PutUint64(buf[i:], r.Uint64())
	}
	for n := 0; n < total; {
		k := min(1+r.IntN(3*wire.MaxChunk), total-n)
		pieces = append(pieces, k)
		if len(pieces)%5 == 0 {
			stderr = append(stderr, buf[n:n+k]...)
		} else {
			stdout = append(stdout, buf[n:n+k]...)
		}
		n += k
	}
	return
}

func (b *randBlaster) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, o sandbox.SpawnOptions) (*sandbox.Command, error) {
	if c.Name != "rand" {
		return b.Provider.Spawn(ctx, h, c, o)
	}
	cmd, s := sandbox.NewCommand(b, "", nil)
	b.mu.Lock()
	b.seq++
	cmd.SessionID = fmt.Sprintf("rand-%d", b.seq)
	b.mu.Unlock()
	b.once.Do(func() { b.pOut, b.pErr, b.pPieces = randPayload(b.total) })
	out, errs, pieces := b.pOut, b.pErr, b.pPieces
	go func() {
		for i, k := range pieces {
			if (i+1)%5 == 0 {
				s.Stderr(errs[:k])
				errs = errs[k:]
			} else {
				s.Stdout(out[:k])
				out = out[k:]
			}
		}
		s.Exit(0)
	}()
	return cmd, nil
}

func (b *randBlaster) StopCommand(c *sandbox.Command) error {
	if strings.HasPrefix(c.SessionID, "rand-") {
		return nil
	}
	return b.Provider.StopCommand(c)
}

// TestBinaryStreamsEveryByte: a platform and a daemon over a real
// WebSocket, each with and without binary stream frames (the mixed pairs
// are Fountain's daemon against this platform and this daemon against
// Fountain's platform): the runner reports binary_stream only when both
// take it, and a 24 MiB random stream, stdout and stderr, arrives whole,
// in order (SHA-256 of each), then its exit.
func TestBinaryStreamsEveryByte(t *testing.T) {
	const total = 24 << 20
	wantOut, wantErr, _ := randPayload(total)
	for _, tc := range []struct {
		name                 string
		platformText, daemon bool // TextStreamsOnly of each end
	}{
		{"binary both", false, false},
		{"text daemon", false, true},
		{"text platform", true, false},
		{"text both", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := fake.New()
			t.Cleanup(func() { _ = f.Close() })
			pl := newPlatform(t, prov.ServerConfig{TextStreamsOnly: tc.platformText})
			startDaemon(t, pl.ts.URL, &randBlaster{Provider: f, total: total}, func(c *runner.Config) { c.TextStreamsOnly = tc.daemon })
			id := pl.online(t)
			info := pl.host.Online()[0]
			if want := !tc.platformText && !tc.daemon; info.HasCap(wire.CapBinaryStream) != want {
				t.Fatalf("runner caps %v: binary_stream should be there: %v", info.Caps, want)
			}
			rp := pl.srv.Provider()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			h, err := rp.Create(ctx, namer(id)(), sandbox.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			c, err := rp.Spawn(ctx, h, sandbox.Cmd{Name: "rand"}, sandbox.SpawnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ho, he := sha256.New(), sha256.New()
			no, ne, exits := 0, 0, 0
			for ev := range c.Events() {
				switch ev.Kind {
				case sandbox.Stdout:
					ho.Write(ev.Data)
					no += len(ev.Data)
				case sandbox.Stderr:
					he.Write(ev.Data)
					ne += len(ev.Data)
				case sandbox.Exit:
					exits++
					if ev.Code != 0 {
						t.Errorf("exit %d", ev.Code)
					}
				case sandbox.Error:
					t.Fatal(ev.Err)
				}
			}
			so, se := sha256.Sum256(wantOut), sha256.Sum256(wantErr)
			if no != len(wantOut) || ne != len(wantErr) || !bytes.Equal(ho.Sum(nil), so[:]) || !bytes.Equal(he.Sum(nil), se[:]) || exits != 1 {
				t.Fatalf("stdout %d bytes (want %d), stderr %d (want %d), hashes equal %v %v, %d exits",
					no, len(wantOut), ne, len(wantErr), bytes.Equal(ho.Sum(nil), so[:]), bytes.Equal(he.Sum(nil), se[:]), exits)
			}
		})
	}
}

// dialCaps is dialRaw with the handshake's caps.
func dialCaps(t testing.TB, pl *platform, name, caps string) (*rawDaemon, *http.Response) {
	t.Helper()
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}, wire.ParamCaps: {caps}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	ws.SetReadLimit(wire.ReadLimit)
	t.Cleanup(func() { _ = ws.CloseNow() })
	return &rawDaemon{t: t, ws: ws}, resp
}

func binFrame(kind byte, sid string, replayFor uint64, data []byte) []byte {
	b := []byte{kind, byte(len(sid))}
	b = binary.BigEndian.AppendUint64(b, replayFor)
	b = append(b, sid...)
	return append(b, data...)
}

// TestHostileBinaryFrames: a daemon's binary frames are taken only when
// negotiated (else 1003, as Fountain's platform), a well-formed one
// delivers its bytes, and a malformed or oversized one closes the socket
// with 1007 or 1009; the session's Command then ends with
// unavailable runner_disconnected, never with an exit or made-up output.
func TestHostileBinaryFrames(t *testing.T) {
	good := binFrame(wire.BinaryStdout, "s-1", 0, []byte("hello"))
	for _, tc := range []struct {
		name  string
		caps  string
		frame []byte
		code  websocket.StatusCode
	}{
		{"not negotiated", "", good, websocket.StatusUnsupportedData},
		{"short", wire.CapBinaryStream, []byte{1, 3, 0}, wire.CloseBadFrame},
		{"unknown kind", wire.CapBinaryStream, binFrame(3, "s-1", 0, []byte("x")), wire.CloseBadFrame},
		{"id length past the end", wire.CapBinaryStream, func() []byte { b := binFrame(1, "s-1", 0, []byte("xy")); b[1] = 200; return b }(), wire.CloseBadFrame},
		{"empty id", wire.CapBinaryStream, binFrame(1, "", 0, []byte("x")), wire.CloseBadFrame},
		{"control byte in id", wire.CapBinaryStream, binFrame(1, "s\n1", 0, []byte("x")), wire.CloseBadFrame},
		{"no data", wire.CapBinaryStream, binFrame(1, "s-1", 0, nil), wire.CloseBadFrame},
		{"negative replay_for", wire.CapBinaryStream, binFrame(1, "s-1", 1<<63, []byte("x")), wire.CloseBadFrame},
		{"chunk over MaxChunk", wire.CapBinaryStream, binFrame(1, "s-1", 0, make([]byte, wire.MaxChunk+1)), wire.CloseBadFrame},
		{"huge", wire.CapBinaryStream, binFrame(1, "s-1", 0, make([]byte, 8<<20)), wire.CloseTooBig},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pl := newPlatform(t, prov.ServerConfig{})
			rd, resp := dialCaps(t, pl, "hostile", tc.caps)
			if got := resp.Header.Get(wire.HeaderAccept); (got == wire.CapBinaryStream) != (tc.caps != "") {
				t.Fatalf("upgrade's %s: %q for caps %q", wire.HeaderAccept, got, tc.caps)
			}
			id := pl.online(t)
			_, h := rawName(t, id)
			p := pl.srv.Provider()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			spawned := make(chan *sandbox.Command, 1)
			go func() {
				c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh"}, sandbox.SpawnOptions{})
				if err != nil {
					t.Error(err)
				}
				spawned <- c
			}()
			sp := rd.next()
			rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-1"}}`, sp.ID))
			c := <-spawned
			if c == nil {
				t.FailNow()
			}
			if tc.caps != "" {
				// A well-formed frame first: delivered.
				if err := rd.ws.Write(ctx, websocket.MessageBinary, good); err != nil {
					t.Fatal(err)
				}
				if ev := recv(t, c, 5*time.Second); ev.Kind != sandbox.Stdout || string(ev.Data) != "hello" {
					t.Fatalf("good binary frame: %+v", ev)
				}
			}
			// The daemon's end reads on, so the platform's close
			// handshake completes at once.
			closed := make(chan error, 1)
			go func() {
				for {
					if _, _, err := rd.ws.Read(ctx); err != nil {
						closed <- err
						return
					}
				}
			}()
			_ = rd.ws.Write(ctx, websocket.MessageBinary, tc.frame)
			ev := recv(t, c, 10*time.Second)
			if ev.Kind != sandbox.Error || !isReason(ev.Err, prov.ReasonDisconnected) {
				t.Fatalf("after the frame: %+v", ev)
			}
			if err := <-closed; websocket.CloseStatus(err) != tc.code {
				t.Fatalf("close %v (%v), want %v", websocket.CloseStatus(err), err, tc.code)
			}
			pl.offline(t)
		})
	}
}

// BenchmarkBinaryVsTextStreams streams 64 MiB of stdout (random bytes)
// through a platform and daemon that negotiated binary stream frames and
// through a pair held to base64 text frames, alternately in the same run,
// and reports each throughput and their ratio (binary-x-text).
func BenchmarkBinaryVsTextStreams(b *testing.B) {
	const total = 64 << 20
	pair := func(text bool) (*prov.Provider, *sandbox.Handle) {
		f := fake.New()
		b.Cleanup(func() { _ = f.Close() })
		pl := newPlatform(b, prov.ServerConfig{TextStreamsOnly: text})
		startDaemon(b, pl.ts.URL, &randBlaster{Provider: f, total: total}, func(c *runner.Config) { c.TextStreamsOnly = text })
		id := pl.online(b)
		if pl.host.Online()[0].HasCap(wire.CapBinaryStream) == text {
			b.Fatalf("binary_stream negotiated: %v", !text)
		}
		rp := pl.srv.Provider()
		h, err := rp.Create(context.Background(), namer(id)(), sandbox.CreateOptions{})
		if err != nil {
			b.Fatal(err)
		}
		return rp, h
	}
	binP, binH := pair(false)
	txtP, txtH := pair(true)
	stream := func(rp *prov.Provider, h *sandbox.Handle) time.Duration {
		start := time.Now()
		c, err := rp.Spawn(context.Background(), h, sandbox.Cmd{Name: "rand"}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ev := range c.Events() {
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
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
	stream(binP, binH) // warm both
	stream(txtP, txtH)
	b.ResetTimer()
	var bin, txt time.Duration
	for i := 0; i < b.N; i++ {
		bin += stream(binP, binH)
		txt += stream(txtP, txtH)
	}
	b.StopTimer()
	mbps := func(d time.Duration) float64 { return float64(total) * float64(b.N) / d.Seconds() / (1 << 20) }
	b.ReportMetric(mbps(bin), "binary-MiB/s")
	b.ReportMetric(mbps(txt), "text-MiB/s")
	b.ReportMetric(float64(txt)/float64(bin), "binary-x-text")
	b.SetBytes(2 * total)
}
