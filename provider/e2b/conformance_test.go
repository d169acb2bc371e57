package e2b_test

import (
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// dropCmd prints, then kills its whole process group, journaling shim
// included, so the session never records an exit; the fake is told to end
// the command's stream without envd's end event, as a cut connection
// would. Together: a transport that closes without an exit, and a session
// whose verdict is that error.
var dropCmd = sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo partial; sleep 0.3; kill -KILL 0"}}

// TestConformance runs the suite against the fake playing each generation
// of E2B's control plane: the current service (v2 create and connect,
// secure sandboxes) and one from before the v2 routes (the provider falls
// back to v1 once, at its first create).
func TestConformance(t *testing.T) {
	for _, gen := range []e2btest.Generation{e2btest.V2, e2btest.V1} {
		t.Run(string(gen), func(t *testing.T) { conformance(t, gen) })
	}
}

func conformance(t *testing.T, gen e2btest.Generation) {
	e := newEnv(t, e2btest.Options{Generation: gen}, nil)
	e.srv.Inject(e2btest.Fault{Plane: e2btest.Envd, Path: "/process.Process/Start", Match: "kill -KILL 0", NoEnd: true, Times: -1})
	fx := sandboxtest.ShellFixtures()
	fx.SpawnDrop = dropCmd
	if e.srv.EnforcesNetwork() {
		fx.Connect = sandboxtest.ShellConnect // the fake's processes get no network under a denyOut
	}
	sandboxtest.Run(t, e.p, fx,
		sandboxtest.WithTimeout(5*time.Second),
		// E2B journals only detachable spawns, and attach needs a journal.
		sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}))
}
