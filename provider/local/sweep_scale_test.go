package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/sandbox"
)

// TestOpenDoesNotListSandboxes: opening the provider (every CLI command
// does) neither lists the sandboxes nor reads their records when there is
// nothing to sweep, so its cost does not grow with their number (one exec
// with 1,000 sandboxes once stat'ed every meta.json). An inotify watch on
// the sandboxes directory and on each sandbox's directory sees any open
// (a listing opens the directory); a leftover instance is still swept.
func TestOpenDoesNotListSandboxes(t *testing.T) {
	state := t.TempDir()
	p, err := New(Config{StateDir: state, MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 3 {
		h, err := p.Create(ctx, fmt.Sprint("s", i), sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Destroy(context.Background(), h) })
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(state, "sandboxes"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Nlink < 2 {
		t.Skipf("the file system of %s does not count subdirectories in a directory's links: New lists them", state)
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		testenv.Require(t, false, fmt.Sprintf("inotify_init1: %v", err))
	}
	defer unix.Close(fd)
	watch := func(dir string) {
		t.Helper()
		if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN|unix.IN_ACCESS); err != nil {
			t.Fatal(err)
		}
	}
	watch(filepath.Join(state, "sandboxes"))
	for i := range 3 {
		watch(filepath.Join(state, "sandboxes", fmt.Sprint("s", i)))
	}
	events := func() int {
		buf := make([]byte, 4096)
		n, err := unix.Read(fd, buf)
		if err == unix.EAGAIN {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// The sandboxes' supervisors open their own directories as they come
	// up (their F_NOTIFY watch), which may be after Create returned: wait
	// for a quiet 300 ms (at most 10 s) before opening the provider.
	for quietSince, deadline := time.Now(), time.Now().Add(10*time.Second); time.Since(quietSince) < 300*time.Millisecond; {
		if events() != 0 {
			quietSince = time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandboxes' directories were still being opened after 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := New(Config{StateDir: state, MechanismName: "trusted"}); err != nil {
		t.Fatal(err)
	}
	if n := events(); n != 0 {
		t.Errorf("opening the provider opened the sandboxes' directories (%d bytes of inotify events)", n)
	}
	// An instance no sandbox refers to, old enough: still found, since
	// there are now more instances than sandboxes.
	stray := filepath.Join(state, "instances", "stray")
	if err := os.Mkdir(stray, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * sweepAge)
	if err := os.Chtimes(stray, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{StateDir: state, MechanismName: "trusted"}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stray); !os.IsNotExist(err) {
		t.Errorf("a stray instance was not swept: %v", err)
	}
}
