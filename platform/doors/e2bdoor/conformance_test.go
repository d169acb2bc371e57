package e2bdoor_test

import (
	"os"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// TestAdapterConformance: the project's own E2B adapter (provider/e2b)
// passes the conformance suite against the door, end to end over HTTP:
// the adapter and E2B's SDK work against the same front door.
func TestAdapterConformance(t *testing.T) {
	url, key, _ := start(t)
	p, err := e2b.New(e2b.Config{APIKey: key, APIURL: url, SandboxURL: url, RequestTimeout: 20 * time.Second,
		TransitionBackoff: sandbox.Backoff{Base: 5 * time.Millisecond, Max: 50 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	fx := sandboxtest.ShellFixtures()
	if os.Geteuid() == 0 {
		fx.Connect = sandboxtest.ShellConnect // the jail's egress filter is real: deny-all is observed
	}
	sandboxtest.Run(t, p, fx, sandboxtest.WithTimeout(10*time.Second),
		sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}))
}
