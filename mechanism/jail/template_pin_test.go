package jail

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// nsfsUnder lists the nsfs mounts whose mount point is under dir in the
// given mountinfo text.
func nsfsUnder(mountinfo, dir string) []string {
	var out []string
	for _, line := range strings.Split(mountinfo, "\n") {
		f := strings.Fields(line)
		if len(f) > 8 && strings.HasPrefix(f[4], dir+"/") && strings.Contains(line, " - nsfs ") {
			out = append(out, f[4])
		}
	}
	return out
}

func pinnedJail(t *testing.T, dir string) *Jail {
	t.Helper()
	j, err := New(Config{StateDir: t.TempDir(), TemplateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// Sandboxes cloned from an adopted template are each their own and can
// change nothing they share: not the root, /etc, /dev, /usr, not their
// mounts; what one writes to its home the other does not see; nothing a
// clone mounts reaches the pinned namespace. Processes pinning at the
// same time leave one pin, and unpinning leaves no nsfs mount.
func TestPinnedTemplateIsolation(t *testing.T) {
	dir := pinDir(t, func(dir string) {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		if left := nsfsUnder(string(b), dir); len(left) > 0 {
			t.Errorf("nsfs mounts left after UnpinTemplates: %v", left)
		}
	})
	// Four "processes" whose first starts race to pin.
	var wg sync.WaitGroup
	jails := make([]*Jail, 4)
	for i := range jails {
		jails[i] = pinnedJail(t, dir)
	}
	errs := make([]error, len(jails))
	for i, j := range jails {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("race%d", i)
			if err := j.Provision(context.Background(), id, mechanism.Spec{}); err != nil {
				errs[i] = err
				return
			}
			errs[i] = j.Start(context.Background(), id)
		}()
	}
	wg.Wait()
	for i, j := range jails {
		id := fmt.Sprintf("race%d", i)
		t.Cleanup(func() { _ = j.Destroy(context.Background(), id) })
		if errs[i] != nil {
			t.Fatalf("%s: %v", id, errs[i])
		}
		if got := sh(t, j, id, "hostname"); got != id {
			t.Fatalf("%s: hostname %q", id, got)
		}
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if pins := nsfsUnder(string(b), dir); len(pins) != 1 {
		t.Fatalf("after racing pinners: %d nsfs mounts under the template directory: %v", len(pins), pins)
	}

	// A later process adopts; two sandboxes from it.
	j := pinnedJail(t, dir)
	startIn(t, j, "x")
	if !j.tmpl.adopted {
		t.Fatal("not adopted")
	}
	startIn(t, j, "y")
	script := `for p in /f /etc/f /dev/f /usr/f /run/f /etc/passwd; do (echo no > $p) 2>/dev/null && echo wrote $p; done
mount -o remount,rw / 2>/dev/null && echo remounted
mount -t tmpfs none /mnt 2>/dev/null && echo mounted
echo mine > ~/f; hostname`
	if got := sh(t, j, "x", script); got != "x" {
		t.Fatalf("x: %q", got)
	}
	if got := sh(t, j, "y", "cat ~/f 2>/dev/null; cat /etc/hostname"); got != "y" {
		t.Fatalf("y sees %q", got)
	}
	// The pinned namespace holds the template alone: no clone's home,
	// /run or /etc binds propagated into it.
	ns, _, ok := j.tmpl.get()
	if !ok {
		t.Fatal("no template")
	}
	defer unix.Close(ns)
	mi := nsMountinfo(ns)
	if !strings.Contains(mi, " /usr ") {
		t.Fatalf("cannot read the template's mounts: %q", mi)
	}
	for _, bad := range []string{mechanism.Home + " ", "/etc/hostname ", "/etc/hosts "} {
		if strings.Contains(mi, " "+bad) {
			t.Fatalf("a clone's mount %q reached the pinned template:\n%s", bad, mi)
		}
	}
}

// A TemplateDir on a shared mount with a peer: binding a namespace file
// there fails (EINVAL, it would propagate), and pin falls back to a
// private bind of the directory. The pin works, nothing reaches the
// peer, a second pin does not stack another bind, and UnpinTemplates
// leaves no mount. Pinned from this process's mount namespace, as
// provider/local does (the kernel refuses to bind the file of a
// namespace into one it does not hold newer: pinning from a private
// namespace of the test's own would test that instead); the shared
// mount and its peer are the test's, under its temporary directory.
func TestPinSharedFallback(t *testing.T) {
	testenv.RequireRoot(t)
	if err := pinSharedFallback(t, t.TempDir()); err != nil {
		t.Fatal(err)
	}
}

func pinSharedFallback(t *testing.T, base string) error {
	run, peer := filepath.Join(base, "run"), filepath.Join(base, "peer")
	for _, d := range []string{run, peer} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return err
		}
	}
	if err := unix.Mount("tmpfs", run, "tmpfs", 0, "size=64k"); err != nil {
		return err
	}
	t.Cleanup(func() { _ = unix.Unmount(run, unix.MNT_DETACH) })
	if err := unix.Mount("", run, "", unix.MS_SHARED, ""); err != nil {
		return err
	}
	if err := unix.Mount(run, peer, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	t.Cleanup(func() { _ = unix.Unmount(peer, unix.MNT_DETACH) })
	// A mount namespace newer than this one (a template's stand-in),
	// with its thread in it until the pins are done.
	nsc, held := make(chan int), make(chan struct{})
	defer close(held)
	go onDiscardedThread(func() {
		if unix.Unshare(unix.CLONE_NEWNS|unix.CLONE_FS) != nil {
			nsc <- -1
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			fd = -1
		}
		nsc <- fd
		<-held
	})
	ns := <-nsc
	if ns < 0 {
		return fmt.Errorf("no namespace to pin")
	}
	defer unix.Close(ns)
	dir := filepath.Join(run, "tmpl")
	tm := &treeTemplate{dir: dir}
	mounts := func() string {
		b, _ := os.ReadFile("/proc/self/mountinfo")
		return string(b)
	}
	atDir := func() int {
		n := 0
		for _, line := range strings.Split(mounts(), "\n") {
			if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
				n++
			}
		}
		return n
	}
	for i := range 2 {
		if err := tm.pin(ns, "key", thisExe(), map[string]fileID{}); err != nil {
			return fmt.Errorf("pin %d: %w", i, err)
		}
		if got := nsfsUnder(mounts(), dir); len(got) != 1 {
			return fmt.Errorf("pin %d: nsfs mounts under the directory: %v", i, got)
		}
		if got := nsfsUnder(mounts(), peer); len(got) != 0 {
			return fmt.Errorf("pin %d reached the peer: %v", i, got)
		}
		if n := atDir(); n != 1 {
			return fmt.Errorf("pin %d: %d mounts on the directory, want its one private bind", i, n)
		}
	}
	if err := UnpinTemplates(dir); err != nil {
		return err
	}
	if got := nsfsUnder(mounts(), run); len(got) != 0 || atDir() != 0 {
		return fmt.Errorf("after UnpinTemplates: nsfs %v, %d mounts on the directory", got, atDir())
	}
	return nil
}
