package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// TestForgottenHooks builds testdata/forgothook, a program on this
// provider that calls no hook at all, and runs it: with the jail opened
// by name (either init) its Create and Exec work and its main runs once
// (the supervisor and the jail's init take their roles in package init
// functions, before main); with a Config.Mechanism of its own, whose
// supervisor needs main's MaybeRunSupervisorWith, the Create fails within
// seconds with a line naming that call, main ran twice (the program and
// the one supervisor, which ended in New), and nothing it started is left.
func TestForgottenHooks(t *testing.T) {
	testenv.RequireRoot(t)
	gobin, err := exec.LookPath("go")
	testenv.Require(t, err == nil, "the go command builds the test program")
	bin := filepath.Join(t.TempDir(), "forgothook")
	if out, err := exec.Command(gobin, "build", "-o", bin, "./testdata/forgothook").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		mode, initMode string
		want           string
		starts         int
	}{
		{"builtin", "", "exec: 0 hello\n", 1},
		{"builtin", "go", "exec: 0 hello\n", 1},
		{"custom", "", "local.MaybeRunSupervisorWith first", 2},
	} {
		t.Run(c.mode+c.initMode, func(t *testing.T) {
			state := t.TempDir()
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), "FORGOT_STATE="+state, "FORGOT_MODE="+c.mode, "MANAGOAT_JAIL_INIT="+c.initMode)
			began := time.Now()
			out, _ := cmd.CombinedOutput()
			took := time.Since(began)
			if !strings.Contains(string(out), c.want) {
				t.Fatalf("said %q, want %q", out, c.want)
			}
			if took > 10*time.Second {
				t.Errorf("took %v", took)
			}
			b, err := os.ReadFile(filepath.Join(state, "starts"))
			if err != nil {
				t.Fatal(err)
			}
			if n := strings.Count(string(b), "\n"); n != c.starts {
				t.Errorf("main ran %d times, want %d", n, c.starts)
			}
			// Nothing that names the state directory runs on (a supervisor
			// may take a moment to see its sandbox gone and exit; polled).
			for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				out, err := exec.Command("pgrep", "-a", "-f", state).Output()
				if err != nil {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("processes left: %s", out)
					break
				}
			}
			names, _ := os.ReadDir(filepath.Join(state, "instances"))
			if len(names) != 0 {
				t.Errorf("instances left: %v", names)
			}
		})
	}
}
