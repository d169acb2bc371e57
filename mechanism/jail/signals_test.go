package jail_test

import (
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism"
)

// A workload starts with no signal ignored (the init's own protection
// against signals from inside must not leak into it through exec), and a
// workload's TERM to pid 1 leaves the init running.
func TestWorkloadSignalsAreDefault(t *testing.T) {
	j := newJail(t)
	started(t, j, "sigs", mechanism.Spec{})
	c := run(t, j, "sigs", "grep SigIgn /proc/self/status")
	if got := strings.TrimSpace(string(c.Stdout)); got != "SigIgn:\t0000000000000000" {
		t.Fatalf("workload starts with ignored signals: %q", got)
	}
	c = run(t, j, "sigs", "sleep 30 & p=$!; kill -TERM $p; wait $p; echo $?")
	if got := strings.TrimSpace(string(c.Stdout)); got != "143" {
		t.Fatalf("a TERMed sleep ended with %q, want 143", got)
	}
	run(t, j, "sigs", "for s in TERM INT HUP QUIT PIPE USR1 USR2 ALRM VTALRM PROF XCPU XFSZ WINCH IO PWR URG TSTP TTIN TTOU CONT; do kill -$s 1; done; true")
	if c := run(t, j, "sigs", "echo alive"); strings.TrimSpace(string(c.Stdout)) != "alive" {
		t.Fatalf("the init did not survive signals from inside: %q", c.Stdout)
	}
}
