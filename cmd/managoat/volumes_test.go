package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/sandbox"
)

// managoatIn runs the binary in dir (a relative -v HOST is read from it).
func managoatIn(t *testing.T, dir string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), env...)
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

// volumeSource is a host directory with a file, writable by the
// sandbox's user, and its parent.
func volumeSource(t *testing.T) (parent, src string) {
	t.Helper()
	parent = t.TempDir()
	src = filepath.Join(parent, "src")
	if err := os.Mkdir(src, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "f"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return parent, src
}

// TestRunVolume: run -v binds a host directory (HOST relative to the
// current directory), read-write or :ro; a :ro one refuses writes, and the
// command can neither remount it read-write nor unmount it.
func TestRunVolume(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	parent, src := volumeSource(t)
	out, e, code := managoatIn(t, parent, env, "run", "-v", "src:/data", "--volume", src+":/home/sprite/ro:ro", "--",
		"sh", "-c", "cat /data/f; echo written > /data/w; echo x > /home/sprite/ro/f")
	if out != "from the host\n" || code != 2 || !strings.Contains(e, "Read-only file system") {
		t.Fatalf("run -v: stdout %q stderr %q exit %d", out, e, code)
	}
	if b, err := os.ReadFile(filepath.Join(src, "w")); err != nil || string(b) != "written\n" {
		t.Fatalf("the write through the read-write volume: %q %v", b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(src, "f")); string(b) != "from the host\n" {
		t.Fatalf("the :ro volume's file changed: %q", b)
	}
	out, _, _ = managoatIn(t, parent, env, "run", "-v", "src:/data:ro", "--", "sh", "-c",
		"mount -o remount,rw /data; mount -o remount,bind,rw /data; umount /data; umount -l /data; touch /data/x 2>&1; cat /data/f")
	if !strings.Contains(out, "Read-only file system") || !strings.HasSuffix(out, "from the host\n") {
		t.Fatalf("remount or unmount from inside: %q", out)
	}
	if _, err := os.Stat(filepath.Join(src, "x")); err == nil {
		t.Fatal("a write reached the :ro volume's source")
	}
}

// TestVolumeRefusals: malformed -v specs are usage errors (2); a missing
// source, a target the mechanism builds, and a provider that cannot bind
// are refused by name (125), never dropped.
func TestVolumeRefusals(t *testing.T) {
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	parent, src := volumeSource(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "-v", "a:b:c:d", "--", "true"}, exitUsage, "HOST:SANDBOX"},
		{[]string{"run", "-v", src + ":data", "--", "true"}, exitUsage, "not absolute"},
		{[]string{"run", "-v", src + ":/data:rx", "--", "true"}, exitUsage, "not ro or rw"},
		{[]string{"run", "-v", ":/data", "--", "true"}, exitUsage, "empty HOST"},
		{[]string{"create", "-v", src, "box"}, exitUsage, "HOST:SANDBOX"},
		{[]string{"--provider", "fake", "run", "-v", src + ":/data", "--", "true"}, 125, "provider fake cannot bind host paths"},
		{[]string{"--provider", "fake", "create", "-v", src + ":/data", "box"}, 125, "(not_supported)"},
	} {
		_, e, code := managoatIn(t, parent, env, tc.args...)
		if code != tc.code || !strings.Contains(e, tc.want) {
			t.Errorf("%v: exit %d stderr %q, want %d and %q", tc.args, code, e, tc.code, tc.want)
		}
	}
	testenv.RequireRoot(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-v", "missing:/data", "--", "true"}, "source " + filepath.Join(parent, "missing") + " does not exist (invalid mounts)"},
		{[]string{"run", "-v", src + ":/proc", "--", "true"}, "target /proc is in /proc"},
		{[]string{"run", "-v", src + ":/home/sprite", "--", "true"}, "would cover /home/sprite"},
	} {
		_, e, code := managoatIn(t, parent, env, tc.args...)
		if code != 125 || !strings.Contains(e, tc.want) || strings.Count(e, "\n") != 1 {
			t.Errorf("%v: exit %d stderr %q, want 125 and one line with %q", tc.args, code, e, tc.want)
		}
	}
}

// TestCreateVolume: create -v keeps the mount for every exec, and a
// create of the same name with other mounts is refused, naming them.
func TestCreateVolume(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	parent, src := volumeSource(t)
	if _, e, code := managoatIn(t, parent, env, "create", "-v", "src:/data:ro", "vol"); code != 0 {
		t.Fatalf("create -v: %s", e)
	}
	t.Cleanup(func() { managoatIn(t, parent, env, "rm", "-f", "vol") })
	if out, e, code := managoatIn(t, parent, env, "exec", "vol", "--", "cat", "/data/f"); code != 0 || out != "from the host\n" {
		t.Fatalf("exec: %q %q %d", out, e, code)
	}
	if _, e, code := managoatIn(t, parent, env, "create", "-v", src+":/data:ro", "vol"); code != 0 {
		t.Fatalf("create again with the same mount (absolute): %s", e)
	}
	_, e, code := managoatIn(t, parent, env, "create", "-v", "src:/other", "vol")
	if code != 125 || !strings.Contains(e, "already_exists") || !strings.Contains(e, "mounts ["+src+":/other] asked, the existing one has ["+src+":/data:ro]") {
		t.Fatalf("create with other mounts: exit %d %q", code, e)
	}
}

// TestEveryOtherProviderRefusesMounts: every provider but local refuses a
// Create with mounts, not_supported and by name, before any request (the
// URLs here answer nothing; a provider that went on would fail otherwise).
func TestEveryOtherProviderRefusesMounts(t *testing.T) {
	e, err := e2b.New(e2b.Config{APIKey: "k", APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daytona.New(daytona.Config{APIKey: "k", APIURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	s, err := sprites.New(sprites.Config{Token: "k", BaseURL: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	f := fake.New()
	defer f.Close()
	opts := sandbox.CreateOptions{Mounts: []sandbox.Mount{{Source: "/srv", Target: "/data", ReadOnly: true}}}
	for _, p := range []sandbox.Provider{e, d, s, runner.NewProvider(nil, runner.ProviderOptions{}), f} {
		_, err := p.Create(context.Background(), "box", opts)
		if !errors.Is(err, sandbox.ErrNotSupported) || !strings.Contains(err.Error(), "provider "+p.Name()+" cannot bind host paths") {
			t.Errorf("%s: Create with mounts = %v", p.Name(), err)
		}
	}
}
