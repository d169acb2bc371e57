package jail_test

import (
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/mechanismtest"
)

// newForSuite makes each check's Jail.
func newForSuite(t *testing.T) mechanism.Mechanism {
	j, err := jail.New(jail.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// suiteWithInternet makes each check's Jail with egress to in.
func suiteWithInternet(in *egresstest.Internet) func(t *testing.T) mechanism.Mechanism {
	return func(t *testing.T) mechanism.Mechanism {
		j, err := jail.New(jail.Config{StateDir: t.TempDir(), Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}})
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
}

func TestConformance(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	mechanismtest.Run(t, suiteWithInternet(in), mechanismtest.Strict(testenv.InCI()), mechanismtest.Internet(in))
}

// TestConformanceGoInit runs the breach conformance again with the Go init,
// the fallback where there is no C init (TestConformance runs the
// default: the standalone C init where there is one).
func TestConformanceGoInit(t *testing.T) {
	testenv.RequireRoot(t)
	if len(jail.InitModes()) == 1 {
		t.Skip("TestConformance already ran the Go init: this binary has no C init")
	}
	t.Setenv(jail.InitEnv, "go")
	in := egresstest.New(t)
	mechanismtest.Run(t, suiteWithInternet(in), mechanismtest.Strict(testenv.InCI()), mechanismtest.Internet(in))
}
