package mountpath

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func open(t *testing.T, p string) int {
	t.Helper()
	fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	return fd
}

// Walk makes what is missing, beneath the root only, and refuses every
// symbolic link on the way: to /, climbing with .., or as the last
// component; a file where a directory is wanted, and the reverse.
func TestWalk(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	rfd := open(t, root)
	fd, err := Walk(rfd, "/a/b/c", true, true, "/a/b/c")
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Stat(filepath.Join(root, "a/b/c")); err != nil || !st.IsDir() {
		t.Fatalf("made: %v", err)
	}
	fd, err = Walk(rfd, "/a/f", false, true, "/a/f")
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)
	if st, err := os.Stat(filepath.Join(root, "a/f")); err != nil || !st.Mode().IsRegular() {
		t.Fatalf("file made: %v", err)
	}
	for name, target := range map[string]string{"toroot": "/", "up": "../../..", "out": outside, "rel": "a"} {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{name + "/x", name} {
			_, err := Walk(rfd, p, true, true, "/"+p)
			if err == nil || !strings.Contains(err.Error(), "/"+name+" is a symbolic link") {
				t.Errorf("walk %s through a link to %s: %v", p, target, err)
			}
		}
	}
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("made outside the root: %v", ents)
	}
	if _, err := Walk(rfd, "a/f", true, false, "/a/f"); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a file for a directory: %v", err)
	}
	if _, err := Walk(rfd, "a/b", false, false, "/a/b"); err == nil || !strings.Contains(err.Error(), "the source a file") {
		t.Errorf("a directory for a file: %v", err)
	}
	if _, err := Walk(rfd, "a/missing", true, false, "/a/missing"); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing without mk: %v", err)
	}
}

// OpenSource refuses a path with a symbolic link anywhere on it.
func TestOpenSource(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := OpenSource(real)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := IsDir(fd); err != nil || !d {
		t.Errorf("IsDir = %v %v", d, err)
	}
	unix.Close(fd)
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "link"), filepath.Join(dir, "link", ".")} {
		if _, err := OpenSource(p); err == nil || !strings.Contains(err.Error(), "symbolic link") {
			t.Errorf("OpenSource(%s) = %v", p, err)
		}
	}
}

// RealDir never writes through what an image left on the path: a symbolic
// link to a host directory and a file are replaced by real directories
// beneath the root, and the host directory stays untouched.
func TestRealDirReplacesLinksAndFiles(t *testing.T) {
	root, host := t.TempDir(), t.TempDir()
	if err := os.Symlink(host, filepath.Join(root, "etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "run"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/etc/ssl", "/run", "/home/sprite"} {
		if err := RealDir(root, p, 0o750, -1); err != nil {
			t.Fatalf("RealDir(%s): %v", p, err)
		}
		st, err := os.Lstat(filepath.Join(root, p))
		if err != nil || !st.IsDir() || st.Mode().Perm() != 0o750 {
			t.Errorf("%s: %v %v, want a real directory of mode 0750", p, st, err)
		}
	}
	if st, err := os.Lstat(filepath.Join(root, "etc")); err != nil || st.Mode()&os.ModeSymlink != 0 {
		t.Errorf("etc is still a link: %v %v", st, err)
	}
	if es, _ := os.ReadDir(host); len(es) != 0 {
		t.Errorf("the link's target on the host got %v", es)
	}
}
