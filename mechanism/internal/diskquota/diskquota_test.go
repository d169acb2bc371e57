package diskquota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// Tests mount loop file systems in their t.TempDir: the enclosure
// unmounts whatever one left if it dies.
func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

func needLoop(t *testing.T) {
	t.Helper()
	testenv.RequireRoot(t)
	_, err := mkfsPath()
	testenv.Require(t, err == nil, "mkfs.ext4 (Debian package e2fsprogs)")
	why := loopUnavailable()
	testenv.Require(t, why == "", "a loop device: "+why)
}

// fill writes kib KiB of zeros to a new file path as uid with dd.
func fill(path string, kib, uid int) (string, error) {
	_, out, err := Fill(context.Background(), path, int64(kib)<<10, uid)
	return out, err
}

// loopsOf lists the loop devices whose backing file is image.
func loopsOf(t *testing.T, image string) []string {
	t.Helper()
	ms, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, m := range ms {
		b, err := os.ReadFile(m)
		if err == nil && strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == image {
			out = append(out, m)
		}
	}
	return out
}

// mountedAt reports whether /proc/self/mountinfo has a mount point dir.
func mountedAt(t *testing.T, dir string) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == dir {
			return true
		}
	}
	return false
}

func newHome(t *testing.T, parent string) string {
	t.Helper()
	home := filepath.Join(parent, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	return home
}

func TestLoopLimitHolds(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	const limit = 8 << 20
	q, err := Apply(context.Background(), home, limit, Options{Method: Loop, Image: image, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if ok, err := Mounted(home, image); !ok || err != nil {
		t.Fatalf("Mounted = %v, %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(home, "lost+found")); !os.IsNotExist(err) {
		t.Errorf("lost+found left in the home: %v", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil || st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("home root owned by %d:%d (%v), want 1000:1000", st.Uid, st.Gid, err)
	}
	out, err := fill(filepath.Join(home, "big"), 16<<10, 1000)
	if err == nil || !strings.Contains(out, "No space left") {
		t.Fatalf("a 16 MiB write under an 8 MiB limit: %v: %s", err, out)
	}
	fi, err := os.Stat(filepath.Join(home, "big"))
	if err != nil || fi.Size() > limit {
		t.Fatalf("written %v (%v), want at most %d", fi.Size(), err, limit)
	}
	t.Logf("the home took %d of 8 MiB before ENOSPC", fi.Size())
	// The host gave the image at most the limit.
	if err := unix.Stat(image, &st); err != nil || st.Blocks*512 > limit {
		t.Fatalf("the image holds %d bytes on the host (%v), want at most %d", st.Blocks*512, err, limit)
	}
	// Space freed inside is usable again.
	if err := os.Remove(filepath.Join(home, "big")); err != nil {
		t.Fatal(err)
	}
	if out, err := fill(filepath.Join(home, "small"), 1024, 1000); err != nil {
		t.Fatalf("a write after freeing: %v: %s", err, out)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, home) {
		t.Error("the home is still mounted after Release")
	}
	if l := loopsOf(t, image); len(l) > 0 {
		t.Errorf("loop devices left on %s: %v", image, l)
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Errorf("the image is left: %v", err)
	}
	if err := q.Release(home); err != nil {
		t.Errorf("a second Release: %v", err)
	}
}

// A reboot unmounts the home; Ensure mounts the same file system again,
// with what the sandbox wrote.
func TestLoopEnsureAfterUnmount(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if err := os.WriteFile(filepath.Join(home, "kept"), []byte("yes"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := q.Ensure(home); err != nil {
		t.Fatalf("Ensure while mounted: %v", err)
	}
	if err := unix.Unmount(home, 0); err != nil {
		t.Fatal(err)
	}
	if ok, _ := Mounted(home, image); ok {
		t.Fatal("mounted after unmount")
	}
	// Uncovered, the directory under the mount point is root's: the
	// sandbox's user cannot write there, on the host's disk.
	var st unix.Stat_t
	if err := unix.Stat(home, &st); err != nil || st.Uid != 0 || st.Mode&0o777 != 0o755 {
		t.Fatalf("under the mount point: uid %d mode %o (%v), want root's 0755", st.Uid, st.Mode&0o777, err)
	}
	if err := q.Ensure(home); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(home, "kept")); err != nil || string(b) != "yes" {
		t.Fatalf("after Ensure: %q, %v", b, err)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, home) || len(loopsOf(t, image)) > 0 {
		t.Fatal("mount or loop device left after Release")
	}
}

// Two homes are two file systems: one full leaves the other room.
func TestLoopHomesIndependent(t *testing.T) {
	needLoop(t)
	ctx := context.Background()
	var homes []string
	for i := range 2 {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		home := newHome(t, dir)
		q, err := Apply(ctx, home, 4<<20, Options{Method: Loop, Image: filepath.Join(dir, "img"), UID: 1000, GID: 1000})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = q.Release(home) })
		homes = append(homes, home)
	}
	if out, err := fill(filepath.Join(homes[0], "f"), 8<<10, 1000); err == nil {
		t.Fatalf("filled past the limit: %s", out)
	}
	if out, err := fill(filepath.Join(homes[1], "f"), 2<<10, 1000); err != nil {
		t.Fatalf("the other home: %v: %s", err, out)
	}
}

func TestApplyRefuses(t *testing.T) {
	_, err := Apply(context.Background(), t.TempDir(), 4096, Options{Method: Loop, Image: "/x.img"})
	var inv *mechanism.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("a 4 KiB quota: %v, want Invalid", err)
	}
	_, err = Apply(context.Background(), t.TempDir(), 4<<20, Options{Method: Loop})
	if !errors.As(err, &inv) {
		t.Fatalf("a loop quota without an image: %v, want Invalid", err)
	}
}

// TestProbeRootless: without root nothing can be enforced, and both Probe
// and Apply say so. As root, TestProbeUnprivileged runs it as uid 65534.
func TestProbeRootless(t *testing.T) {
	if privileged() {
		t.Skip("as root: TestProbeUnprivileged runs this as uid 65534")
	}
	s := Probe(t.TempDir(), false)
	if s.Available() || !strings.Contains(s.Detail, "root") {
		t.Fatalf("without root: %+v", s)
	}
	_, err := Apply(context.Background(), filepath.Join(t.TempDir()), 4<<20, Options{})
	var u *mechanism.UnavailableError
	if !errors.As(err, &u) || u.Missing[0].Name != mechanism.DiskQuota {
		t.Fatalf("Apply without root: %v", err)
	}
}

// prjquotaFS mounts a small ext4 with project quotas enforced in a temp
// directory (the host's own file system need not have them) and returns
// its root.
func prjquotaFS(t *testing.T) string {
	t.Helper()
	needLoop(t)
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "prj.img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 64<<20); err != nil {
		t.Fatal(err)
	}
	mkfs, _ := mkfsPath()
	if out, err := exec.Command(mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-O", "quota,project", "-E", "quotatype=prjquota", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs: %v: %s", err, out)
	}
	if err := attachAndMount(img, mnt); errors.Is(err, unix.EINVAL) {
		// Not a prerequisite: a kernel configuration (see hostfacts).
		t.Skipf("this kernel mounts no ext4 with the quota feature (CONFIG_QUOTA and CONFIG_QFMT_V2): %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmountAll(mnt, img); err != nil {
			t.Error(err)
		}
	})
	// Remount with prjquota: enforcement (the feature alone accounts).
	if err := unix.Mount("", mnt, "", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, "prjquota"); err != nil {
		t.Fatalf("remount prjquota: %v", err)
	}
	if err := os.Chmod(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	return mnt
}

func TestProjectLimitHolds(t *testing.T) {
	root := prjquotaFS(t)
	if s := Probe(root, true); s.Method != Project {
		t.Fatalf("Probe of a prjquota file system for a workload in a user namespace: %+v", s)
	}
	if s := Probe(root, false); s.Method != Loop || !strings.Contains(s.Detail, "user namespace") {
		t.Fatalf("Probe of a prjquota file system for a workload in the host's user namespace: %+v", s)
	}
	home := newHome(t, root)
	other := filepath.Join(root, "other")
	if err := os.Mkdir(other, 0o777); err != nil {
		t.Fatal(err)
	}
	const limit = 4 << 20
	q, err := Apply(context.Background(), home, limit, Options{UserNS: true, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if q.Method != Project || q.ProjID == 0 {
		t.Fatalf("quota %+v", q)
	}
	sub := filepath.Join(home, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(home, "a"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(sub, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	out, err := fill(filepath.Join(sub, "big"), 8<<10, 1000)
	if err == nil || !strings.Contains(out, "quota") {
		t.Fatalf("an 8 MiB write under a 4 MiB project quota, two levels down: %v: %s", err, out)
	}
	used, lim, err := ProjectUse(home, q.ProjID)
	if err != nil || used > limit || used < limit/2 || lim != limit {
		t.Fatalf("ProjectUse = %d, %d, %v", used, lim, err)
	}
	// The rest of the file system is another project.
	if out, err := fill(filepath.Join(other, "f"), 8<<10, 1000); err != nil {
		t.Fatalf("outside the home: %v: %s", err, out)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if _, lim, _ := ProjectUse(home, q.ProjID); lim != 0 {
		t.Fatalf("limit after Release: %d", lim)
	}
}

// The workload owns its files. In the host's user namespace the kernel
// lets an owner give a file another project id (FS_IOC_FSSETXATTR), out of
// the quota; in a user namespace of its own it refuses (EINVAL). So
// Probe's project method asks for a workload in a user namespace
// (ProbeFor), and a loop device serves the others.
func TestProjectIDEscape(t *testing.T) {
	root := prjquotaFS(t)
	home := newHome(t, root)
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Project, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	f := filepath.Join(home, "f")
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(f, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	try := func(userns bool) error {
		cmd := exec.Command("/proc/self/exe", "-test.run=^TestHelperSetProject$")
		cmd.Env = []string{"DISKQUOTA_HELPER=" + f}
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
		if userns {
			cmd.SysProcAttr = &syscall.SysProcAttr{
				Cloneflags:  syscall.CLONE_NEWUSER,
				UidMappings: []syscall.SysProcIDMap{{ContainerID: 1000, HostID: 1000, Size: 1}},
				GidMappings: []syscall.SysProcIDMap{{ContainerID: 1000, HostID: 1000, Size: 1}},
				Credential:  &syscall.Credential{Uid: 1000, Gid: 1000},
			}
		}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	}
	if err := try(true); err == nil || !strings.Contains(err.Error(), "invalid argument") {
		t.Fatalf("in a user namespace, the owner moved its file out of the project: %v", err)
	}
	if err := try(false); err != nil {
		t.Logf("in the host's user namespace the kernel refused too: %v", err)
	} else {
		t.Logf("in the host's user namespace the owner moved its file out of the project: the project method needs a user namespace")
	}
}

// TestHelperSetProject is the owner's attempt, run by TestProjectIDEscape.
func TestHelperSetProject(t *testing.T) {
	f := os.Getenv("DISKQUOTA_HELPER")
	if f == "" {
		t.Skip("a helper of TestProjectIDEscape")
	}
	fd, err := unix.Open(f, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsGetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		t.Fatal(e)
	}
	x.ProjID = 0
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsSetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		t.Fatal(e)
	}
}

func TestVerify(t *testing.T) {
	needLoop(t)
	s := Verify(context.Background(), t.TempDir(), false)
	if s.Method != Loop && s.Method != Project {
		t.Fatalf("Verify: %+v", s)
	}
	t.Log(s.Detail)
}

func TestVerifyProject(t *testing.T) {
	root := prjquotaFS(t)
	if s := Verify(context.Background(), root, true); s.Method != Project || !strings.Contains(s.Detail, "quota exceeded") {
		t.Fatalf("Verify on prjquota: %+v", s)
	}
}

// What the home held before (an image's seeded home) is in the quota's
// file system after, owners and modes kept, and no longer under it.
func TestLoopKeepsTheHomesFiles(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	if err := os.MkdirAll(filepath.Join(home, ".config", "app"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, ".config", "app", "rc"), []byte("seeded"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(home, ".config"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(".config/app/rc", filepath.Join(home, "link")); err != nil {
		t.Fatal(err)
	}
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image, UID: 1000, GID: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if b, err := os.ReadFile(filepath.Join(home, "link")); err != nil || string(b) != "seeded" {
		t.Fatalf("the seeded file through its link: %q, %v", b, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(home, ".config", "app", "rc"), &st); err != nil || st.Mode&0o777 != 0o640 {
		t.Fatalf("mode %o, %v", st.Mode&0o777, err)
	}
	if err := unix.Stat(filepath.Join(home, ".config"), &st); err != nil || st.Uid != 1000 {
		t.Fatalf("owner %d, %v", st.Uid, err)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if ents, err := os.ReadDir(home); err != nil || len(ents) != 0 {
		t.Fatalf("under the mount point after Release: %v, %v", ents, err)
	}
	// A home larger than the limit is refused, and left as it was.
	if err := os.WriteFile(filepath.Join(home, "big"), make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Apply(context.Background(), home, 2<<20, Options{Method: Loop, Image: image})
	var inv *mechanism.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("a 3 MiB home under 2 MiB: %v, want Invalid", err)
	}
	if fi, err := os.Stat(filepath.Join(home, "big")); err != nil || fi.Size() != 3<<20 || mountedAt(t, home) {
		t.Fatalf("after the refusal: %v, %v, mounted %v", fi, err, mountedAt(t, home))
	}
	if _, err := os.Stat(image); !os.IsNotExist(err) {
		t.Fatalf("image left after the refusal: %v", err)
	}
}

// A state directory reached through a symbolic link: the kernel names the
// image by its real path, and Release still finds its mount.
func TestLoopThroughSymlink(t *testing.T) {
	needLoop(t)
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	home, image := newHome(t, link), filepath.Join(link, "home.img")
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if ok, err := Mounted(home, image); !ok || err != nil {
		t.Fatalf("Mounted through the link: %v, %v", ok, err)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, filepath.Join(real, "home")) || len(loopsOf(t, filepath.Join(real, "home.img"))) > 0 {
		t.Fatal("left mounted")
	}
}

// Ensures racing after a reboot mount the image once.
func TestLoopEnsureOnce(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if err := unix.Unmount(home, 0); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() { errs <- q.Ensure(home) }()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if l := loopsOf(t, image); len(l) != 1 {
		t.Fatalf("loop devices on the image: %v, want one", l)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, home) || len(loopsOf(t, image)) > 0 {
		t.Fatal("left mounted")
	}
}

// TestProbeUnprivileged runs TestProbeRootless as uid 65534: this test
// binary copied where that user can run it.
func TestProbeUnprivileged(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	if err := testenv.Traversable(dir); err != nil {
		t.Fatal(err)
	}
	self, err := os.ReadFile("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "diskquota.test")
	if err := os.WriteFile(bin, self, 0o755); err != nil {
		t.Fatal(err)
	}
	own := filepath.Join(dir, "u")
	if err := os.Mkdir(own, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(own, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-test.run=^TestProbeRootless$", "-test.v")
	cmd.Dir = own
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + own, "TMPDIR=" + own}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestProbeRootless") {
		t.Fatalf("as uid 65534: %v\n%s", err, out)
	}
}

// TestLoopEnsureWhileMountedElsewhere: a home whose file system is still
// mounted elsewhere (a bind: as a stopped sandbox's mount namespace not
// torn down yet) is mounted again from the image's one loop device,
// never a second: a file written before the remount, not yet on the
// image's disk, is there after it (a second device read the image
// without it), and both mounts are one file system.
func TestLoopEnsureWhileMountedElsewhere(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	if err := os.WriteFile(filepath.Join(home, "k"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(dir, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(home, other, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(other, unix.MNT_DETACH) })
	if err := unix.Unmount(home, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Ensure(home); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(home, "k")); err != nil || string(b) != "kept" {
		t.Fatalf("the file written before the remount: %q, %v", b, err)
	}
	if l := loopsOf(t, image); len(l) != 1 {
		t.Fatalf("loop devices on the image: %v, want one", l)
	}
	if err := os.WriteFile(filepath.Join(other, "o"), []byte("one"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(home, "o")); err != nil || string(b) != "one" {
		t.Fatalf("the two mounts are not one file system: %q, %v", b, err)
	}
	if err := unix.Unmount(other, 0); err != nil {
		t.Fatal(err)
	}
	if err := q.Release(home); err != nil {
		t.Fatal(err)
	}
	if mountedAt(t, home) || len(loopsOf(t, image)) > 0 {
		t.Fatal("left mounted")
	}
}

// TestLoopMovedFilesOnTheImage: the files Apply moves from the home into
// its image are on the image's disk (read back from the image file, not
// the loop file system's memory) by the time the originals are gone, so
// a crash after Apply cannot lose them (they sat in memory up to 30 s).
func TestLoopMovedFilesOnTheImage(t *testing.T) {
	needLoop(t)
	dir := t.TempDir()
	home, image := newHome(t, dir), filepath.Join(dir, "home.img")
	marker := []byte("managoat-diskquota-marker-" + strings.Repeat("0123456789abcdef", 64))
	if err := os.WriteFile(filepath.Join(home, "m"), marker, 0o644); err != nil {
		t.Fatal(err)
	}
	q, err := Apply(context.Background(), home, 4<<20, Options{Method: Loop, Image: image})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Release(home) })
	b, err := os.ReadFile(image)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, marker) {
		t.Fatal("the moved file is not in the image file: it is only in the loop file system's memory")
	}
}
