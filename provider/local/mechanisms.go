package local

import (
	"fmt"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/provider/local/supervisor"
)

// Opener opens the mechanism called name whose state lives under the
// provider's state directory stateDir (conventionally in
// stateDir/mech/<name>). The same name and stateDir must give a mechanism
// that sees the same sandboxes, in any process.
type Opener func(name, stateDir string) (mechanism.Mechanism, error)

// MechanismNames lists the names OpenMechanism knows.
func MechanismNames() []string { return mechanismNames() }

// OpenMechanism opens one of the built-in mechanisms by name: "jail",
// "trusted", "oci" (runc), "oci:runsc" (gVisor), or the Name() of one of
// them ("oci/runc"). Its state lives under stateDir/mech/.
func OpenMechanism(name, stateDir string) (mechanism.Mechanism, error) {
	m, ok, err := openBuiltin(name, filepath.Join(stateDir, "mech"))
	if !ok {
		return nil, mechanism.Invalid("mechanism", fmt.Sprintf("unknown mechanism %q (known: %v)", name, mechanismNames()))
	}
	return m, err
}

// init takes the supervisor role before main runs. A supervisor of a
// sandbox whose provider opened a built-in mechanism (Config.Mechanism
// nil) serves here and exits: a program's main never runs in it, whether
// or not main calls MaybeRunSupervisor. A supervisor of a provider given
// its own Config.Mechanism needs the program's Opener, which only main can
// pass (MaybeRunSupervisorWith): until main does, New ends the process
// with a line naming that call, and so does a watchdog after hookGrace, so
// a forgotten hook fails the Create that launched the supervisor at once
// and never starts a sandbox from inside one.
func init() {
	if !supervisor.IsSupervisor() {
		return
	}
	if !supervisor.HookNeeded() {
		MaybeRunSupervisor() // exits
	}
	hookPending.Store(true)
	time.AfterFunc(hookGrace, func() {
		if hookPending.Load() {
			supervisor.ForgotHook("local.MaybeRunSupervisorWith")
		}
	})
}

// hookGrace is how long a supervisor that needs main's hook waits for it.
const hookGrace = 2 * time.Second

// hookPending is set in a supervisor process until main calls
// MaybeRunSupervisorWith.
var hookPending atomic.Bool

// MaybeRunSupervisor runs this process as a sandbox's supervisor when it
// was started as one, and then exits; otherwise it returns at once. A
// program whose providers open built-in mechanisms (Config.Mechanism nil,
// as managoat's CLI) needs no call: the package's init takes the role
// before main. It remains for programs that call it first thing in main.
func MaybeRunSupervisor() { MaybeRunSupervisorWith(OpenMechanism) }

// MaybeRunSupervisorWith is MaybeRunSupervisor for a binary that gives
// New its own Config.Mechanism: its supervisors reopen that mechanism
// with open, which must be able to reopen every mechanism the binary's
// providers are configured with. Such a binary must call it first thing
// in main, and in TestMain:
//
//	func main() {
//		local.MaybeRunSupervisorWith(myOpener)
//		...
//	}
//
// Without the call, the supervisor process ends as soon as main reaches
// New (or after two seconds) with a line naming this call, and the
// Create that launched it fails with that line.
func MaybeRunSupervisorWith(open Opener) {
	hookPending.Store(false)
	supervisor.MaybeRun(func(dir string) (supervisor.Backend, error) {
		r, err := readRecord(dir)
		if err != nil {
			return nil, err
		}
		stateDir := filepath.Dir(filepath.Dir(dir))
		m, err := open(r.Mechanism, stateDir)
		if err != nil {
			return nil, err
		}
		return &backend{m: m, id: r.InstanceID, dir: dir}, nil
	})
}
