package sprites_test

import (
	"testing"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

func fixtures() sandboxtest.Fixtures {
	fx := sandboxtest.ShellFixtures()
	fx.SpawnDrop = sandbox.Cmd{Name: spritestest.DropCommand, Args: []string{"partial"}}
	if (&spritestest.Server{}).EnforcesPolicy() {
		// As root the fake runs a sprite under a policy without a network
		// (spritestest's EnforcesPolicy): the suite observes deny-all.
		fx.Connect = sandboxtest.ShellConnect
	}
	return fx
}

// TestConformance runs the whole suite against the fake with detachable
// spawns (only detachable sessions survive their transport on Sprites);
// a sprite parks by itself, so Suspend is a no-op (WithSelfParking).
func TestConformance(t *testing.T) {
	_, p := newFake(t, sprites.Config{})
	sandboxtest.Run(t, p, fixtures(), sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}), sandboxtest.WithSelfParking())
}

// TestConformanceCheckpoints runs it again with checkpoint creation on, so
// the checkpoint and create_checkpoint_once cases run instead of the
// refusal case.
func TestConformanceCheckpoints(t *testing.T) {
	_, p := newFake(t, sprites.Config{CheckpointCreationEnabled: true})
	sandboxtest.Run(t, p, fixtures(), sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}), sandboxtest.WithSelfParking())
}
