package pgtest_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/pgtest"
)

// TestStart: a cluster starts, answers a query over its socket, and is
// gone after the test.
func TestStart(t *testing.T) {
	srv := pgtest.Start(t)
	out, err := exec.Command("psql", srv.DSN("postgres"), "-Atc", "select 40+2").CombinedOutput()
	if err != nil {
		t.Fatalf("psql: %v\n%s", err, out)
	}
	if strings.TrimSpace(string(out)) != "42" {
		t.Fatalf("psql said %q", out)
	}
}
