package runner_test

import (
	"context"
	"github.com/managoat/managoat/internal/testenv"
	"log/slog"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/local"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisorWith(openMech)
	if daemonChild() {
		return
	}
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

const token = "s3cret"

var quiet = slog.New(slog.DiscardHandler)

// platform is a Server on an httptest loopback server.
type platform struct {
	srv  *prov.Server
	host *prov.LocalHost
	ts   *httptest.Server
}

func newPlatform(t testing.TB, cfg prov.ServerConfig) *platform {
	t.Helper()
	host := prov.NewLocalHost()
	if cfg.Host == nil {
		cfg.Host = host
	}
	if cfg.Auth == nil {
		cfg.Auth = prov.StaticToken(token)
	}
	cfg.Logger = quiet
	srv := prov.NewServer(cfg)
	ts := httptest.NewServer(srv)
	pl := &platform{srv: srv, host: host, ts: ts}
	t.Cleanup(func() {
		srv.Close()
		ts.Close()
	})
	return pl
}

// daemon is a runner daemon running in a goroutine.
type daemon struct {
	d      *runner.Daemon
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

func (d *daemon) stop() error {
	var err error
	d.once.Do(func() {
		d.cancel()
		err = <-d.done
		d.d.Close()
	})
	return err
}

func startDaemon(t testing.TB, url string, p sandbox.Provider, mod func(*runner.Config)) *daemon {
	t.Helper()
	cfg := runner.Config{URL: url, Token: token, Name: "test-runner", Root: "/nowhere", Provider: p,
		Logger: quiet, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		PingInterval: -1}
	if mod != nil {
		mod(&cfg)
	}
	d, err := runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	dm := &daemon{d: d, cancel: cancel, done: make(chan error, 1)}
	go func() { dm.done <- d.Run(ctx) }()
	t.Cleanup(func() { _ = dm.stop() })
	return dm
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t testing.TB, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// online waits until a runner is online and returns its id.
func (pl *platform) online(t testing.TB) string {
	t.Helper()
	var id string
	waitFor(t, "runner online", 10*time.Second, func() bool {
		rs := pl.host.Online()
		if len(rs) == 1 {
			id = rs[0].ID
			return true
		}
		return false
	})
	return id
}

func (pl *platform) offline(t testing.TB) {
	t.Helper()
	waitFor(t, "runner offline", 10*time.Second, func() bool { return len(pl.host.Online()) == 0 })
}

func namer(id string) func() string {
	return func() string {
		n, err := prov.For(id)
		if err != nil {
			panic(err)
		}
		return n
	}
}

// recv reads the next event or fails after d.
func recv(t testing.TB, c *sandbox.Command, d time.Duration) sandbox.Event {
	t.Helper()
	select {
	case ev, ok := <-c.Events():
		if !ok {
			t.Fatal("events closed")
		}
		return ev
	case <-time.After(d):
		t.Fatalf("no event within %v", d)
	}
	return sandbox.Event{}
}
