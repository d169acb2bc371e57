package local

import (
	"fmt"
	"path/filepath"

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

// MaybeRunSupervisor runs this process as a sandbox's supervisor when it
// was started as one, and then exits; otherwise it returns at once. Call it
// first thing in main (after jail.Init when the binary uses the jail), and
// in TestMain of tests that create local sandboxes:
//
//	func main() {
//		if jail.Init() { return }
//		local.MaybeRunSupervisor()
//		...
//	}
func MaybeRunSupervisor() { MaybeRunSupervisorWith(OpenMechanism) }

// MaybeRunSupervisorWith is MaybeRunSupervisor for a binary whose
// mechanisms are not the built-in ones: open must be able to reopen every
// mechanism the binary's providers are configured with.
func MaybeRunSupervisorWith(open Opener) {
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
