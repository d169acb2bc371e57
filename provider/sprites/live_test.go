package sprites_test

import (
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// TestLive runs the conformance suite against the real Sprites API. It
// runs only when SPRITES_TOKEN is set (SPRITES_API_URL optional), and
// creates sprites named managoat-live-<unix>-<n>, destroying each when its
// case ends.
func TestLive(t *testing.T) {
	if os.Getenv(sprites.EnvToken) == "" {
		t.Skip("SPRITES_TOKEN is not set; the live suite talks to the real Sprites API")
	}
	p, err := sprites.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	stamp := time.Now().Unix()
	names := func() string { return fmt.Sprintf("managoat-live-%d-%d", stamp, n.Add(1)) }
	sandboxtest.Run(t, p, sandboxtest.ShellFixtures(),
		sandboxtest.WithTimeout(60*time.Second),
		sandboxtest.WithNames(names),
		sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}))
}
