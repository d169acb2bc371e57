// Package diskquota bounds the bytes a sandbox's home directory can hold,
// with the best means the host allows, and says which:
//
//   - Project quotas, where the home's file system enforces them (ext4
//     mounted with prjquota, xfs with pquota): the home gets a project id
//     of its own with PROJINHERIT (FS_IOC_FSSETXATTR), so everything made
//     below it is charged to that project, and the project a hard block
//     limit (quotactl_fd Q_SETQUOTA on PRJQUOTA). Nothing is mounted; the
//     cost is two system calls.
//   - Otherwise, as root, a loop device: a sparse image file of exactly
//     the limit, formatted ext4 (mkfs.ext4 of e2fsprogs, or copied from
//     an empty one made once per size: Options.Templates), attached with
//     LOOP_CTL_GET_FREE and LOOP_CONFIGURE (LO_FLAGS_AUTOCLEAR: the device
//     goes with its last mount) and mounted nosuid,nodev on the home. The
//     mount lives in the host's mount namespace, so it outlives the
//     process that made it (a manager that restarts finds it); Ensure
//     mounts it again after a reboot, Release unmounts it and removes the
//     image, and Recover gives the home back the files Apply moved into
//     an image no one recorded (recover.go) before it does. The host
//     gives the home at most the image's size; the home holds a little
//     less (ext4's own metadata: about 4% of 1 GiB, 15% of 64 MiB).
//     An image is only ever on one loop device: one still attached (its
//     file system mounted elsewhere yet, as a stopped sandbox's mount
//     namespace not torn down) is mounted again from that device, so a
//     remount sees every write made before it. Files moved from one
//     copy to another (Apply's into the image, Recover's out of it) are
//     synced to disk (syncfs) before the first copy is removed.
//   - Without root neither is possible: Probe says so, and why.
//
// A write past the limit fails with EDQUOT (project) or ENOSPC (loop)
// inside the sandbox; other sandboxes and the host's file system are not
// affected. Growing or shrinking a quota is not supported.
//
// Written here on golang.org/x/sys/unix because no maintained Go module
// wraps project quotas or loop devices without cgo: the project quota is
// two ioctls and one quotactl_fd, the loop device two ioctls, and the
// file system is made by the distribution's mkfs.ext4.
package diskquota

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// Method is how a quota is enforced.
type Method string

// The methods, best first.
const (
	Project Method = "project" // a project quota on the home's own file system
	Loop    Method = "loop"    // a loop-mounted ext4 image of the limit's size
)

// MinBytes is the smallest limit: less holds no ext4 file system.
const MinBytes = 1 << 20

// Quota is a limit in force on one home, as a sandbox's state records it
// (JSON) so that Ensure and Release find it again from another process.
type Quota struct {
	Method Method `json:"method"`
	Bytes  int64  `json:"bytes"`
	Image  string `json:"image,omitempty"`  // Loop: the image file
	ProjID uint32 `json:"projid,omitempty"` // Project: the home's project id
}

// Support is what the host allows for homes made in one directory.
type Support struct {
	Method Method `json:"method,omitempty"` // "" when none
	// Detail says why this method was picked, or why none can be.
	Detail string `json:"detail"`
}

// Available reports whether a quota can be enforced.
func (s Support) Available() bool { return s.Method != "" }

// Probe reports the best method for homes made in dir (a directory that
// exists), from cheap checks: whether dir's file system enforces project
// quotas, else whether this process can attach a loop device and finds
// mkfs.ext4. Verify does the whole operation once.
//
// userns says whether the workload runs in a user namespace of its own. A
// project quota binds a workload only then: the kernel lets a file's owner
// in the host's user namespace give the file another project id
// (FS_IOC_FSSETXATTR), out of the quota, and refuses it (EINVAL) from any
// other user namespace. Without one, a loop device serves.
func Probe(dir string, userns bool) Support {
	perr := projectEnforced(dir)
	switch {
	case perr == nil && !privileged():
		return Support{Detail: fmt.Sprintf("%s enforces project quotas, but setting one needs CAP_SYS_ADMIN (not root)", dir)}
	case perr == nil && userns:
		return Support{Method: Project, Detail: fmt.Sprintf("project quotas enforced on the file system of %s", dir)}
	case perr == nil:
		perr = errors.New("project quotas enforced, but the workload is in the host's user namespace and could move its files out of its project")
	}
	if why := loopUnavailable(); why != "" {
		return Support{Detail: fmt.Sprintf("no project quota (%v), and no loop device: %s", perr, why)}
	}
	return Support{Method: Loop, Detail: fmt.Sprintf("a loop-mounted ext4 image per home (no project quota: %v)", perr)}
}

