package diskquota

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// seedHome puts a caller's files in home: a file, a directory with two
// files of an owner and mode of their own, and a symbolic link.
func seedHome(t *testing.T, home string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Join(home, "d"), 0o750); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"notes": "the caller's", "d/x": "x", "d/y": "y"} {
		if err := os.WriteFile(filepath.Join(home, name), []byte(body), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(filepath.Join(home, "d", "y"), 1000, 1001); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("d/x", filepath.Join(home, "link")); err != nil {
		t.Fatal(err)
	}
}

// checkSeeded fails unless home holds what seedHome put there, not
// mounted, and the image is gone with its loop device.
func checkSeeded(t *testing.T, home, image string) {
	t.Helper()
	if mountedAt(t, home) || mountedAt(t, image+".recover") {
		t.Fatal("still mounted after Recover")
	}
	for name, body := range map[string]string{"notes": "the caller's", "d/x": "x", "d/y": "y", "link": "x"} {
		if b, err := os.ReadFile(filepath.Join(home, name)); err != nil || string(b) != body {
			t.Errorf("%s after Recover: %q, %v; want %q", name, b, err, body)
		}
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(home, "d", "y"), &st); err != nil || st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o777 != 0o640 {
		t.Errorf("d/y: owner %d:%d mode %o (%v), want 1000:1001 640", st.Uid, st.Gid, st.Mode&0o777, err)
	}
	if ents, _ := os.ReadDir(home); len(ents) != 3 {
		t.Errorf("the home holds %d entries, want 3 (no temporary left)", len(ents))
	}
	if _, err := os.Lstat(image); !os.IsNotExist(err) {
		t.Errorf("the image is left: %v", err)
	}
	if _, err := os.Lstat(image + ".recover"); !os.IsNotExist(err) {
		t.Errorf("the recovery's mount point is left: %v", err)
	}
	if l := loopsOf(t, image); len(l) > 0 {
		t.Errorf("loop devices left on %s: %v", image, l)
	}
}

// A quota applied and never recorded (its caller failed or died after
// Apply): Release would remove the home's files with the image; Recover
// puts them back under the home.
func TestRecoverMountedHome(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	if _, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = (&Quota{Method: Loop, Image: image}).Release(home) })
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
	// Nothing left to recover: nil, nothing done.
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatalf("a second Recover: %v", err)
	}
	checkSeeded(t, home, image)
}

// After a reboot the image is no longer mounted on the home, and holds
// its files all the same.
func TestRecoverUnmountedImage(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	if _, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = (&Quota{Method: Loop, Image: image}).Release(home) })
	if err := unmountAll(home, image); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(home); len(ents) != 0 {
		t.Fatalf("under the mount point: %v, want nothing (moved into the image)", ents)
	}
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
}

// An Apply cut short while it removed the home's files from under the
// mount point: the image has complete copies of all, the home some
// originals. And one cut short in its copy: the image's copy of "notes"
// is partial, the home's is whole. What is under the home is kept, what
// it lost comes back, the partial copy does not.
func TestRecoverMidMove(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	mnt := filepath.Join(dir, "fill")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := makeFS(context.Background(), image, 4<<20, 0, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unmountAll(mnt, image)
		_ = (&Quota{Method: Loop, Image: image}).Release(home)
	})
	if err := attachAndMount(image, mnt); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", "--", home+"/.", mnt+"/").CombinedOutput(); err != nil {
		t.Fatalf("cp: %v: %s", err, out)
	}
	if err := os.WriteFile(filepath.Join(mnt, "notes"), []byte("the cal"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := unmountAll(mnt, image); err != nil {
		t.Fatal(err)
	}
	// (lost+found is left in the image: an Apply cut short before it
	// removed it.) Removed from under: link, and d/y of d.
	for _, p := range []string{"link", "d/y"} {
		if err := os.Remove(filepath.Join(home, p)); err != nil {
			t.Fatal(err)
		}
	}
	// A temporary of a Recover cut short, to be replaced.
	if err := os.WriteFile(filepath.Join(home, "d", recoverTemp), []byte("partial"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := attachAndMount(image, home); err != nil {
		t.Fatal(err)
	}
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
	if ents, _ := os.ReadDir(filepath.Join(home, "d")); len(ents) != 2 {
		t.Errorf("d holds %v, want x and y", ents)
	}
}

// An image mkfs never finished holds none of the home's files: it is
// removed and the home left alone.
func TestRecoverHalfMadeImage(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	if err := os.WriteFile(image, make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
}

// An image recovered with another home than the one it was made for (a
// retry that gives another) gives the files back to the home they came
// from; the other is left alone. One whose home is not recorded, mounted
// elsewhere, is refused: a second loop device on it would corrupt it.
func TestRecoverTheHomeItWasMadeFor(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o755); err != nil {
		t.Fatal(err)
	}
	seedHome(t, home)
	if _, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = (&Quota{Method: Loop, Image: image}).Release(home) })
	if got := RecordedHome(image); got != home {
		t.Fatalf("the image records %q, want %q", got, home)
	}
	if err := unix.Removexattr(image, homeAttr); err != nil {
		t.Fatal(err)
	}
	if err := Recover(context.Background(), other, image); err == nil {
		t.Fatal("Recover of an image mounted elsewhere, its home not recorded: nil")
	}
	if !mountedAt(t, home) {
		t.Fatal("the home was unmounted by a refused Recover")
	}
	markImage(image, home)
	if err := Recover(context.Background(), other, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
	if ents, _ := os.ReadDir(other); len(ents) != 0 {
		t.Errorf("the other home got %v", ents)
	}
}

// A home with files of its own still has its root owned by Options.UID
// and GID after Apply (the copy of its files into the image brought the
// mount point's owner, root, along).
func TestLoopRootOwnerWithFiles(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image, UID: 1000, GID: 1001})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil || st.Uid != 1000 || st.Gid != 1001 {
		t.Fatalf("the home's root is %d:%d (%v), want 1000:1001", st.Uid, st.Gid, err)
	}
}

// The home's root gets back the owner and mode it had in the image (its
// last), not root's 0755, which the directory under the mount point
// was given.
func TestRecoverHomeRoot(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	seedHome(t, home)
	if _, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image, UID: 1000, GID: 1001}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = (&Quota{Method: Loop, Image: image}).Release(home) })
	if err := unix.Chmod(home, 0o2770); err != nil {
		t.Fatal(err)
	}
	if err := Recover(context.Background(), home, image); err != nil {
		t.Fatal(err)
	}
	checkSeeded(t, home, image)
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil || st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o2770 {
		t.Fatalf("the home's root is %d:%d %o (%v), want 1000:1001 2770", st.Uid, st.Gid, st.Mode&0o7777, err)
	}
}
