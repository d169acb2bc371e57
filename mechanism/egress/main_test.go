package egress_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
)

func TestMain(m *testing.M) {
	if os.Getenv(agentEnv) != "" {
		os.Exit(agentMain()) // a rootless sandbox's stand-in (rootless_test.go)
	}
	if os.Getenv(publisherEnv) != "" {
		os.Exit(publisherMain()) // a manager that dies (publish_rootless_test.go)
	}
	if os.Getenv(attackerEnv) != "" {
		os.Exit(attackerMain()) // another local user (ports_owner_test.go)
	}
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}
