package jail

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// buildEscape compiles testdata/escape/<name>.c with gcc, statically
// where the C library allows it, and returns the program's path.
func buildEscape(t *testing.T, name string) string {
	t.Helper()
	gcc, err := exec.LookPath("gcc")
	testenv.Require(t, err == nil, "gcc is needed to build the escape programs")
	src, err := filepath.Abs(filepath.Join("testdata", "escape", name+".c"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), name)
	if b, err := exec.Command(gcc, "-O2", "-Wall", "-static", "-o", out, src).CombinedOutput(); err != nil {
		if b2, err2 := exec.Command(gcc, "-O2", "-Wall", "-o", out, src).CombinedOutput(); err2 != nil {
			t.Fatalf("gcc %s: %v\n%s\n%s", name, err2, b, b2)
		}
	}
	return out
}

// installInHome copies the program at host into sandbox id's home as
// name, owned by the workload, and returns its path inside.
func installInHome(t *testing.T, j *Jail, id, host, name string) string {
	t.Helper()
	b, err := os.ReadFile(host)
	if err != nil {
		t.Fatal(err)
	}
	inside := "/home/sprite/" + name
	p, err := j.HostPath(id, inside)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, b, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := j.OwnerOf(id)
	if err := os.Chown(p, uid, gid); err != nil {
		t.Fatal(err)
	}
	return inside
}

// TestStackedFilterCannotUndoTheDenyList is the stacked-filter attack
// (testdata/escape/stackclone3.c): the workload installs a filter of its
// own answering clone3 with RET_USER_NOTIF, answers CONTINUE from a
// forked helper, and calls clone3(CLONE_NEWUSER|CLONE_NEWNET). The
// jail's verdict must outrank it: clone3 fails with ENOSYS. Fails on the
// old code (clone3 answered RET_TRACE): the child is root of a new user
// namespace, CapEff 000001ffffffffff.
func TestStackedFilterCannotUndoTheDenyList(t *testing.T) {
	prog := buildEscape(t, "stackclone3")
	for _, mode := range InitModes() {
		t.Run(mode, func(t *testing.T) {
			j := startedJail(t, mode, "stack")
			inside := installInHome(t, j, "stack", prog, "stackclone3")
			c, err := j.Execute(context.Background(), "stack", []string{inside}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out := string(c.Stdout)
			if !strings.Contains(out, "filter stacked\n") {
				t.Fatalf("the workload could not stack its filter (the attack did not run): exit %d, %q %q", c.ExitStatus, out, c.Stderr)
			}
			if c.ExitStatus != 0 || !strings.Contains(out, "clone3 refused: Function not implemented") {
				t.Fatalf("clone3 under a stacked USER_NOTIF filter: exit %d, %q %q", c.ExitStatus, out, c.Stderr)
			}
		})
	}
}
