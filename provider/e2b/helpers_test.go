package e2b_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type env struct {
	t   *testing.T
	p   *e2b.Provider
	srv *e2btest.Server
	cfg e2b.Config
}

// newEnv starts a fake and a provider talking to it. tweak may adjust
// both configurations.
func newEnv(t *testing.T, fo e2btest.Options, tweak func(*e2b.Config)) *env {
	t.Helper()
	srv := e2btest.NewServer(fo)
	cfg := e2b.Config{
		APIKey:         srv.APIKey(),
		APIURL:         srv.APIURL(),
		SandboxURL:     srv.SandboxURL(),
		User:           srv.User(),
		RequestTimeout: 5 * time.Second,
		// E2B's 409 (changing state) is retried; quickly in tests.
		TransitionBackoff: sandbox.Backoff{Base: 5 * time.Millisecond, Max: 20 * time.Millisecond},
	}
	if tweak != nil {
		tweak(&cfg)
	}
	p, err := e2b.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		srv.Close()
		_ = p.Close()
	})
	return &env{t: t, p: p, srv: srv, cfg: cfg}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func (e *env) create(name string) *sandbox.Handle {
	e.t.Helper()
	h, err := e.p.Create(ctx(e.t), name, sandbox.CreateOptions{})
	if err != nil {
		e.t.Fatalf("create %s: %v", name, err)
	}
	return h
}

// collect reads a command's events until the channel closes.
func collect(t *testing.T, c *sandbox.Command, within time.Duration) (stdout, stderr string, term sandbox.Event) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case ev, ok := <-c.Events():
			if !ok {
				return
			}
			switch ev.Kind {
			case sandbox.Stdout:
				stdout += string(ev.Data)
			case sandbox.Stderr:
				stderr += string(ev.Data)
			default:
				term = ev
			}
		case <-deadline:
			_ = c.Stop()
			t.Fatalf("command did not finish within %v (stdout so far %q)", within, stdout)
		}
	}
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
