package jail_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/jail"
)

// mountSources makes a host directory tree for mounts: rw/ (owned by the
// workload) with hello and links pointing out of it, ro/ with a file, a
// file one.txt, and secret.txt beside them that no mount includes.
func mountSources(t *testing.T, j *jail.Jail) (dir string) {
	t.Helper()
	dir = t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	uid, gid := j.Owner()
	for _, d := range []string{"rw", "ro"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(p, s string) {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rw/hello", "hello from the host\n")
	write("ro/kept", "read only\n")
	write("one.txt", "one file\n")
	write("secret.txt", "HOST-SECRET\n")
	if err := os.Chown(filepath.Join(dir, "rw"), uid, gid); err != nil {
		t.Fatal(err)
	}
	// Everything read-only is writable by anyone on the host: a write
	// refused is refused by the read-only mount, not by the file's mode.
	for _, p := range []string{"ro", "ro/kept", "one.txt", "rw"} { // rw too: whatever uid the workload is mapped to
		if err := os.Chmod(filepath.Join(dir, p), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	// Links inside the source that point out of it, relative and absolute.
	for name, target := range map[string]string{"up": "../secret.txt", "abs": filepath.Join(dir, "secret.txt"), "etc": "/etc"} {
		if err := os.Symlink(target, filepath.Join(dir, "rw", name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestMounts(t *testing.T) {
	j := newJail(t)
	dir := mountSources(t, j)
	spec := mechanism.Spec{Mounts: []mechanism.Mount{
		{Source: filepath.Join(dir, "rw"), Target: "/data"},
		{Source: filepath.Join(dir, "ro"), Target: mechanism.Home + "/src", ReadOnly: true},
		{Source: filepath.Join(dir, "one.txt"), Target: "/tmp/in/one.txt", ReadOnly: true},
		{Source: filepath.Join(dir, "rw"), Target: "/var/lib/deep/rw2"},
	}}
	started(t, j, "mounts", spec)

	c := run(t, j, "mounts", "cat /data/hello /tmp/in/one.txt "+mechanism.Home+"/src/kept && echo written > /data/new && echo again > /var/lib/deep/rw2/new2")
	if c.ExitStatus != 0 || string(c.Stdout) != "hello from the host\none file\nread only\n" {
		t.Fatalf("reading the mounts: exit %d, %q %q", c.ExitStatus, c.Stdout, c.Stderr)
	}
	for name, want := range map[string]string{"new": "written\n", "new2": "again\n"} {
		if b, err := os.ReadFile(filepath.Join(dir, "rw", name)); err != nil || string(b) != want {
			t.Errorf("the workload's write to the read-write mount is not on the host: %q %v", b, err)
		}
	}

	// Read-only: every write is EROFS, and the workload can neither
	// remount it read-write nor unmount anything.
	for _, script := range []string{
		"echo x > " + mechanism.Home + "/src/kept",
		"touch " + mechanism.Home + "/src/newfile",
		"echo x > /tmp/in/one.txt",
		"mkdir " + mechanism.Home + "/src/d",
	} {
		c := run(t, j, "mounts", script)
		if c.ExitStatus == 0 || !strings.Contains(string(c.Stderr), "Read-only file system") {
			t.Errorf("%s on a read-only mount: exit %d, stderr %q (want EROFS)", script, c.ExitStatus, c.Stderr)
		}
	}
	c = run(t, j, "mounts", "mount -o remount,rw "+mechanism.Home+"/src; mount -o remount,bind,rw "+mechanism.Home+"/src; umount "+mechanism.Home+"/src; umount -l /data; umount /tmp/in/one.txt; echo x > "+mechanism.Home+"/src/kept; cat /data/hello")
	if string(c.Stdout) != "hello from the host\n" || !strings.Contains(string(c.Stderr), "Read-only file system") {
		t.Errorf("remount/umount from inside changed something: %q %q", c.Stdout, c.Stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "ro", "kept")); string(b) != "read only\n" {
		t.Errorf("the read-only source changed: %q", b)
	}
	c = run(t, j, "mounts", "grep -E ' (/data|"+mechanism.Home+"/src|/tmp/in/one.txt) ' /proc/self/mountinfo")
	lines := strings.Split(strings.TrimSpace(string(c.Stdout)), "\n")
	if len(lines) != 3 {
		t.Fatalf("mountinfo: %q", c.Stdout)
	}
	for _, l := range lines {
		f := strings.Fields(l)
		opts := f[5]
		if !strings.Contains(opts, "nosuid") || !strings.Contains(opts, "nodev") {
			t.Errorf("mount without nosuid,nodev: %s", l)
		}
		ro := strings.HasPrefix(opts, "ro")
		if want := f[4] != "/data"; ro != want {
			t.Errorf("mount %s read-only %v, want %v: %s", f[4], ro, want, l)
		}
	}

	// A link in the source that points out of it is a link inside the
	// sandbox: resolved there, it never reaches the host's file beside
	// the source.
	c = run(t, j, "mounts", "readlink /data/up /data/abs /data/etc; cat /data/up /data/abs; cat /data/etc/hostname")
	if strings.Contains(string(c.Stdout), "HOST-SECRET") {
		t.Fatalf("a link in the mount read the host's file outside it: %q", c.Stdout)
	}
	want := "../secret.txt\n" + filepath.Join(dir, "secret.txt") + "\n/etc\nmounts\n"
	if string(c.Stdout) != want {
		t.Errorf("links: stdout %q, want %q (the sandbox's own /etc/hostname)", c.Stdout, want)
	}
}

// A symbolic link the workload leaves on a target's path (its home is
// its own) before a restart: the start is refused, and nothing is
// mounted or made where the link points.
func TestMountTargetSymlinkRefused(t *testing.T) {
	j := newJail(t)
	dir := mountSources(t, j)
	name := "mgx-escape-" + strconv.Itoa(os.Getpid())
	target := mechanism.Home + "/sub/" + name
	started(t, j, "symlink", mechanism.Spec{Mounts: []mechanism.Mount{{Source: filepath.Join(dir, "rw"), Target: target}}})
	// The workload moves the mount's parent away (the mount goes with it)
	// and puts a link to / in its place.
	c := run(t, j, "symlink", "cd "+mechanism.Home+" && mv sub old && ln -s / sub && ls -ld sub")
	if c.ExitStatus != 0 {
		t.Fatalf("workload: %s", c.Stderr)
	}
	ctx := context.Background()
	if err := j.Stop(ctx, "symlink"); err != nil {
		t.Fatal(err)
	}
	err := j.Start(ctx, "symlink")
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("start through a link: %v, want refused naming the link", err)
	}
	if _, err := os.Lstat("/" + name); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the host's /%s exists: %v", name, err)
	}
	// The same with a relative link climbing out.
	home, err := j.HostPath("symlink", mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(home, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../../../..", filepath.Join(home, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "symlink"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("start through a relative link: %v", err)
	}
	// Removed, the sandbox starts again with its mount.
	if err := os.Remove(filepath.Join(home, "sub")); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "symlink"); err != nil {
		t.Fatal(err)
	}
	if c := run(t, j, "symlink", "cat "+target+"/hello"); string(c.Stdout) != "hello from the host\n" {
		t.Fatalf("after the link went: %q %q", c.Stdout, c.Stderr)
	}
}

// A source swapped for a symbolic link after the sandbox was made is
// refused at start, never followed.
func TestMountSourceSwapRefused(t *testing.T) {
	j := newJail(t)
	dir := mountSources(t, j)
	src := filepath.Join(dir, "rw")
	ctx := context.Background()
	if err := j.Provision(ctx, "swap", mechanism.Spec{Mounts: []mechanism.Mount{{Source: src, Target: "/data"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), "swap") })
	if err := os.Rename(src, src+".moved"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/etc", src); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "swap"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("start with the source swapped for a link: %v", err)
	}
}

func TestMountRefusals(t *testing.T) {
	j := newJail(t)
	dir := mountSources(t, j)
	ctx := context.Background()
	for _, m := range []mechanism.Mount{
		{Source: dir, Target: "/proc"},
		{Source: dir, Target: "/proc/sys"},
		{Source: dir, Target: mechanism.Home},
		{Source: dir, Target: "/"},
		{Source: filepath.Join(dir, "missing"), Target: "/data"},
		{Source: "relative", Target: "/data"},
	} {
		err := j.Provision(ctx, "refused", mechanism.Spec{Mounts: []mechanism.Mount{m}})
		if !errors.Is(err, mechanism.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", m, err)
		}
	}
	// A target whose directory is a read-only bind of the host, and that
	// is not there: the start says so.
	if err := j.Provision(ctx, "ro-parent", mechanism.Spec{Mounts: []mechanism.Mount{{Source: dir, Target: "/usr/mgx-not-there/x"}}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), "ro-parent") })
	if err := j.Start(ctx, "ro-parent"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("start with a target under /usr that does not exist: %v", err)
	}
	if _, err := os.Stat("/usr/mgx-not-there"); err == nil {
		t.Fatal("the host's /usr was written")
	}
}

// TestRootlessMounts: a jail run by a user that is not root (its
// sandboxes in user namespaces, run here as uid 65534) binds mounts too:
// read-write ones writable (Landlock's rule from the pivoted root),
// read-only ones EROFS, no remount from inside, and a link on a target's
// path refuses the restart.
func TestRootlessMounts(t *testing.T) {
	if egresstest.Unprivileged(t, "") == nil {
		return // the run as uid 65534 is done, and passed
	}
	j, err := jail.New(jail.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	dir := mountSources(t, j)
	spec := mechanism.Spec{Network: mechanism.NetworkNone, Mounts: []mechanism.Mount{
		{Source: filepath.Join(dir, "rw"), Target: "/data"},
		{Source: filepath.Join(dir, "ro"), Target: mechanism.Home + "/sub/ro", ReadOnly: true},
	}}
	started(t, j, "rootless", spec)
	c := run(t, j, "rootless", "cat /data/hello; echo w > /data/w; echo x > "+mechanism.Home+"/sub/ro/kept; mount -o remount,bind,rw "+mechanism.Home+"/sub/ro; echo y > "+mechanism.Home+"/sub/ro/kept")
	if string(c.Stdout) != "hello from the host\n" || strings.Count(string(c.Stderr), "Read-only file system") != 2 {
		t.Fatalf("rootless mounts: %q %q", c.Stdout, c.Stderr)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "rw", "w")); err != nil || string(b) != "w\n" {
		t.Fatalf("the write through the read-write mount: %q %v", b, err)
	}
	// A set-user-ID copy of sh in the read-write mount would run on the
	// host as the caller: refused (policy.JailMounts).
	c = run(t, j, "rootless", "cp /bin/sh /data/sh && chmod 4755 /data/sh")
	if c.ExitStatus == 0 || !strings.Contains(string(c.Stderr), "Operation not permitted") {
		t.Errorf("chmod 4755 in a rootless read-write mount: exit %d %q", c.ExitStatus, c.Stderr)
	}
	if fi, err := os.Stat(filepath.Join(dir, "rw", "sh")); err != nil || fi.Mode()&(os.ModeSetuid|os.ModeSetgid) != 0 {
		t.Errorf("the copy of sh on the host: %v, %v", fi.Mode(), err)
	}
	if c := run(t, j, "rootless", "cd "+mechanism.Home+" && mv sub old && ln -s / sub"); c.ExitStatus != 0 {
		t.Fatalf("workload: %s", c.Stderr)
	}
	ctx := context.Background()
	if err := j.Stop(ctx, "rootless"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "rootless"); err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Fatalf("rootless start through a link: %v", err)
	}
}

// A read-only mount is read-only all the way down: a file system mounted
// inside the source on the host is read-only in the sandbox too.
func TestMountReadOnlyRecursive(t *testing.T) {
	j := newJail(t)
	src := t.TempDir()
	if err := os.Chmod(src, 0o755); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(src, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", sub, "tmpfs", 0, "mode=1777,size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(sub, unix.MNT_DETACH) })
	if err := os.WriteFile(filepath.Join(sub, "f"), []byte("in the submount\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(sub, "f"), 0o666); err != nil {
		t.Fatal(err)
	}
	started(t, j, "rro", mechanism.Spec{Mounts: []mechanism.Mount{{Source: src, Target: "/data", ReadOnly: true}}})
	c := run(t, j, "rro", "cat /data/sub/f; echo x > /data/sub/f; touch /data/sub/new")
	if string(c.Stdout) != "in the submount\n" || strings.Count(string(c.Stderr), "Read-only file system") != 2 {
		t.Fatalf("a submount of a read-only mount: %q %q", c.Stdout, c.Stderr)
	}
}
