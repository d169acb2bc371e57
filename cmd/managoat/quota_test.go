package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// --disk bounds a sandbox's home on create and run: a write past it fails
// inside, ls -o wide shows the quota and the use, doctor says how homes
// are bounded here.
func TestDiskFlag(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	out, _, _ := managoatEnv(t, env, "doctor")
	m := regexp.MustCompile(`(?m)^home disk quota \(jail, runc; --disk\): (\S+)`).FindStringSubmatch(out)
	if m == nil || !strings.Contains(out, "default home quota of a sandbox made without one: ") {
		t.Fatalf("doctor says nothing of home quotas:\n%s", out)
	}
	testenv.Require(t, m[1] == "loop:" || m[1] == "project:", "a home quota on this host: "+m[0])
	if _, e, code := managoatEnv(t, env, "create", "--disk", "64M", "q1"); code != 0 {
		t.Fatalf("create --disk 64M: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "q1") })
	o, e, code := managoatEnv(t, env, "exec", "q1", "--", "sh", "-c", "dd if=/dev/zero of=$HOME/f bs=1M count=128")
	if code == 0 || !strings.Contains(o+e, "No space left") {
		t.Fatalf("dd past 64M: exit %d: %s %s", code, o, e)
	}
	out, _, _ = managoatEnv(t, env, "ls", "-o", "wide")
	if !regexp.MustCompile(`(?m)^q1\s+running\s+-\s+\d+M\s+\d+\s+-\s+(\d+)M/64M\s+-\s+local\s+jail\s`).MatchString(out) {
		t.Fatalf("ls -o wide:\n%s", out)
	}
	o, e, code = managoatEnv(t, env, "run", "--disk", "16M", "--", "sh", "-c", "dd if=/dev/zero of=$HOME/f bs=1M count=64 2>&1; df -B1M --output=size $HOME | tail -1")
	if code != 0 || !strings.Contains(o, "No space left") {
		t.Fatalf("run --disk 16M: exit %d: %s %s", code, o, e)
	}
	if _, e, code := managoatEnv(t, env, "run", "--disk", "10K", "--", "true"); code != 2 || !strings.Contains(e, "--disk") {
		t.Fatalf("--disk 10K: exit %d: %s", code, e)
	}
	if _, e, code := managoatEnv(t, env, "--mechanism", "trusted", "run", "--disk", "16M", "--", "true"); code != 125 || !strings.Contains(e, "disk_quota") {
		t.Fatalf("--disk on trusted: exit %d: %s", code, e)
	}
}
