package spritesdoor_test

import (
	"os"
	"testing"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// withheld is the project's Sprites adapter with the two capabilities
// the door cannot give it withheld: public_url (a sprite has no URL: the
// local provider publishes only the ports asked for at create, and the
// door asks for none) and force_terminate_session (the adapter confirms
// a SIGKILL only by the pid of Sprites' kill stream, and the platform
// reports no pid to send). Every other method is the adapter's own.
type withheld struct{ *sprites.Provider }

func (w withheld) Capabilities() sandbox.Capabilities {
	return w.Provider.Capabilities().Without(sandbox.CapPublicURL, sandbox.CapForceTerminateSession)
}

// TestConformance runs the project's own Sprites adapter (provider/sprites)
// against the door over HTTP, through the whole suite, with detachable
// spawns and self-parking as its own conformance test against the fake
// does; checkpoints are on (the local provider below has them), and as
// root (the jail) a policy's deny-all is observed, not only accepted.
func TestConformance(t *testing.T) {
	url, key, _, _ := start(t)
	p, err := sprites.New(sprites.Config{Token: key, BaseURL: url, CheckpointCreationEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	fx := sandboxtest.ShellFixtures()
	if os.Geteuid() == 0 {
		// On the jail the platform's allow list is enforced: the suite
		// observes deny-all through the door's policy/network.
		fx.Connect = sandboxtest.ShellConnect
	}
	sandboxtest.Run(t, withheld{p}, fx, sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}), sandboxtest.WithSelfParking())
}