func privileged() bool {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0
}

// loopUnavailable says why a loop-mounted home cannot be made, or "".
func loopUnavailable() string {
	if !privileged() {
		return "attaching and mounting one needs root (CAP_SYS_ADMIN)"
	}
	if _, err := mkfsPath(); err != nil {
		return err.Error()
	}
	f, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Sprintf("/dev/loop-control: %v (is the loop module loaded?)", err)
	}
	f.Close()
	if b, err := os.ReadFile("/proc/filesystems"); err == nil && !bytes.Contains(b, []byte("\text4\n")) {
		return "the kernel has no ext4"
	}
	return ""
}

// mkfsPath finds mkfs.ext4 (or mke2fs), in PATH or in the sbin
// directories a non-login root PATH may lack.
func mkfsPath() (string, error) {
	for _, name := range []string{"mkfs.ext4", "mke2fs"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		for _, d := range []string{"/usr/sbin", "/sbin"} {
			p := filepath.Join(d, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				return p, nil
			}
		}
	}
	return "", errors.New("mkfs.ext4 not found (install e2fsprogs)")
}

// Options tune Apply.
type Options struct {
	// Method forces a method; "" takes Probe's choice for the home's
	// parent directory.
	Method Method
	// UserNS says the workload runs in a user namespace of its own (see
	// Probe).
	UserNS bool
	// Image is where a Loop image is made: a path outside the home (the
	// sandbox's state directory). Required for Loop.
	Image string
	// UID and GID own the home's root.
	UID, GID int
	// Templates, when set, is a directory (the mechanism's state) where
	// Loop keeps an empty image of each size, copied for each home
	// instead of running mkfs.ext4 for each (template.go).
	Templates string
}

// Apply enforces a limit of bytes on home, a directory: what it holds is
// charged to the limit (moved into a loop file system, or given the
// home's project id). The caller
// records the returned Quota and gives it to Ensure and Release. A host
// that allows no method gives a *mechanism.UnavailableError naming
// disk_quota; a limit below MinBytes is Invalid.
func Apply(ctx context.Context, home string, bytes int64, o Options) (*Quota, error) {
	if bytes < MinBytes {
		return nil, mechanism.Invalid("Limits.DiskBytes", fmt.Sprintf("%d bytes: a disk quota is at least %d (1 MiB)", bytes, MinBytes))
	}
	m := o.Method
	if m == "" {
		s := Probe(filepath.Dir(home), o.UserNS)
		if !s.Available() {
			return nil, unavailable(s.Detail)
		}
		m = s.Method
	}
	switch m {
	case Project:
		id, err := setProject(home)
		if err != nil {
			return nil, unavailable(fmt.Sprintf("set a project id on %s: %v", home, err))
		}
		q := &Quota{Method: Project, Bytes: bytes, ProjID: id}
		if err := projectTree(home, id); err != nil {
			return nil, unavailable(fmt.Sprintf("charge the files of %s to its project: %v", home, err))
		}
		if err := setLimit(home, id, bytes); err != nil {
			return nil, unavailable(fmt.Sprintf("set the project quota of %s: %v", home, err))
		}
		if err := os.Chown(home, o.UID, o.GID); err != nil {
			_ = q.Release(home)
			return nil, err
		}
		return q, nil
	case Loop:
		if o.Image == "" || !filepath.IsAbs(o.Image) {
			return nil, mechanism.Invalid("Image", "a loop quota needs an absolute image path")
		}
		q := &Quota{Method: Loop, Bytes: bytes, Image: o.Image}
		// The directory under the mount point, for the files the home
		// already has (an image's seeded home): they move into the new
		// file system.
		under, err := os.Open(home)
		if err != nil {
			return nil, err
		}
		defer under.Close()
		if err := makeImage(ctx, o.Image, bytes, o.UID, o.GID, o.Templates); err != nil {
			_ = os.Remove(o.Image)
			return nil, unavailable(err.Error())
		}
		markImage(o.Image, home)
		if err := attachAndMount(o.Image, home); err != nil {
			_ = os.Remove(o.Image)
			return nil, unavailable(err.Error())
		}
		// The home is the file system's root: no lost+found in it (e2fsck
		// makes one again if it ever needs it).
		_ = os.Remove(filepath.Join(home, "lost+found"))
		if err := moveUnder(ctx, under, home); err != nil {
			// Back to the home what its removal from under took, if it
			// began (a copy that failed left the home whole).
			if rerr := Recover(context.WithoutCancel(ctx), home, o.Image); rerr != nil {
				return nil, fmt.Errorf("%w; and giving its files back: %v", err, rerr)
			}
			return nil, err
		}
		// cp -a gave the file system's root the owner of the directory
		// under it (root's: attachAndMount).
		if err := os.Chown(home, o.UID, o.GID); err != nil {
			_ = Recover(context.WithoutCancel(ctx), home, o.Image)
			return nil, err
		}
		return q, nil
	}
	return nil, mechanism.Invalid("Method", fmt.Sprintf("%q is not project or loop", m))
}

