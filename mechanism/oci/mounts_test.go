package oci_test

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
	"github.com/managoat/managoat/mechanism/oci"
)

// mountSources: rw/ (the workload's) with hello and links pointing out of
// it, ro/ with a file, one.txt, and secret.txt beside them.
func mountSources(t *testing.T, m *oci.Mechanism) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"rw", "ro"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, s := range map[string]string{"rw/hello": "hello from the host\n", "ro/kept": "read only\n", "one.txt": "one file\n", "secret.txt": "HOST-SECRET\n"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	uid, gid := m.Owner()
	if err := os.Chown(filepath.Join(dir, "rw"), uid, gid); err != nil {
		t.Fatal(err)
	}
	// Everything read-only is writable by anyone on the host: a write
	// refused is refused by the read-only mount, not by the file's mode.
	for _, p := range []string{"ro", "ro/kept", "one.txt"} {
		if err := os.Chmod(filepath.Join(dir, p), 0o777); err != nil {
			t.Fatal(err)
		}
	}
	for name, target := range map[string]string{"up": "../secret.txt", "abs": filepath.Join(dir, "secret.txt")} {
		if err := os.Symlink(target, filepath.Join(dir, "rw", name)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func sh(t *testing.T, m *oci.Mechanism, id, script string) mechanism.Completion {
	t.Helper()
	c, err := m.Execute(context.Background(), id, []string{"/bin/sh", "-c", script}, mechanism.ExecOptions{})
	if err != nil {
		t.Fatalf("%s: %v", script, err)
	}
	return c
}

// TestMounts: the bundle's bind mounts on runc and runsc: read-write and
// read-only ones, a file, a mount point made in the rootfs skeleton; a
// read-only one refuses writes (EROFS) and stays so whatever the
// workload tries; a link in a source resolves inside the container.
func TestMounts(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			state := t.TempDir()
			m := newMech(t, rt, state)
			dir := mountSources(t, m)
			id := tid("mounts")
			started(t, m, id, mechanism.Spec{Mounts: []mechanism.Mount{
				{Source: filepath.Join(dir, "rw"), Target: "/data"},
				{Source: filepath.Join(dir, "ro"), Target: mechanism.Home + "/src", ReadOnly: true},
				{Source: filepath.Join(dir, "one.txt"), Target: "/tmp/in/one.txt", ReadOnly: true},
				{Source: filepath.Join(dir, "rw"), Target: "/var/lib/deep/rw2"},
			}})
			c := sh(t, m, id, "cat /data/hello /tmp/in/one.txt "+mechanism.Home+"/src/kept && echo written > /data/new && echo again > /var/lib/deep/rw2/new2")
			if c.ExitStatus != 0 || string(c.Stdout) != "hello from the host\none file\nread only\n" {
				t.Fatalf("reading the mounts: exit %d, %q %q", c.ExitStatus, c.Stdout, c.Stderr)
			}
			for name, want := range map[string]string{"new": "written\n", "new2": "again\n"} {
				if b, err := os.ReadFile(filepath.Join(dir, "rw", name)); err != nil || string(b) != want {
					t.Errorf("the write through the read-write mount is not on the host: %q %v", b, err)
				}
			}
			for _, script := range []string{
				"echo x > " + mechanism.Home + "/src/kept",
				"touch " + mechanism.Home + "/src/newfile",
				"echo x > /tmp/in/one.txt",
			} {
				c := sh(t, m, id, script)
				if c.ExitStatus == 0 || !strings.Contains(string(c.Stderr), "Read-only file system") {
					t.Errorf("%s on a read-only mount: exit %d, stderr %q (want EROFS)", script, c.ExitStatus, c.Stderr)
				}
			}
			c = sh(t, m, id, "mount -o remount,rw "+mechanism.Home+"/src; mount -o remount,bind,rw "+mechanism.Home+"/src; umount "+mechanism.Home+"/src; umount -l /data; echo x > "+mechanism.Home+"/src/kept; cat /data/hello")
			if string(c.Stdout) != "hello from the host\n" || !strings.Contains(string(c.Stderr), "Read-only file system") {
				t.Errorf("remount/umount from inside changed something: %q %q", c.Stdout, c.Stderr)
			}
			if b, _ := os.ReadFile(filepath.Join(dir, "ro", "kept")); string(b) != "read only\n" {
				t.Errorf("the read-only source changed: %q", b)
			}
			// Links in the source that point out of it resolve inside the
			// container: neither reaches the host's file beside the source.
			c = sh(t, m, id, "readlink /data/up /data/abs; cat /data/up /data/abs")
			if strings.Contains(string(c.Stdout), "HOST-SECRET") {
				t.Fatalf("a link in the mount read the host's file outside it: %q", c.Stdout)
			}
			if want := "../secret.txt\n" + filepath.Join(dir, "secret.txt") + "\n"; string(c.Stdout) != want {
				t.Errorf("links: %q, want %q", c.Stdout, want)
			}
			// The mount point was made in a skeleton of its own: the
			// shared one has no /var/lib/deep.
			shared, _ := filepath.Glob(filepath.Join(state, "*", "rootfs-*"))
			if len(shared) == 0 {
				shared, _ = filepath.Glob(filepath.Join(state, "rootfs-*"))
			}
			for _, s := range shared {
				_, err := os.Stat(filepath.Join(s, "var", "lib", "deep"))
				if withPoints := strings.Contains(filepath.Base(s), "-m"); (err == nil) != withPoints {
					t.Errorf("skeleton %s: mount point there %v", s, err == nil)
				}
			}
		})
	}
}

