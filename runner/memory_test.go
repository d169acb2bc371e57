package runner_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/trusted"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// openTrusted is the mechanism of the memory benchmark's local provider
// (no root needed); the supervisor re-execution opens it by name.
func openTrusted(name, stateDir string) (mechanism.Mechanism, error) {
	if name != "trusted" {
		return local.OpenMechanism(name, stateDir)
	}
	return trusted.New(filepath.Join(stateDir, "mech", "trusted"))
}

// BenchmarkAttachedSessionMemory is issue 24 item 8's attack: a session
// writes outMB of output while the platform listens, and the daemon's
// peak heap growth is measured, against provider/local (its journal is on
// disk), with the journal bound (bounded) and without it (unbounded: the
// daemon as it was, holding every byte while attached), in one run.
//
//	go test -run '^$' -bench AttachedSessionMemory -benchtime 1x ./runner/
func BenchmarkAttachedSessionMemory(b *testing.B) {
	const outMB = 256
	var peaks [2]float64
	for i, mode := range []string{"bounded", "unbounded"} {
		b.Run(mode, func(b *testing.B) {
			if mode == "unbounded" {
				defer runner.SetMaxJournal(1 << 40)()
			}
			for n := 0; n < b.N; n++ {
				peaks[i] = attachedPeakMB(b, outMB)
			}
			b.ReportMetric(peaks[i], "peak-MB")
		})
	}
	if peaks[0] > 0 {
		b.ReportMetric(peaks[1]/peaks[0], "unbounded/bounded")
	}
}

// attachedPeakMB runs one session of outMB through a daemon serving
// provider/local and returns the daemon process's peak heap growth in MB.
func attachedPeakMB(b *testing.B, outMB int) float64 {
	dir := b.TempDir()
	m, err := openTrusted("trusted", dir)
	if err != nil {
		b.Fatal(err)
	}
	p, err := local.New(local.Config{StateDir: dir, Mechanism: m})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = p.Destroy(context.Background(), sandbox.BuildHandle(local.Name, "sb")) }()

	conns := make(chan *websocket.Conn, 1)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(wire.ReadLimit)
		conns <- ws
	}))
	defer ts.Close()
	d, err := runner.New(runner.Config{URL: ts.URL, Token: "tok", Name: "laptop", Provider: p, Logger: quiet, PingInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	ws := <-conns
	defer ws.CloseNow()

	read := func() frame {
		rctx, rcancel := context.WithTimeout(ctx, time.Minute)
		defer rcancel()
		_, data, err := ws.Read(rctx)
		if err != nil {
			b.Fatal(err)
		}
		var f frame
		if err := json.Unmarshal(data, &f); err != nil {
			b.Fatal(err)
		}
		return f
	}
	send := func(s string) {
		if err := ws.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
			b.Fatal(err)
		}
	}
	send(`{"id":1,"op":"create","name":"sb"}`)
	if f := read(); !f.OK {
		b.Fatalf("create: %+v", f)
	}

	heap := func() uint64 {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}
	runtime.GC()
	base := heap()
	var peak atomic.Uint64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			if h := heap(); h > peak.Load() {
				peak.Store(h)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	send(fmt.Sprintf(`{"id":2,"op":"spawn","name":"sb","cmd":"head","args":["-c","%dM","/dev/zero"]}`, outMB))
	var got int
	var last frame
	for {
		f := read()
		if f.ID != nil {
			if !f.OK {
				b.Fatalf("spawn: %+v", f)
			}
			continue
		}
		got += len(f.Data)
		last = f
		if f.Stream == "exit" || f.Stream == "error" {
			break
		}
	}
	close(stop)
	<-sampled
	if got != outMB<<20 {
		b.Fatalf("got %d bytes of output, want %d (last frame %+v %q)", got, outMB<<20, last, *last.Detail)
	}
	return float64(peak.Load()-min(base, peak.Load())) / (1 << 20)
}
