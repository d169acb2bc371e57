package e2b_test

import (
	"os"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// TestLive runs the conformance suite against E2B itself; it runs only
// when E2B_API_KEY is set (E2B_API_URL, E2B_TEMPLATE and E2B_USER are
// honoured) and creates real, billed sandboxes.
func TestLive(t *testing.T) {
	if os.Getenv("E2B_API_KEY") == "" {
		t.Skip("E2B_API_KEY is not set; the live suite talks to E2B itself")
	}
	p, err := e2b.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sandboxtest.Run(t, p, sandboxtest.ShellFixtures(),
		sandboxtest.WithTimeout(30*time.Second),
		sandboxtest.WithSpawnOptions(sandbox.SpawnOptions{Detachable: true}))
}
