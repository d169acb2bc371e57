package sprites_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
)

// scripted serves the exec WebSocket with a fixed list of frames, then
// ends as told: "close" (a close frame), "drop" (the TCP connection dies)
// or "hold" (stay open until the client leaves).
type msg struct {
	text bool
	data []byte
}

func scripted(t *testing.T, frames []msg, end string) *sprites.Provider {
	t.Helper()
	done := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ctx := r.Context()
		for _, f := range frames {
			typ := websocket.MessageBinary
			if f.text {
				typ = websocket.MessageText
			}
			if c.Write(ctx, typ, f.data) != nil {
				return
			}
		}
		switch end {
		case "close":
			_ = c.Close(websocket.StatusNormalClosure, "")
		case "drop":
			_ = c.CloseNow()
		default:
			select {
			case <-done:
			case <-ctx.Done():
			}
			_ = c.CloseNow()
		}
	}))
	t.Cleanup(func() { close(done); srv.Close() })
	p, err := sprites.New(sprites.Config{Token: "t", BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// collect reads every event until the channel closes (bounded).
func collect(t *testing.T, c *sandbox.Command) []sandbox.Event {
	t.Helper()
	var evs []sandbox.Event
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return evs
			}
			evs = append(evs, ev)
		case <-timeout:
			t.Fatal("events did not close")
		}
	}
}

func TestExitFrames(t *testing.T) {
	b := func(p ...byte) msg { return msg{data: p} }
	for _, tc := range []struct {
		name   string
		frames []msg
		end    string
		code   int // -1: want closed_before_exit
	}{
		{"no byte means 0", []msg{b(3)}, "hold", 0},
		{"one byte 42, trailing ignored", []msg{b(3, 42, 0, 0, 0)}, "hold", 42},
		{"255", []msg{b(3, 255)}, "hold", 255},
		{"130", []msg{b(1, 'x'), b(3, 130)}, "hold", 130},
		{"queued exit before close wins", []msg{b(1, 'x'), b(3, 7)}, "close", 7},
		{"close frame without exit", []msg{b(1, 'x')}, "close", -1},
		{"dropped connection without exit", []msg{b(1, 'x')}, "drop", -1},
		{"unknown stream ids ignored", []msg{b(9, 'z'), b(), b(3, 1)}, "hold", 1},
		{"port notice dropped", []msg{{text: true, data: []byte(`{"type":"port","port":8080}`)}, b(3, 0)}, "hold", 0},
		{"tty exit control message, code field", []msg{{text: true, data: []byte(`{"type":"session_info","session_id":"5","tty":true}`)},
			b('r', 'a', 'w'), {text: true, data: []byte(`{"type":"exit","code":9}`)}}, "hold", 9},
		{"tty exit control message, exit_code field", []msg{{text: true, data: []byte(`{"type":"session_info","session_id":5,"tty":true}`)},
			{text: true, data: []byte(`{"type":"exit","exit_code":3}`)}}, "hold", 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := scripted(t, tc.frames, tc.end)
			c, err := p.Spawn(ctxT(t), sandbox.BuildHandle("sprites", "s"), sandbox.Cmd{Name: "x"}, sandbox.SpawnOptions{Stdin: true})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			evs := collect(t, c)
			if len(evs) == 0 {
				t.Fatal("no events")
			}
			last := evs[len(evs)-1]
			for _, ev := range evs[:len(evs)-1] {
				if ev.Terminal() || (ev.Kind != sandbox.Stdout && ev.Kind != sandbox.Stderr) || ev.Ref != c.Ref {
					t.Fatalf("non-output event before the end: %+v", ev)
				}
				if string(ev.Data) == "z" {
					t.Fatal("unknown stream id delivered")
				}
			}
			if tc.code < 0 {
				if last.Kind != sandbox.Error || !sandbox.IsClosedBeforeExit(last.Err) {
					t.Fatalf("last = %+v, want closed_before_exit", last)
				}
				return
			}
			if last.Kind != sandbox.Exit || last.Code != tc.code {
				t.Fatalf("last = %+v, want exit %d", last, tc.code)
			}
			if tc.name == "tty exit control message, code field" && (len(evs) != 2 || string(evs[0].Data) != "raw") {
				t.Fatalf("tty raw bytes: %+v", evs)
			}
		})
	}
}

// TestExecClosedBeforeExit: exec over a socket that closes without an exit
// is Unavailable{closed_before_exit}, never the partial output.
func TestExecClosedBeforeExit(t *testing.T) {
	p := scripted(t, []msg{{data: []byte{1, 'p', 'a', 'r', 't'}}}, "close")
	res, err := p.Exec(ctxT(t), sandbox.BuildHandle("sprites", "s"), sandbox.Cmd{Name: "x"}, sandbox.ExecOptions{})
	if !sandbox.IsClosedBeforeExit(err) || res.Output != nil {
		t.Fatalf("res %+v err %v", res, err)
	}
}

// TestWriteAfterSocketGone: a write to a command whose socket is gone is
// ErrCommandExited (the Elixir adapter returned a bare not_connected).
func TestWriteAfterSocketGone(t *testing.T) {
	p := scripted(t, []msg{{data: []byte{1, 'x'}}}, "drop")
	ctx := ctxT(t)
	c, err := p.Spawn(ctx, sandbox.BuildHandle("sprites", "s"), sandbox.Cmd{Name: "x"}, sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	collect(t, c)
	if err := p.WriteStdin(ctx, c, []byte("late")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("provider WriteStdin after drop = %v", err)
	}
	if err := p.CloseStdin(ctx, c); err != nil {
		t.Fatalf("CloseStdin on a dead command = %v, want nil", err)
	}
	_ = c.Stop()
	if err := p.WriteStdin(ctx, c, []byte("late")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("provider WriteStdin after Stop = %v", err)
	}
	if err := p.StopCommand(c); err != nil {
		t.Fatal(err)
	}
	if err := p.StopCommand(&sandbox.Command{Provider: "sprites"}); err != nil {
		t.Fatal(err)
	}
	if err := p.WriteStdin(ctx, &sandbox.Command{Provider: "sprites"}, nil); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("WriteStdin without private = %v", err)
	}
	var iv *sandbox.InvalidError
	if err := p.WriteStdin(ctx, nil, nil); !errors.As(err, &iv) {
		t.Fatalf("WriteStdin(nil) = %v", err)
	}
}