func unavailable(detail string) error {
	return &mechanism.UnavailableError{Mechanism: "diskquota", Missing: []mechanism.Report{{Name: mechanism.DiskQuota, Detail: detail}}}
}

// Ensure makes q be in force on home again: after a reboot a loop image
// is no longer mounted, and is mounted again here. Nothing is done when it
// is in force (a project quota is kept by the file system itself).
func (q *Quota) Ensure(home string) error {
	if q == nil || q.Method != Loop {
		return nil
	}
	ok, err := Mounted(home, q.Image)
	if err != nil || ok {
		return err
	}
	// One mount of the image at a time, whoever asks (two loop devices
	// on one image would corrupt it): the image's lock, then look again.
	f, err := os.Open(q.Image)
	if err != nil {
		return unavailable(fmt.Sprintf("the home's image: %v", err))
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	if ok, err := Mounted(home, q.Image); err != nil || ok {
		return err
	}
	if err := attachAndMount(q.Image, home); err != nil {
		return unavailable(err.Error())
	}
	return nil
}

// Release ends q: a loop image is unmounted from home (its device goes
// with it) and removed; a project's limit is cleared. Releasing what is
// already gone is nil.
func (q *Quota) Release(home string) error {
	if q == nil {
		return nil
	}
	switch q.Method {
	case Project:
		if err := setLimit(home, q.ProjID, 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("clear the project quota of %s: %w", home, err)
		}
		return nil
	case Loop:
		if err := unmountAll(home, q.Image); err != nil {
			return err
		}
		waitDetached(q.Image, 5*time.Second)
		if err := os.Remove(q.Image); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// waitDetached waits, up to d, until no loop device is backed by image:
// the kernel clears an autoclear device after its last unmount in a work
// queue of its own, a moment later, so a Release that returned at once
// could leave one behind for that moment (a caller that checks finds
// it). Something that still holds the device (a lazy unmount's open
// files) keeps it past d; that is not an error.
func waitDetached(image string, d time.Duration) {
	path, err := filepath.EvalSymlinks(image)
	if err != nil {
		return
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
		held := false
		for _, f := range backing {
			if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == path {
				held = true
				break
			}
		}
		if !held {
			return
		}
	}
}

// unmountAll unmounts every loop file system of image mounted on home: a
// plain unmount first (the sandbox's processes are gone), a lazy one when
// something still holds it after a second.
func unmountAll(home, image string) error {
	deadline := time.Now().Add(time.Second)
	for range 8 {
		ok, err := Mounted(home, image)
		if err != nil || !ok {
			return err
		}
		err = unix.Unmount(home, unix.UMOUNT_NOFOLLOW)
		for errors.Is(err, unix.EBUSY) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
			err = unix.Unmount(home, unix.UMOUNT_NOFOLLOW)
		}
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(home, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("unmount %s: %w", home, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", home)
}

// loopOf is the loop device (/dev/loopN) backed by image, or "".
func loopOf(image string) string {
	path, err := filepath.EvalSymlinks(image)
	if err != nil {
		return ""
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range backing {
		if b, err := os.ReadFile(f); err == nil && strings.TrimSpace(string(b)) == path {
			return "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(f)))
		}
	}
	return ""
}

// syncFS writes what the file system holding dir has in memory to its
// disk (syncfs(2)); for a loop file system, through the loop device into
// its image file, which the loop driver flushes to the host's disk.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

// Mounted reports whether a loop device backed by image is mounted on
// home (the device home's file system is on, and that device's backing
// file). Another file system mounted there is an error.
func Mounted(home, image string) (bool, error) {
	var h, p unix.Stat_t
	if err := unix.Lstat(home, &h); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, err
	}
	if err := unix.Lstat(filepath.Dir(home), &p); err != nil {
		return false, err
	}
	if h.Dev == p.Dev {
		return false, nil
	}
	b, err := os.ReadFile(fmt.Sprintf("/sys/dev/block/%d:%d/loop/backing_file", unix.Major(h.Dev), unix.Minor(h.Dev)))
	if err == nil {
		// The kernel gives the path it resolved: image's, through any
		// symbolic link on the way.
		backing := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
		if backing == image {
			return true, nil
		}
		if real, err := filepath.EvalSymlinks(image); err == nil && backing == real {
			return true, nil
		}
	}
	return false, fmt.Errorf("%s is a mount point of another file system (device %d:%d), not of %s", home, unix.Major(h.Dev), unix.Minor(h.Dev), image)
}

// makeImage makes the image at path: a copy of the template of its size
// in templates (template.go), or, with templates "", made by mkfs.ext4.
func makeImage(ctx context.Context, path string, size int64, uid, gid int, templates string) error {
	if templates != "" {
		return fromTemplate(ctx, templates, path, size)
	}
	return makeFS(ctx, path, size, uid, gid)
}

// makeFS makes a sparse file of size bytes at path and an ext4 file
// system in it whose root is owned by uid:gid: no reserved blocks (the
// sandbox gets all of it), no discard (the file is sparse already), the
// inode tables and journal zeroed lazily (by punching holes: the image
// stays sparse), and no resize inode (a quota never grows; its reserved
// descriptor blocks were 4 MiB of a 10 GiB image's 4.2).
func makeFS(ctx context.Context, path string, size int64, uid, gid int) error {
	mkfs, err := mkfsPath()
	if err != nil {
		return err
	}
	_ = os.Remove(path) // a half-made image of an attempt cut short
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-O", "^resize_inode",
		"-E", fmt.Sprintf("root_owner=%d:%d,nodiscard,lazy_itable_init=1,lazy_journal_init=1", uid, gid), path)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s of %s: %v: %s", filepath.Base(mkfs), path, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// attachAndMount attaches image to a free loop device (autoclear) and
// mounts it nosuid,nodev on home. The device is released with its mount.
//
// An image still attached to a device (its file system mounted elsewhere
// yet: a bind of it, a stopped sandbox's mount namespace not torn down
// yet, a lazy unmount's open files) is mounted from that device, never
// from a second one: a second device would be a second file system on
// the same blocks, which reads them without what the first holds in
// memory and not yet written (a file written before a remount was
// missing after it, TestDiskQuotaAfterReboot), and the two would corrupt
// the image as both write it.
func attachAndMount(image, home string) error {
	// The directory under the mount point is root's, 0755: a workload
	// that had the mount taken off its home could not write there, on
	// the host's disk, out of the limit.
	if err := os.Chown(home, 0, 0); err != nil {
		return err
	}
	if err := os.Chmod(home, 0o755); err != nil {
		return err
	}
	if dev := loopOf(image); dev != "" {
		err := unix.Mount(dev, home, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
		if err == nil {
			if ok, _ := Mounted(home, image); ok {
				return nil
			}
			// Cleared and taken for another file since the look.
			_ = unix.Unmount(home, unix.UMOUNT_NOFOLLOW)
			err = fmt.Errorf("%s is no longer backed by %s", dev, image)
		}
		// Detached meanwhile (its last mount went): a fresh device is
		// then the only one. One that stays attached is refused.
		waitDetached(image, 5*time.Second)
		if attached(image) {
			return fmt.Errorf("the image %s is attached to %s, and mounting that on %s failed: %v", image, dev, home, err)
		}
	}
	img, err := os.OpenFile(image, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer img.Close()
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("/dev/loop-control: %w", err)
	}
	defer unix.Close(ctl)
	var cfg unix.LoopConfig
	cfg.Fd = uint32(img.Fd())
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	copy(cfg.Info.File_name[:len(cfg.Info.File_name)-1], image)
	for try := 0; ; try++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			// A /dev without devtmpfs: make the node the kernel made.
			if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("mknod %s: %w", dev, err)
			}
			fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		}
		if err != nil {
			return fmt.Errorf("open %s: %w", dev, err)
		}
		err = unix.IoctlLoopConfigure(fd, &cfg)
		if errors.Is(err, unix.EBUSY) && try < 32 {
			unix.Close(fd) // taken by another process since GET_FREE
			continue
		}
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("LOOP_CONFIGURE %s: %w", dev, err)
		}
		// Mounted before our descriptor closes: autoclear detaches the
		// device at its last close, which is then the unmount's.
		err = unix.Mount(dev, home, "ext4", unix.MS_NOSUID|unix.MS_NODEV, "")
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("mount %s (%s) on %s: %w", dev, image, home, err)
		}
		return nil
	}
}

// The quota interface (linux/quota.h): not in golang.org/x/sys/unix.
const (
	qGetQuota   = 0x800007
	qSetQuota   = 0x800008
	qXGetQStatV = 0x5808 // XQM_CMD(8)
	prjQuota    = 2
	qifBLimits  = 1
	qifILimits  = 4
	qifLimits   = qifBLimits | qifILimits
	pdqEnforced = 0x0020 // FS_QUOTA_PDQ_ENFD

	fsIocFsGetXattr    = 0x801c581f // _IOR('X', 31, struct fsxattr)
	fsIocFsSetXattr    = 0x401c5820 // _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x00000200
)

// ifDqblk is struct if_dqblk: block limits in 1 KiB units, space in bytes.
type ifDqblk struct {
	BHardLimit, BSoftLimit, CurSpace  uint64
	IHardLimit, ISoftLimit, CurInodes uint64
	BTime, ITime                      uint64
	Valid                             uint32
	_                                 uint32
}

// fsxattr is struct fsxattr.
type fsxattr struct {
	XFlags, ExtSize, NExtents, ProjID, CowExtSize uint32
	_                                             [8]byte
}

// fsQuotaStatV is struct fs_quota_statv (the part read here, padded to
// its 160 bytes).
type fsQuotaStatV struct {
	Version uint8
	_       uint8
	Flags   uint16
	_       [156]byte
}

func quotactlFd(fd int, cmd uint32, id uint32, addr unsafe.Pointer) error {
	_, _, e := unix.Syscall6(unix.SYS_QUOTACTL_FD, uintptr(fd), uintptr(cmd|prjQuota), uintptr(id), uintptr(addr), 0, 0)
	if e != 0 {
		return e
	}
	return nil
}

func withDir(dir string, f func(fd int) error) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return f(fd)
}

