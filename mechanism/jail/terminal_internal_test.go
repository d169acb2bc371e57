package jail

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
)

// What a sandbox's root may hold at dev/pts/ptmx: only a devpts ptmx is
// opened; a symbolic link to the host's, a file, a FIFO (which would
// hold a blocking open) and a character device of the host's devtmpfs
// are refused.
func TestOpenPtmxRefusesAnythingElse(t *testing.T) {
	testenv.RequireRoot(t)
	try := func(name string, place func(path string) error) error {
		t.Helper()
		root := t.TempDir()
		pts := filepath.Join(root, "dev", "pts")
		if err := os.MkdirAll(pts, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := place(filepath.Join(pts, "ptmx")); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		m, err := openPtmx(fd)
		if err == nil {
			unix.Close(m)
		}
		return err
	}
	for name, place := range map[string]func(string) error{
		"symlink to the host's ptmx": func(p string) error { return os.Symlink("/dev/ptmx", p) },
		"regular file":               func(p string) error { return os.WriteFile(p, nil, 0o666) },
		"fifo":                       func(p string) error { return unix.Mkfifo(p, 0o666) },
		"the host's ptmx device":     func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(5, 2))) },
	} {
		if err := try(name, place); err == nil {
			t.Errorf("%s at dev/pts/ptmx was opened", name)
		}
	}
	// A devpts of its own is accepted, and is a terminal.
	err := try("devpts", func(p string) error {
		pts := filepath.Dir(p)
		if err := unix.Mount("devpts", pts, "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666"); err != nil {
			return err
		}
		t.Cleanup(func() { _ = unix.Unmount(pts, unix.MNT_DETACH) })
		return nil
	})
	if err != nil {
		t.Fatalf("a devpts ptmx: %v", err)
	}
}
