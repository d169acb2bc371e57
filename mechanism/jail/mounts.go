package jail

import (
	"fmt"
	"strings"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// Host mounts (Spec.Mounts): docker's -v HOST:SANDBOX[:ro].
//
// Provision resolves each source's symbolic links once
// (mechanism.ResolveMounts) and keeps the result. Every start then, in
// the sandbox's mount namespace before it pivots (finishTree):
//
//   - opens the source with openat2 RESOLVE_NO_SYMLINKS: a link swapped
//     into the host path since is refused (ELOOP), never followed;
//   - clones it (open_tree OPEN_TREE_CLONE, recursive), sets nosuid,
//     nodev, private propagation and, for :ro, read-only on the whole
//     clone (mount_setattr, recursive: a submount of the source is
//     read-only too);
//   - walks the target from the tree's root one component at a time with
//     openat2 RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, making what is missing
//     (mkdirat on the descriptor of its parent), so a symbolic link in the
//     sandbox's tree (one the workload left in its home before a restart)
//     stops the start with an error instead of sending the mount
//     elsewhere;
//   - attaches the clone on the target's descriptor (move_mount), then
//     opens the target again and checks, with fstatfs and fstat, that
//     the source is there with the flags asked (read-only really set).
//
// The root of a sandbox on the host's runtime is a tmpfs made read-only
// before the writable mounts go on, so the mount points outside the home
// and /tmp are made in it while it is built (makeMountPoints; a sandbox
// with mounts builds its own tree rather than cloning the shared
// template, whose root no sandbox may change). A target beneath a
// read-only bind of the host (/usr, /etc/ssl) must exist there.
//
// Writes: the Landlock ruleset gets a rule on each read-write source
// (rules are on inodes: the source's is the mount's root); a read-only
// mount gets none, and the mount flag refuses writes (EROFS).
//
// Hand-written with x/sys/unix rather than a path library such as
// filepath-securejoin: securejoin resolves symbolic links inside the root,
// where this refuses them; and the mount API's descriptors are what the
// mount is attached by.

// mountResolve is how every path component is looked up: never through a
// symbolic link, never above the directory it starts from.
const mountResolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// openSource opens a mount's source, refusing any symbolic link in its
// (already resolved) path.
func openSource(m mechanism.Mount) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, m.Source, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.ELOOP {
		return -1, fmt.Errorf("mount source %s: a symbolic link is on its path now (it was resolved when the sandbox was made); refused", m.Source)
	}
	if err != nil {
		return -1, fmt.Errorf("mount source %s: %w", m.Source, err)
	}
	return fd, nil
}