// projectEnforced says (nil) whether dir's file system enforces project
// quotas (accounting alone, as ext4's quota feature without the prjquota
// mount option gives, is not enough).
func projectEnforced(dir string) error {
	return withDir(dir, func(fd int) error {
		st := fsQuotaStatV{Version: 1}
		if err := quotactlFd(fd, qXGetQStatV, 0, unsafe.Pointer(&st)); err != nil {
			return fmt.Errorf("the file system of %s has no quotas on (quotactl: %w)", dir, err)
		}
		if st.Flags&pdqEnforced == 0 {
			return fmt.Errorf("%s: project quotas accounted but not enforced (flags %#x)", dir, st.Flags)
		}
		return nil
	})
}

// setProject gives home a project id of its own, inherited by everything
// made below it: its inode number, unique among the live directories of
// its file system (ext4's fit in 32 bits; a larger one is folded).
func setProject(home string) (uint32, error) {
	var id uint32
	err := withDir(home, func(fd int) error {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return err
		}
		id = uint32(st.Ino)
		if st.Ino > math.MaxUint32 {
			id = uint32(st.Ino) ^ uint32(st.Ino>>32) | 1<<31
		}
		if id == 0 {
			id = 1 << 31
		}
		return setProjectFd(fd, id, true)
	})
	return id, err
}

