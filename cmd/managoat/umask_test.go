package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// TestRunUnderStrictUmask: a caller whose umask is 077 still gets a
// sandbox its workload can start in (the jail built its tree with the
// caller's umask, so / and /usr were 0700 and every command was refused).
func TestRunUnderStrictUmask(t *testing.T) {
	testenv.RequireRoot(t)
	cmd := exec.Command("sh", "-c", `umask 077 && exec "$0" run -- echo ok`, binary)
	cmd.Env = append(os.Environ(), "MANAGOAT_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("run under umask 077: %v\n%s", err, out)
	}
}
