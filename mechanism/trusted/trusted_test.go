package trusted_test

import (
	"github.com/managoat/managoat/internal/testenv"
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/mechanismtest"
	"github.com/managoat/managoat/mechanism/trusted"
)

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// TestConformance: trusted passes what it does (lifecycle, execute's
// outcomes, the wall clock) and reports every isolation and resource
// check as not demonstrated.
func TestConformance(t *testing.T) {
	mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
		m, err := trusted.New(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return m
	})
}