// setLimit sets project id's hard block limit to bytes (0 clears it), on
// the file system of path.
func setLimit(path string, id uint32, bytes int64) error {
	return withDir(path, func(fd int) error {
		d := ifDqblk{BHardLimit: uint64(bytes+1023) / 1024, BSoftLimit: uint64(bytes+1023) / 1024, Valid: qifLimits}
		return quotactlFd(fd, qSetQuota, id, unsafe.Pointer(&d))
	})
}

// ProjectUse returns the bytes charged to project id on the file system of
// path, and its hard limit.
func ProjectUse(path string, id uint32) (used, limit int64, err error) {
	err = withDir(path, func(fd int) error {
		var d ifDqblk
		if err := quotactlFd(fd, qGetQuota, id, unsafe.Pointer(&d)); err != nil {
			return err
		}
		used, limit = int64(d.CurSpace), int64(d.BHardLimit)*1024
		return nil
	})
	return used, limit, err
}

// moveUnder copies what the directory under (the home before the mount)
// holds into home, owners, modes and times kept (cp -a), then removes it
// from under, so that the host keeps one copy, inside the limit. Files
// that do not fit are Invalid: the limit is smaller than the home.
func moveUnder(ctx context.Context, under *os.File, home string) error {
	names, err := under.Readdirnames(-1)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	cmd := exec.CommandContext(ctx, "cp", "-a", "--", "/proc/self/fd/3/.", home+"/")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	cmd.ExtraFiles = []*os.File{under}
	if out, err := cmd.CombinedOutput(); err != nil {
		if strings.Contains(string(out), "No space left") {
			return mechanism.Invalid("Limits.DiskBytes", fmt.Sprintf("the files already in %s do not fit in the quota", home))
		}
		return fmt.Errorf("copy the files of %s into its quota: %v: %s", home, err, strings.TrimSpace(string(out)))
	}
	// The copies are on the image's disk before the originals go: a
	// crash in between leaves two copies, never none.
	if err := syncFS(home); err != nil {
		return err
	}
	dir := fmt.Sprintf("/proc/self/fd/%d", under.Fd())
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// projectTree charges what home already holds to project id (the files
// made from now on inherit it): each directory and regular file below it
// gets the id, each directory PROJINHERIT. Symbolic links and special
// files take no space of their own and are left.
func projectTree(home string, id uint32) error {
	return filepath.WalkDir(home, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == home {
			return err
		}
		if !d.IsDir() && !d.Type().IsRegular() {
			return nil
		}
		fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return setProjectFd(fd, id, d.IsDir())
	})
}

func setProjectFd(fd int, id uint32, dir bool) error {
	var x fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsGetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("FS_IOC_FSGETXATTR: %w", e)
	}
	x.ProjID = id
	if dir {
		x.XFlags |= fsXflagProjInherit
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsIocFsSetXattr, uintptr(unsafe.Pointer(&x))); e != 0 {
		return fmt.Errorf("FS_IOC_FSSETXATTR: %w", e)
	}
	return nil
}
