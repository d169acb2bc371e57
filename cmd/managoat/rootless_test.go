package main

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// nobody is the unprivileged user the rootless test runs as.
const nobody = 65534

// TestRunAsAnUnprivilegedUser: the README's first command works for a
// user who is not root, with managoat's defaults (a rootless jail, the
// state under the user's home): no default limit the host cannot give
// that user (memory and pids need cgroups delegated to it) makes every
// create fail, and doctor says what such a user gets.
func TestRunAsAnUnprivilegedUser(t *testing.T) {
	testenv.RequireRoot(t) // to become the unprivileged user
	for _, f := range []string{"/proc/sys/kernel/unprivileged_userns_clone", "/proc/sys/user/max_user_namespaces"} {
		b, err := os.ReadFile(f)
		testenv.Require(t, err != nil || strings.TrimSpace(string(b)) != "0",
			"unprivileged users may not make user namespaces here ("+f+" is 0)")
	}
	// A copy of the binary the user can execute, and a home of its own.
	dir, err := os.MkdirTemp("", "mg-nobody")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The user must reach it (the enclosure's temporary directory is
	// root's only).
	if err := testenv.Traversable(dir); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "managoat")
	if err := copyFile(binary, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	as := func(args ...string) (string, string, int) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Dir = home
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + home, "TMPDIR=" + home, "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}}
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return o.String(), e.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), 0
	}
	out, errOut, code := as("run", "--", "sh", "-c", "echo hello from $(id -u)")
	if code != 0 || out != "hello from 0\n" {
		t.Fatalf("run as uid %d: exit %d, stdout %q, stderr %q", nobody, code, out, errOut)
	}
	out, errOut, code = as("doctor")
	if code != 0 || !strings.Contains(out, "default limits of a sandbox made without any (jail, runc): none") {
		t.Fatalf("doctor as uid %d: exit %d, stdout %q, stderr %q", nobody, code, out, errOut)
	}
	t.Logf("doctor as uid %d:\n%s", nobody, out)
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
