package client_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisor()
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

func fakeCmd(script ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: script} }

var fakeFixtures = sandboxtest.Fixtures{
	ExecOK: fakeCmd("out:hello"), ExecOKWant: "hello",
	ExecFail: fakeCmd("out:oops", "exit:3"), ExecFailCode: 3,
	SpawnOK:   fakeCmd("out:hello", "exit:0"),
	SpawnDrop: fakeCmd("out:partial", "drop"),
	SpawnStay: fakeCmd("out:ready", "stay"),
	Stderr:    fakeCmd("out:x", "err:warning"), StderrWant: "warning",
	EnvDir:  fakeCmd("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
	Slow:    fakeCmd("out:tick", "sleep:10s", "out:done"),
	Connect: func(addr string) sandbox.Cmd { return fakeCmd("connect:" + addr) },
}

func newClient(t testing.TB, url, key, pin string) *client.Client {
	t.Helper()
	c, err := client.New(client.Options{URL: url, APIKey: key, Provider: pin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// TestConformanceFake: the whole suite through serve, on provider/fake.
func TestConformanceFake(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "fake")
	sandboxtest.Run(t, c, fakeFixtures, sandboxtest.WithTimeout(5*time.Second))
}

// TestConformanceLocal: the whole suite through serve, on provider/local
// (trusted mechanism: host paths, so files go under the sandbox's home).
func TestConformanceLocal(t *testing.T) {
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "local")
	sandboxtest.Run(t, c, sandboxtest.ShellFixtures(), sandboxtest.WithWriteDir("/home/sprite"), sandboxtest.WithTimeout(5*time.Second))
}

// TestConformanceLocalJail: the whole suite through serve on provider/local
// over the jail, the mechanism serve uses by default (root only). The
// jail's init ignores SIGTERM, so a graceful termination runs its whole
// grace: shortGrace makes the default 10 s one second, as provider/local's
// own jail conformance test does.
func TestConformanceLocalJail(t *testing.T) {
	testenv.RequireRoot(t)
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "jail"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": shortGrace{p}}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "local")
	sandboxtest.Run(t, c, sandboxtest.ShellFixtures(), sandboxtest.WithDir("/home/sprite"), sandboxtest.WithTimeout(5*time.Second))
}

type shortGrace struct{ *local.Provider }

func (g shortGrace) TerminateSession(ctx context.Context, h *sandbox.Handle, id string, o sandbox.TerminateOptions) error {
	if o.Timeout == 0 || o.Timeout > time.Second {
		o.Timeout = time.Second
	}
	return g.Provider.TerminateSession(ctx, h, id, o)
}

// TestConformanceRunner: the whole suite through serve, on the runner
// provider: a runner daemon (provider/fake behind it) authenticated with
// the account's API key, so it is the account's runner.
func TestConformanceRunner(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	key := pl.Account(t, "alice")
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startRunner(t, pl.URL, key, "alice-box", f)
	waitRunners(t, pl, 1)
	c := newClient(t, pl.URL, key, "runner")
	sandboxtest.Run(t, noFileReader{c}, fakeFixtures, sandboxtest.WithTimeout(5*time.Second))
}

// noFileReader is the client without ReadFile: the runner provider reads
// no files (the platform answers not_supported), and the suite's gate on
// reading is the FileReader interface, which a client has statically.
type noFileReader struct{ withoutReader }

type withoutReader interface {
	sandbox.Provider
	sandbox.CreateNewer
	sandbox.OnceDestroyer
	sandbox.CheckpointOnceCreator
	sandbox.SessionTerminator
	sandbox.SandboxCapabilities
}

func destroyAll(p *local.Provider) {
	ctx := context.Background()
	names, _ := p.ListAllNames(ctx)
	for _, n := range names {
		_ = p.Destroy(ctx, sandbox.BuildHandle(local.Name, n))
	}
}

func startRunner(t testing.TB, url, key, name string, p sandbox.Provider) {
	t.Helper()
	d, err := runner.New(runner.Config{URL: url, Token: key, Name: name, Root: "/nowhere", Provider: p, Logger: quiet(),
		BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		d.Close()
	})
}

func waitRunners(t testing.TB, pl *apitest.Platform, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for len(pl.Relay.Host().Online()) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d runners online, want %d", len(pl.Relay.Host().Online()), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }
