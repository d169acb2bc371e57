package jail

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// On an image, a sandbox with an id range of its own may give its
// workload root of its user namespace. The image's unpacked root is
// shared read-only by every sandbox and owned by the host's root on
// disk; it is mounted under the sandbox's overlay through an idmapped
// mount (open_tree(OPEN_TREE_CLONE) + mount_setattr(MOUNT_ATTR_IDMAP)
// with the sandbox's user namespace), so that inside the sandbox its
// files are owned by root (and the image's other users) of that
// namespace, while the overlay's upper layer, the sandbox's own, takes
// every write, owned by the sandbox's range on the host. overlayfs takes
// idmapped lower layers from Linux 5.19; idmapProbe tries it once per
// file system, and where it fails the sandbox keeps the behaviour it had
// before ranges existed (the workload is not root, and writes only its
// home and /tmp).

// idmapProbes caches idmapProbe's answer per file system (st_dev).
var idmapProbes sync.Map // uint64 -> error (nil: works)

// idmapProbe reports whether an overlay can be mounted on an idmapped
// mount of lower (on its file system), trying it in scratch, a directory
// on a file system that can hold an overlay's upper layer. Once per file
// system per process.
func idmapProbe(scratch, lower string) error {
	var st unix.Stat_t
	if err := unix.Stat(lower, &st); err != nil {
		return err
	}
	if v, ok := idmapProbes.Load(st.Dev); ok {
		err, _ := v.(error)
		return err
	}
	err := tryIdmapOverlay(scratch, lower, int(st.Uid))
	if err != nil {
		err = fmt.Errorf("no overlay on an idmapped image layer here: %w", err)
	}
	idmapProbes.Store(st.Dev, err)
	return err
}

// idmapKernel is idmapProbe on a scratch directory of its own under
// os.TempDir() (for the doctor's description).
var idmapKernel = sync.OnceValue(func() error {
	if !overlayOnce() {
		return errors.New("no overlayfs")
	}
	dir, err := os.MkdirTemp("", "managoat-idmap-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lower := filepath.Join(dir, "image")
	if err := os.Mkdir(lower, 0o755); err != nil {
		return err
	}
	return idmapProbe(dir, lower)
})

func tryIdmapOverlay(scratch, lower string, lowerUID int) error {
	if !overlayOnce() {
		return errors.New("no overlayfs")
	}
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	dir, err := os.MkdirTemp(scratch, ".idmap-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for _, d := range []string{"l", "u", "w", "m"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	ns, err := holdUserns(idRangeFirst)
	if err != nil {
		return err
	}
	defer unix.Close(ns)
	var perr error
	onDiscardedThread(func() {
		if perr = unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); perr != nil {
			return
		}
		if perr = mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); perr != nil {
			return
		}
		if perr = idmapMount(lower, ns, filepath.Join(dir, "l")); perr != nil {
			return
		}
		opts := "lowerdir=" + filepath.Join(dir, "l") + ",upperdir=" + filepath.Join(dir, "u") + ",workdir=" + filepath.Join(dir, "w")
		if perr = mount("overlay", filepath.Join(dir, "m"), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); perr != nil {
			return
		}
		var st unix.Stat_t
		if perr = unix.Stat(filepath.Join(dir, "m"), &st); perr != nil {
			return
		}
		// The merged root is the upper directory's (made by root);
		// a lower directory shows the mapping.
		want := uint32(lowerUID + idRangeFirst)
		if lowerUID >= idRangeSize {
			want = 65534 // unmapped: the overflow uid
		}
		if err := unix.Stat(filepath.Join(dir, "l"), &st); err != nil {
			perr = err
		} else if st.Uid != want && lowerUID < idRangeSize {
			perr = fmt.Errorf("the idmapped layer shows uid %d, want %d", st.Uid, want)
		}
		// The thread, and with it its mount namespace, is discarded.
	})
	return perr
}

// idmapMount mounts src at dst through an idmapped mount whose mapping is
// user namespace usernsFD's, read-only, nosuid, nodev, in the calling
// thread's mount namespace.
func idmapMount(src string, usernsFD int, dst string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{
		Attr_set:  unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV,
		Userns_fd: uint64(usernsFD),
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("idmap %s: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach the idmapped %s on %s: %w", src, dst, err)
	}
	return nil
}

// holdUserns returns a descriptor of a new user namespace mapping
// 0..idRangeSize-1 to base.. (uids and gids), owned by this process's
// euid (the host's root). No process runs in it: it is made by a child
// that stops at its exec (traced) and is killed there, never running a
// single instruction of the program; the descriptor keeps the namespace.
// Used where a mapping is needed before (or without) a sandbox's init:
// the sandbox's own namespace, for its C init to join (userns_prep.go),
// and the idmapped-layer probe.
func holdUserns(base int) (int, error) {
	fd, err := -1, error(nil)
	onDiscardedThread(func() {
		m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: idRangeSize}}
		var pid int
		pid, err = syscall.ForkExec("/proc/self/exe", []string{"managoat-userns"}, &syscall.ProcAttr{
			Env: []string{},
			Sys: &syscall.SysProcAttr{
				Cloneflags: unix.CLONE_NEWUSER, UidMappings: m, GidMappings: m,
				// setgroups stays allowed: a C init joining the namespace
				// drops its groups (cinit.c join_userns), and so does it
				// for each workload.
				GidMappingsEnableSetgroups: true,
				Ptrace:                     true, Pdeathsig: syscall.SIGKILL,
			},
		})
		if err != nil {
			err = fmt.Errorf("make a user namespace: %w", err)
			return
		}
		fd, err = unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		unix.Kill(pid, unix.SIGKILL)
		for {
			if _, werr := unix.Wait4(pid, nil, unix.WALL, nil); werr != unix.EINTR {
				break
			}
		}
	})
	return fd, err
}
