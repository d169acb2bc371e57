package runner_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
)

// TestBinaryStreamNegotiation: the daemon reports binary_stream in its
// caps (not with TextStreamsOnly), and sends stdout as binary frames only
// to a platform whose upgrade answer takes it; its exit stays a JSON text
// frame. A platform that does not answer the header (Fountain's) gets
// base64 text frames.
func TestBinaryStreamNegotiation(t *testing.T) {
	for _, tc := range []struct {
		name       string
		textOnly   bool // the daemon's TextStreamsOnly
		accept     bool // the platform answers wire.HeaderAccept
		wantCap    bool
		wantBinary bool
	}{
		{"both", false, true, true, true},
		{"platform does not ask", false, false, true, false},
		{"daemon without the cap", true, true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			caps := make(chan string, 1)
			conns := make(chan *websocket.Conn, 1)
			ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				c := r.URL.Query().Get(wire.ParamCaps)
				caps <- c
				// (Answered even to a daemon that did not report the
				// cap: it must still send text.)
				if tc.accept {
					w.Header().Set(wire.HeaderAccept, wire.CapBinaryStream)
				}
				ws, err := websocket.Accept(w, r, nil)
				if err != nil {
					return
				}
				ws.SetReadLimit(wire.ReadLimit)
				conns <- ws
			}))
			defer ts.Close()
			d := newDaemon(t, ts.URL, newFake(t), func(c *runner.Config) { c.TextStreamsOnly = tc.textOnly })
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- d.Once(ctx) }()
			var ws *websocket.Conn
			select {
			case ws = <-conns:
			case <-ctx.Done():
				t.Fatal("the daemon did not connect")
			}
			defer func() { _ = ws.CloseNow(); cancel(); <-done }()
			if got := strings.Contains(","+<-caps+",", ","+wire.CapBinaryStream+","); got != tc.wantCap {
				t.Fatalf("caps report binary_stream: %v, want %v", got, tc.wantCap)
			}
			c := &pconn{t: t, ws: ws}
			if f := c.call(1, `{"id":1,"op":"create","name":"sb"}`); !f.OK {
				t.Fatalf("create: %+v", f)
			}
			payload := strings.Repeat("0123456789abcdef", 5000) // 80,000 bytes: three chunks
			c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["out:%s","exit:7"]}`, payload)
			var out strings.Builder
			sawBinary, sawText, exit := false, false, -1
			for exit < 0 {
				rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
				typ, b, err := ws.Read(rctx)
				rcancel()
				if err != nil {
					t.Fatalf("read: %v", err)
				}
				if typ == websocket.MessageBinary {
					sawBinary = true
					s, err := wire.DecodeBinaryStream(b)
					if err != nil {
						t.Fatalf("daemon sent a malformed binary frame: %v", err)
					}
					if s.Kind != wire.StreamStdout || s.SessionID == "" {
						t.Fatalf("binary frame %+v", s)
					}
					out.Write(s.Data)
					continue
				}
				var f frame
				if err := json.Unmarshal(b, &f); err != nil {
					t.Fatalf("daemon sent %q: %v", b, err)
				}
				switch f.Stream {
				case "stdout":
					sawText = true
					out.Write(f.Data)
				case "exit":
					exit = *f.Code
				}
			}
			if out.String() != payload || exit != 7 {
				t.Fatalf("got %d bytes (want %d), exit %d", out.Len(), len(payload), exit)
			}
			if sawBinary != tc.wantBinary || sawText == tc.wantBinary {
				t.Fatalf("binary frames %v, text frames %v; want binary only: %v", sawBinary, sawText, tc.wantBinary)
			}
		})
	}
}
