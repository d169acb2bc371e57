package cgroups

import (
	"testing"

	"go.uber.org/goleak"
)

// A test takes subtrees in a mount namespace of its own on a goroutine;
// none may outlive the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
