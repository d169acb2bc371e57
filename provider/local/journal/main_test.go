package journal

import (
	"testing"

	"go.uber.org/goleak"
)

// The tests tail one writer from several goroutines; none may outlive them.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
