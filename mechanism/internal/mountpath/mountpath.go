// Package mountpath opens the two ends of a host mount (mechanism.Mount)
// without following a symbolic link: the source on the host, and the
// target beneath a root directory whose contents a sandbox may have
// chosen (its home). The jail attaches a mount on the target's
// descriptor; the OCI mechanism checks and makes the target before the
// runtime mounts on it.
//
// Written with x/sys/unix's openat2 rather than a path library such as
// filepath-securejoin: securejoin resolves symbolic links inside the
// root, where this refuses them, so that a link left by a workload
// stops the start instead of moving the mount. RealDir makes an image's
// mount points the same way (for the jail and the OCI mechanism alike):
// whatever the image left on the path is replaced, never followed.
package mountpath

import (
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// resolve is how every component is looked up: never through a symbolic
// link (the last component included: O_PATH without O_NOFOLLOW), never
// above the directory the lookup starts from.
const resolve = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS

// OpenSource opens the host path src (already resolved) O_PATH, refusing
// a symbolic link anywhere on it.
func OpenSource(src string) (int, error) {
	fd, err := unix.Openat2(unix.AT_FDCWD, src, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err == unix.ELOOP {
		return -1, fmt.Errorf("mount source %s: a symbolic link is on its path now (it was resolved when the sandbox was made); refused", src)
	}
	if err != nil {
		return -1, fmt.Errorf("mount source %s: %w", src, err)
	}
	return fd, nil
}

// IsDir reports whether fd is a directory.
func IsDir(fd int) (bool, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return false, err
	}
	return st.Mode&unix.S_IFMT == unix.S_IFDIR, nil
}

// Walk opens rel (a slash-separated path, leading slashes ignored)
// beneath the directory rfd one component at a time, never through a
// symbolic link, and returns an O_PATH descriptor. With mk it makes the
// missing components: directories, and the last one a directory when
// dir, else an empty file (mode 0755 and 0644, the caller's owner). The
// last component must be a directory when dir, else not one. shown is
// how the path is named in errors (the sandbox's view of it).
func Walk(rfd int, rel string, dir, mk bool, shown string) (int, error) {
	parts := strings.Split(strings.Trim(rel, "/"), "/")
	cur, err := unix.FcntlInt(uintptr(rfd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if len(parts) == 1 && parts[0] == "" {
		return cur, nil
	}
	for i, name := range parts {
		last := i == len(parts)-1
		where := strings.TrimSuffix(shown, strings.Join(parts[i+1:], "/"))
		where = strings.TrimSuffix(where, "/")
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
			return -1, fmt.Errorf("mount target %s: %s is a symbolic link in the sandbox's tree; a mount is never made through one (remove it, or choose another target)", shown, where)
		case err == unix.EROFS:
			return -1, fmt.Errorf("mount target %s: %s cannot be made, its directory is read-only in the sandbox (mount on an existing directory, or beneath the home or /tmp)", shown, where)
		case err == unix.ENOENT:
			return -1, fmt.Errorf("mount target %s: %s does not exist", shown, where)
		case err != nil:
			return -1, fmt.Errorf("mount target %s: %s: %w", shown, where, err)
		}
		isDir, err := IsDir(fd)
		if err != nil {
			unix.Close(fd)
			return -1, err
		}
		if (!last || dir) && !isDir {
			unix.Close(fd)
			return -1, fmt.Errorf("mount target %s: %s is not a directory", shown, where)
		}
		if last && !dir && isDir {
			unix.Close(fd)
			return -1, fmt.Errorf("mount target %s is a directory and the source a file", shown)
		}
		cur = fd
	}
	return cur, nil
}

// openBeneath opens the one component name in the directory dfd.
func openBeneath(dfd int, name string) (int, error) {
	for {
		fd, err := unix.Openat2(dfd, name, &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: resolve})
		if err == unix.EAGAIN || err == unix.EINTR {
			continue // a rename elsewhere on the file system raced the lookup
		}
		return fd, err
	}
}

// RealDir makes root+p a directory of the tree, each component checked
// without following links: whatever else the image has there goes (in the
// upper layer), so no mount and no write below it can be sent elsewhere.
// A directory it makes has mode (past the umask) and is owned by host id
// own (own:own) unless own < 0. The jail and the OCI mechanism both build
// an image's mount points with it.
func RealDir(root, p string, mode uint32, own int) error {
	cur := root
	for _, el := range strings.Split(strings.Trim(p, "/"), "/") {
		cur += "/" + el
		var st unix.Stat_t
		err := unix.Lstat(cur, &st)
		if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
			continue
		}
		if err == nil {
			if err := os.RemoveAll(cur); err != nil {
				return err
			}
		} else if err != unix.ENOENT {
			return err
		}
		if err := unix.Mkdir(cur, mode); err != nil {
			return fmt.Errorf("mkdir %s: %w", cur, err)
		}
		if err := unix.Chmod(cur, mode); err != nil { // past the umask
			return err
		}
		if own >= 0 {
			if err := unix.Lchown(cur, own, own); err != nil {
				return err
			}
		}
	}
	return nil
}