// A link to / the workload leaves on a target's path in its home before
// a restart: the runtime would resolve it inside the container's root and
// mount over it; the mechanism refuses the start instead.
func TestMountTargetSymlinkRefused(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			m := newMech(t, rt, t.TempDir())
			dir := mountSources(t, m)
			id := tid("mlink")
			name := "mgx-escape-" + strconv.Itoa(os.Getpid())
			started(t, m, id, mechanism.Spec{Mounts: []mechanism.Mount{{Source: filepath.Join(dir, "rw"), Target: mechanism.Home + "/sub/" + name}}})
			if c := sh(t, m, id, "cd "+mechanism.Home+" && mv sub old && ln -s / sub"); c.ExitStatus != 0 {
				t.Fatalf("workload: %s", c.Stderr)
			}
			ctx := context.Background()
			if err := m.Stop(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := m.Start(ctx, id); err == nil || !strings.Contains(err.Error(), "symbolic link") {
				t.Fatalf("start through a link: %v, want refused naming the link", err)
			}
			if _, err := os.Lstat("/" + name); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the host's /%s exists: %v", name, err)
			}
		})
	}
}

func TestMountRefusals(t *testing.T) {
	testenvRoot(t)
	m := newMech(t, "runc", t.TempDir())
	dir := t.TempDir()
	for _, mt := range []mechanism.Mount{{Source: dir, Target: "/proc"}, {Source: dir, Target: mechanism.Home}, {Source: filepath.Join(dir, "missing"), Target: "/data"}} {
		if err := m.Provision(context.Background(), tid("refused"), mechanism.Spec{Mounts: []mechanism.Mount{mt}}); !errors.Is(err, mechanism.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", mt, err)
		}
	}
}

// A read-only mount is read-only all the way down: a file system mounted
// inside the source on the host is read-only in the container too.
func TestMountReadOnlyRecursive(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			m := newMech(t, rt, t.TempDir())
			src := submounted(t)
			id := tid("rro")
			started(t, m, id, mechanism.Spec{Mounts: []mechanism.Mount{{Source: src, Target: "/data", ReadOnly: true}}})
			c := sh(t, m, id, "cat /data/sub/f; echo x > /data/sub/f; touch /data/sub/new")
			if string(c.Stdout) != "in the submount\n" || strings.Count(string(c.Stderr), "Read-only file system") != 2 {
				t.Fatalf("a submount of a read-only mount: %q %q", c.Stdout, c.Stderr)
			}
		})
	}
}

// submounted is a source directory with a tmpfs mounted at sub/ (mode
// 1777, a file in it open to all), unmounted at cleanup.
func submounted(t *testing.T) string {
	t.Helper()
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
	return src
}
