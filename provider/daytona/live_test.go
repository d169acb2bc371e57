package daytona_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// TestLive runs the conformance suite against the real Daytona (or the
// self-hosted one in DAYTONA_API_URL); it runs only when DAYTONA_API_KEY is
// set, and creates and destroys sandboxes named msb-live-<time>-<n>.
func TestLive(t *testing.T) {
	if os.Getenv(daytona.EnvAPIKey) == "" {
		t.Skip("DAYTONA_API_KEY is not set")
	}
	p, err := daytona.NewFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	stamp := time.Now().Unix()
	sandboxtest.Run(t, p, sandboxtest.ShellFixtures(),
		sandboxtest.WithTimeout(60*time.Second),
		sandboxtest.WithNames(func() string { n++; return fmt.Sprintf("msb-live-%d-%d", stamp, n) }))
}