// isDirFD reports whether fd is a directory.
func isDirFD(fd int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

// beneathPreBuilt reports whether target is beneath a file system the
// tree gets after it is built (the home, /tmp): its mount point is made
// then, in that file system.
func beneathPreBuilt(target string) bool {
	return strings.HasPrefix(target, mechanism.Home+"/") || strings.HasPrefix(target, "/tmp/")
}

// makeMountPoints makes the mount points of ms that are not beneath the
// home or /tmp in the root tmpfs at root, while buildTreeShared builds it
// (nothing is bound in it yet; it is made read-only after).
func makeMountPoints(root string, ms []mechanism.Mount) error {
	if len(ms) == 0 {
		return nil
	}
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	for _, m := range ms {
		if beneathPreBuilt(m.Target) {
			continue
		}
		src, err := openSource(m)
		if err != nil {
			return err
		}
		dir, err := isDirFD(src)
		unix.Close(src)
		if err != nil {
			return err
		}
		fd, err := walkTarget(rfd, m.Target, dir, true)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
}

// walkTarget opens target beneath the directory rfd, one component at a
// time, never through a symbolic link. With mk it makes the missing
// components (directories, and the last one a directory when dir, else an
// empty file). The last component must be a directory when dir, else a
// non-directory.
func walkTarget(rfd int, target string, dir, mk bool) (int, error) {
	parts := strings.Split(strings.TrimPrefix(target, "/"), "/")
	cur, err := unix.FcntlInt(uintptr(rfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	for i, name := range parts {
		last := i == len(parts)-1
		where := "/" + strings.Join(parts[:i+1], "/")
		fd, err := openBeneath(cur, name)
		if err == unix.ENOENT && mk {
			if !last || dir {
				err = unix.Mkdirat(cur, name, 0o755)
			} else {
				var f int
				if f, err = unix.Openat(cur, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644); err == nil {
					unix.Close(f)
				}
			}
			if err == nil || err == unix.EEXIST {
				fd, err = openBeneath(cur, name)
			}
		}
		unix.Close(cur)
		switch {
		case err == unix.ELOOP:
			return -1, fmt.Errorf("mount target %s: %s is a symbolic link in the sandbox's tree; a mount is never made through one (remove it, or choose another target)", target, where)
		case err == unix.EROFS:
			return -1, fmt.Errorf("mount target %s: %s cannot be made, its directory is read-only in the sandbox (mount on an existing directory, or beneath %s or /tmp)", target, where, mechanism.Home)
		case err == unix.ENOENT:
			return -1, fmt.Errorf("mount target %s: %s does not exist", target, where)
		case err != nil:
			return -1, fmt.Errorf("mount target %s: %s: %w", target, where, err)
		}
		isDir, err := isDirFD(fd)
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		if (!last || dir) && !isDir {
			unix.Close(fd)
			return -1, fmt.Errorf("mount target %s: %s is not a directory", target, where)
		}
		if last && !dir && isDir {
			unix.Close(fd)
			return -1, fmt.Errorf("mount target %s is a directory and the source a file", target)
		}
		cur = fd
	}
	return cur, nil
}

// openBeneath opens the one component name in the directory dfd; a
// symbolic link there is ELOOP (RESOLVE_NO_SYMLINKS applies to the last
// component too, O_PATH without O_NOFOLLOW).
func openBeneath(dfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: mountResolve})
		if err == unix.EAGAIN || err == unix.EINTR {
			continue // a rename elsewhere on the file system raced the lookup
		}
		return fd, err
	}
}

// placeMounts attaches cfg.Mounts in the tree at cfg.Root (finishTree:
// the home and /tmp are in place, the pivot not done yet).
func placeMounts(cfg launchConfig) error {
	if len(cfg.Mounts) == 0 {
		return nil
	}
	rfd, err := unix.Open(cfg.Root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	for _, m := range cfg.Mounts {
		if err := placeMount(rfd, m); err != nil {
			return err
		}
	}
	return nil
}

func placeMount(rfd int, m mechanism.Mount) error {
	src, err := openSource(m)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	var sst unix.Stat_t
	if err := unix.Fstat(src, &sst); err != nil {
		return err
	}
	dir := sst.Mode&unix.S_IFMT == unix.S_IFDIR
	tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err != nil {
		return fmt.Errorf("mount source %s: clone: %w", m.Source, err)
	}
	defer unix.Close(tree)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Propagation: unix.MS_PRIVATE}
	if m.ReadOnly {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("mount source %s: set nosuid, nodev%s: %w", m.Source, map[bool]string{true: ", read-only"}[m.ReadOnly], err)
	}
	tgt, err := walkTarget(rfd, m.Target, dir, true)
	if err != nil {
		return err
	}
	err = unix.MoveMount(tree, "", tgt, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH)
	unix.Close(tgt)
	if err != nil {
		return fmt.Errorf("mount %s on %s: %w", m.Source, m.Target, err)
	}
	return checkMount(rfd, m, &sst, dir)
}

// checkMount opens m's target again (through the mount now) and checks
// that it is the source, nosuid, nodev, and read-only when asked.
func checkMount(rfd int, m mechanism.Mount, src *unix.Stat_t, dir bool) error {
	fd, err := walkTarget(rfd, m.Target, dir, false)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Dev != src.Dev || st.Ino != src.Ino {
		return fmt.Errorf("mount %s on %s: the target is not the source after the mount", m.Source, m.Target)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return err
	}
	want := int64(unix.ST_NOSUID | unix.ST_NODEV)
	if m.ReadOnly {
		want |= unix.ST_RDONLY
	}
	if fs.Flags&want != want {
		return fmt.Errorf("mount %s on %s: flags %#x in force, want %#x (read-only, nosuid, nodev) set", m.Source, m.Target, fs.Flags, want)
	}
	return nil
}

// addMountRules adds to the Landlock ruleset rfd a rule allowing writes
// beneath each read-write mount of ms; open returns an O_PATH descriptor
// of the mount's root (its source before the tree is built, its target
// after the pivot).
func addMountRules(rfd int, ms []mechanism.Mount, open func(mechanism.Mount) (int, error)) error {
	var access, fileAccess uint64
	for _, m := range ms {
		if m.ReadOnly {
			continue
		}
		if access == 0 {
			abi, err := ll.LandlockGetABIVersion()
			if err != nil {
				return fmt.Errorf("landlock: %w", err)
			}
			access = mechanism.LandlockWriteAccess(abi)
			fileAccess = access &^ uint64(ll.AccessFSRemoveDir|ll.AccessFSRemoveFile|ll.AccessFSMakeChar|ll.AccessFSMakeDir|
				ll.AccessFSMakeReg|ll.AccessFSMakeSock|ll.AccessFSMakeFifo|ll.AccessFSMakeBlock|ll.AccessFSMakeSym|ll.AccessFSRefer)
		}
		fd, err := open(m)
		if err != nil {
			return err
		}
		dir, err := isDirFD(fd)
		if err == nil {
			a := access
			if !dir {
				a = fileAccess
			}
			err = ll.LandlockAddPathBeneathRule(rfd, &ll.PathBeneathAttr{AllowedAccess: a, ParentFd: fd}, 0)
		}
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("landlock rule for mount %s: %w", m.Target, err)
		}
	}
	return nil
}

// openMountedTarget opens m's target in the pivoted root (the init's
// ruleset, before any workload runs), never through a symbolic link.
func openMountedTarget(m mechanism.Mount) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, m.Target, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if err != nil {
		return -1, fmt.Errorf("mount target %s: %w", m.Target, err)
	}
	return fd, nil
}
