package cgroups

import (
	"github.com/managoat/managoat/internal/testenv"
	"testing"

	"go.uber.org/goleak"
)

// A test takes subtrees in a mount namespace of its own on a goroutine;
// none may outlive the tests.
func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}
