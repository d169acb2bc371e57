package sprites_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newFake(t *testing.T, cfg sprites.Config) (*spritestest.Server, *sprites.Provider) {
	t.Helper()
	srv := spritestest.NewServer(spritestest.Options{})
	t.Cleanup(srv.Close)
	cfg.Token = srv.Token
	cfg.BaseURL = srv.URL
	p, err := sprites.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// next reads the next event or fails after a bounded wait.
func next(t *testing.T, c *sandbox.Command) sandbox.Event {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		if !ok {
			t.Fatal("events closed")
		}
		return ev
	case <-time.After(10 * time.Second):
		t.Fatal("no event within 10s")
	}
	return sandbox.Event{}
}

func TestSmoke(t *testing.T) {
	srv, p := newFake(t, sprites.Config{})
	ctx := ctxT(t)
	h, err := p.Create(ctx, "smoke", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a, _ := srv.URLAuth("smoke"); a != "public" {
		t.Fatalf("auth %q", a)
	}
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hello; echo err >&2; exit 3"}}, sandbox.ExecOptions{StderrToStdout: true})
	if err != nil || res.ExitCode != 3 || !strings.Contains(string(res.Output), "hello") {
		t.Fatalf("exec %q %d %v", res.Output, res.ExitCode, err)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, c); ev.Kind != sandbox.Stdout || string(ev.Data) != "ready\n" {
		t.Fatalf("first %v %q", ev.Kind, ev.Data)
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 {
		t.Fatalf("sessions %v %v", ss, err)
	}
	a, err := p.Attach(ctx, h, ss[0].ID, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(t, a); string(ev.Data) != "ready\n" {
		t.Fatalf("replay %q", ev.Data)
	}
	if err := c.WriteStdin(ctx, []byte("ping")); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, c); !strings.Contains(string(ev.Data), "ping") {
		t.Fatalf("echo %q", ev.Data)
	}
	if ev := next(t, a); !strings.Contains(string(ev.Data), "ping") {
		t.Fatalf("tail %q", ev.Data)
	}
	if err := c.CloseStdin(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := next(t, c); ev.Kind != sandbox.Exit || ev.Code != 0 {
		t.Fatalf("exit %v %d %v", ev.Kind, ev.Code, ev.Err)
	}
	if ev := next(t, a); ev.Kind != sandbox.Exit {
		t.Fatalf("attacher exit %v", ev.Kind)
	}
	if err := c.WriteStdin(ctx, []byte("late")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Fatalf("late write %v", err)
	}
	_ = c.Stop()
	_ = a.Stop()
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("get after destroy %v", err)
	}
}
