package cgroups

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"golang.org/x/sys/unix"
)

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		"/sys/fs/cgroup":          "/sys/fs/cgroup",
		`/mnt/a\040b`:             "/mnt/a b",
		`/x\011y\012z\134w`:       "/x\ty\nz\\w",
		`/end\040`:                "/end ",
		`/short\04`:               `/short\04`,
		`/not\999octal`:           `/not\999octal`,
		`\134\134`:                `\\`,
		`/trailing\`:              `/trailing\`,
		`/mixed\040and\134\040ok`: `/mixed and\ ok`,
	} {
		if got := unescape(in); got != want {
			t.Errorf("unescape(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestStandardLayoutMatchesMountinfo: where the hierarchies are at their
// conventional mount points, both ways of finding them agree.
func TestStandardLayoutMatchesMountinfo(t *testing.T) {
	cg, err := os.ReadFile("/proc/self/cgroup")
	testenv.Require(t, err == nil, fmt.Sprintf("no /proc/self/cgroup: %v", err))
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	own := ownCgroups(cg)
	std, ok := standardLayout(stdRoot, own, wanted)
	testenv.Require(t, ok, "this host's cgroup hierarchies are not at their conventional mount points")
	if got := mountinfoLayout(mi, own, wanted); !reflect.DeepEqual(std, got) {
		t.Fatalf("standard %+v, mountinfo %+v", std, got)
	}
	// A hierarchy somewhere else sends the caller to mountinfo.
	if _, ok := standardLayout(t.TempDir(), own, wanted); ok && len(own) > 0 {
		t.Fatal("found hierarchies under an empty directory")
	}
}

// TestStandardLayoutRefusesSubtrees: a hierarchy's subtree bind-mounted
// at a conventional mount point (as in a container without a cgroup
// namespace) is not taken for the hierarchy, even where a cgroup of the
// process's own path exists inside it: detection falls back to mountinfo.
func TestStandardLayoutRefusesSubtrees(t *testing.T) {
	testenv.RequireRoot(t)
	cg, err := os.ReadFile("/proc/self/cgroup")
	testenv.Require(t, err == nil, fmt.Sprintf("no /proc/self/cgroup: %v", err))
	own := ownCgroups(cg)
	real, ok := standardLayout(stdRoot, own, wanted)
	testenv.Require(t, ok, "this host's cgroup hierarchies are not at their conventional mount points")
	// A subtree of each hierarchy, holding a cgroup of the process's own
	// path (the trap), bind-mounted where its hierarchy would be.
	root := t.TempDir()
	type bind struct{ src, dst string }
	var binds []bind
	trap := func(dir, at, p string) {
		sub := filepath.Join(dir, "managoat-test-subtree-"+strconv.Itoa(os.Getpid()))
		if err := os.MkdirAll(filepath.Join(sub, p), 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			for d := filepath.Join(sub, p); len(d) >= len(sub); d = filepath.Dir(d) {
				os.Remove(d)
			}
		})
		if err := os.MkdirAll(filepath.Join(root, at), 0o755); err != nil {
			t.Fatal(err)
		}
		binds = append(binds, bind{sub, filepath.Join(root, at)})
	}
	if real.V2 != "" {
		trap(strings.TrimSuffix(real.V2, own[""]), "unified", own[""])
	}
	for c, d := range real.V1 {
		trap(strings.TrimSuffix(d, own[c]), c, own[c])
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with its mount namespace
		err := unix.Unshare(unix.CLONE_NEWNS)
		if err == nil {
			err = unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, "")
		}
		for _, b := range binds {
			if err == nil {
				err = unix.Mount(b.src, b.dst, "", unix.MS_BIND, "")
			}
		}
		if err == nil {
			if l, ok := standardLayout(root, own, wanted); ok {
				err = fmt.Errorf("subtrees taken for hierarchies: %+v", l)
			}
		}
		done <- err
	}()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
