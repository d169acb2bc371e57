package oci_test

import (
	"os"
	"os/exec"
	"testing"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/testenv"
)

// TestMain: the jail (the benchmarks' baseline) re-executes this binary
// as each of its sandboxes' init.
func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// requireRuntime skips (fails under CI=true) unless root and the runtime.
func requireRuntime(t testing.TB, runtime string) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := exec.LookPath(runtime)
	if err != nil {
		_, err = os.Stat("/usr/sbin/" + runtime)
	}
	testenv.Require(t, err == nil, runtime+" is not installed (apt-get install "+runtime+")")
}

func testenvRoot(t testing.TB) { testenv.RequireRoot(t) }
