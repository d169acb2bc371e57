package jail

import (
	"fmt"
	"strings"
	"sync"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/mountpath"
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
// Not hidden: /proc/self/mountinfo names each mount's source as its path
// within the source's file system (its fourth field: /home/alice/proj
// for -v /home/alice/proj:/src when /home is on /). The kernel prints
// the mount's root dentry relative to its super block, whatever mounts
// lead to it, so no bind or intermediate mount changes it, and proc's
// per-process files cannot be masked for every process; Docker's and
// runc's containers show the same. The workload learns where on the host
// its mounts come from, nothing of what lies beside them.
//
// Both ends are opened by package mountpath (openat2, no symbolic link
// followed; see there why no path library).

// openSource opens m's source, refusing any symbolic link on its path.
func openSource(m mechanism.Mount) (int, error) { return mountpath.OpenSource(m.Source) }

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
		dir, err := mountpath.IsDir(src)
		unix.Close(src)
		if err != nil {
			return err
		}
		fd, err := mountpath.Walk(rfd, m.Target, dir, true, m.Target)
		if err != nil {
			return err
		}
		unix.Close(fd)
	}
	return nil
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
		if err := placeMount(rfd, m, cfg.idmaps); err != nil {
			return err
		}
	}
	return nil
}

func placeMount(rfd int, m mechanism.Mount, idmaps *mountIdmaps) error {
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
	if idmaps != nil {
		ns, err := idmaps.lookup(m, &sst)
		if err != nil {
			return err
		}
		attr.Attr_set |= unix.MOUNT_ATTR_IDMAP
		attr.Userns_fd = uint64(ns)
	}
	if err := unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr); err != nil {
		return fmt.Errorf("mount source %s: set nosuid, nodev%s%s: %w", m.Source, map[bool]string{true: ", read-only"}[m.ReadOnly],
			map[bool]string{true: ", idmapped"}[idmaps != nil], err)
	}
	tgt, err := mountpath.Walk(rfd, m.Target, dir, true, m.Target)
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
	fd, err := mountpath.Walk(rfd, m.Target, dir, false, m.Target)
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
		dir, err := mountpath.IsDir(fd)
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

// A sandbox with a uid range of its own (userns.go) keeps it with host
// mounts: each mount is idmapped (mount_setattr MOUNT_ATTR_IDMAP, on the
// whole recursive clone) with a user namespace that maps the source's
// owner (its uid and gid on the host) to the workload's ids of the range,
// and nothing else. The workload then owns through the mount what the
// source's owner owns (a directory root bound, owned by root, is the
// workload's to write, as it is root's), and what it creates there is
// owned on the host by the source's owner; every other host id shows as
// the overflow id (nobody) and is not writable through the mount. Its own
// uid stays base+uid on the host, no host account. Since a file it makes
// in a read-write mount is the host's file, owned by that owner, the
// sandbox's seccomp filter refuses it set-user-ID and set-group-ID modes
// (seccompFor). Where a source's file system cannot be idmapped (the
// kernel lacks it for that file system: FUSE, NFS, older kernels),
// Provision refuses the sandbox unless Config.UnmappedMounts (or
// MANAGOAT_JAIL_UNMAPPED_MOUNTS=1) lets it run without a range (the
// workload is Config.UID on the host, a real account where one has that
// uid).

// mountIdmaps holds, for a start, one user namespace per owner of a
// mount's source, made while the start goes on (each is a holder
// process's: about a millisecond).
type mountIdmaps struct {
	done chan struct{}
	fds  map[[2]uint32]int
	err  error
}

func ownerKey(st *unix.Stat_t) [2]uint32 { return [2]uint32{st.Uid, st.Gid} }

// newMountIdmaps begins making the user namespaces of ms for a sandbox
// whose range starts at base and whose workload is uid:gid inside: each
// maps a source's owner to base+uid (and its group to base+gid), owned
// by base.
func newMountIdmaps(ms []mechanism.Mount, base, uid, gid int) *mountIdmaps {
	im := &mountIdmaps{done: make(chan struct{}), fds: map[[2]uint32]int{}}
	go func() {
		defer close(im.done)
		im.err = im.make(ms, base, uid, gid)
	}()
	return im
}

func (im *mountIdmaps) make(ms []mechanism.Mount, base, uid, gid int) error {
	for _, m := range ms {
		src, err := openSource(m)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		err = unix.Fstat(src, &st)
		unix.Close(src)
		if err != nil {
			return err
		}
		k := ownerKey(&st)
		if _, ok := im.fds[k]; ok {
			continue
		}
		fd, err := holdUsernsMap(base, fmt.Sprintf("%d %d 1\n", st.Uid, base+uid), fmt.Sprintf("%d %d 1\n", st.Gid, base+gid)) // userns_image.go
		if err != nil {
			return fmt.Errorf("mount source %s: %w", m.Source, err)
		}
		im.fds[k] = fd
	}
	return nil
}

// lookup returns the namespace for a source owned as st says, once they
// are made.
func (im *mountIdmaps) lookup(m mechanism.Mount, st *unix.Stat_t) (int, error) {
	<-im.done
	if im.err != nil {
		return -1, im.err
	}
	ns, ok := im.fds[ownerKey(st)]
	if !ok {
		return -1, fmt.Errorf("mount source %s: its owner changed to %d:%d since the start began", m.Source, st.Uid, st.Gid)
	}
	return ns, nil
}

// close waits for the namespaces and closes them.
func (im *mountIdmaps) close() {
	if im == nil {
		return
	}
	<-im.done
	for k, fd := range im.fds {
		unix.Close(fd)
		delete(im.fds, k)
	}
}

// probeUserns is a user namespace (mapping 0 to nobody, owned by this
// process's euid, with no process in it) that Provision idmaps its
// mounts' clones with to see that it can, made once per process and kept.
var probeUserns = sync.OnceValues(func() (int, error) {
	return holdUsernsMap(0, "0 65534 1\n", "0 65534 1\n") // userns_image.go
})

// probeIdmaps reports why a mount of ms cannot be idmapped: it clones each
// source as placeMount does and sets an idmapping on the detached clone,
// which is then dropped.
func probeIdmaps(ms []mechanism.Mount) error {
	ns, err := probeUserns()
	if err != nil {
		return fmt.Errorf("a user namespace to idmap mounts with: %w", err)
	}
	for _, m := range ms {
		src, err := openSource(m)
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstat(src, &st); err != nil {
			unix.Close(src)
			return err
		}
		tree, err := unix.OpenTree(src, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
		unix.Close(src)
		if err != nil {
			return fmt.Errorf("mount source %s: clone: %w", m.Source, err)
		}
		attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP, Userns_fd: uint64(ns)}
		err = unix.MountSetattr(tree, "", unix.AT_EMPTY_PATH|unix.AT_RECURSIVE, &attr)
		unix.Close(tree)
		if err != nil {
			return fmt.Errorf("mount source %s: its file system (or one mounted beneath it) cannot be idmapped here: %w", m.Source, err)
		}
	}
	return nil
}

// hasWritableMount reports whether ms binds anything read-write.
func hasWritableMount(ms []mechanism.Mount) bool {
	for _, m := range ms {
		if !m.ReadOnly {
			return true
		}
	}
	return false
}
