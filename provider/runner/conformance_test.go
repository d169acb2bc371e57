package runner_test

import (
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func fakeCmd(script ...string) sandbox.Cmd { return sandbox.Cmd{Name: "emit", Args: script} }

var fakeFixtures = sandboxtest.Fixtures{
	ExecOK: fakeCmd("out:hello"), ExecOKWant: "hello",
	ExecFail: fakeCmd("out:oops", "exit:3"), ExecFailCode: 3,
	SpawnOK:   fakeCmd("out:hello", "exit:0"),
	SpawnDrop: fakeCmd("out:partial", "drop"),
	SpawnStay: fakeCmd("out:ready", "stay"),
	Stderr:    fakeCmd("out:x", "err:warning"), StderrWant: "warning",
	EnvDir: fakeCmd("env:MANAGOAT_CONFORMANCE", "out:\n", "pwd"),
	Slow:   fakeCmd("out:tick", "sleep:10s", "out:done"),
}

// TestConformanceOverWireWithFake runs the whole suite through the platform
// end, a real WebSocket on loopback and the real daemon, with provider/fake
// behind the daemon.
func TestConformanceOverWireWithFake(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	sandboxtest.Run(t, pl.srv.Provider(), fakeFixtures, sandboxtest.WithNames(namer(id)), sandboxtest.WithTimeout(5*time.Second))
}

// TestConformanceThroughProxy runs the suite from "another process": a
// Client talking to the platform's proxy endpoint, which relays to the
// daemon. This is the path of `managoat --provider runner` against a
// `managoat serve`.
func TestConformanceThroughProxy(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	cl := prov.NewClient(pl.ts.URL, token)
	t.Cleanup(func() { _ = cl.Close() })
	sandboxtest.Run(t, prov.NewProvider(cl, prov.ProviderOptions{}), fakeFixtures,
		sandboxtest.WithNames(namer(id)), sandboxtest.WithTimeout(5*time.Second))
}
