package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The checkpoint copy works on directory descriptors, not paths. A
// snapshot reads the sandbox's home and a restore writes it while the
// sandbox may run: a path walk (filepath.WalkDir, os.Mkdir, os.Open)
// resolves every component again, so a directory the sandbox swaps for a
// symlink to a host directory between two steps sends the copy out of the
// home, reading host files into the snapshot or writing the snapshot's
// files, modes and owners onto the host. Here every step is an *at call
// relative to a directory opened with O_NOFOLLOW, so whatever the sandbox
// renames meanwhile, the copy stays in the trees it opened. os.Root would
// confine each path to the home, but it re-resolves paths too, and a
// descriptor walk is as short.

// maxTreeDepth bounds the nesting a copy descends (two descriptors per
// level are open at once).
const maxTreeDepth = 2048

// copyChunk is how much a copy moves between two looks at its context.
const copyChunk = 8 << 20

// openDirAt opens the directory name in dir without following a symlink.
func openDirAt(dir *os.File, name string) (*os.File, error) {
	fd, err := unix.Openat(int(dir.Fd()), name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: name, Err: err}
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openDir opens the directory at path (a host path the sandbox does not
// control) without following a final symlink.
func openDir(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: path, Err: err}
	}
	return os.NewFile(uintptr(fd), path), nil
}

// changed reports an entry that vanished or changed type between the
// listing and its opening: the tree is live, and the copy skips it.
func changed(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR)
}

// copyDir copies the contents of src into dst, both open directories:
// subdirectories, regular files (reflinked where the file system can,
// else copied with their holes kept) and symlinks (as links, never
// followed), with owners, permission bits and times. Setuid and setgid
// bits are not kept; sockets, fifos and devices are not copied.
func copyDir(ctx context.Context, src, dst *os.File, depth int) error {
	if depth > maxTreeDepth {
		return fmt.Errorf("%s: more than %d nested directories", src.Name(), maxTreeDepth)
	}
	names, err := src.Readdirnames(-1)
	if err != nil {
		return err
	}
	sfd, dfd := int(src.Fd()), int(dst.Fd())
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(sfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			if changed(err) {
				continue
			}
			return &fs.PathError{Op: "stat", Path: n, Err: err}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			err = copySubdir(ctx, src, dst, n, depth)
		case unix.S_IFREG:
			err = copyFileAt(ctx, src, dst, n)
		case unix.S_IFLNK:
			err = copySymlinkAt(sfd, dfd, n, &st)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func copySubdir(ctx context.Context, src, dst *os.File, name string, depth int) error {
	sub, err := openDirAt(src, name)
	if err != nil {
		if changed(err) {
			return nil
		}
		return err
	}
	defer sub.Close()
	var st unix.Stat_t // of what was opened, not of what was listed
	if err := unix.Fstat(int(sub.Fd()), &st); err != nil {
		return err
	}
	if err := unix.Mkdirat(int(dst.Fd()), name, 0o700); err != nil {
		return &fs.PathError{Op: "mkdir", Path: name, Err: err}
	}
	out, err := openDirAt(dst, name)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := copyDir(ctx, sub, out, depth+1); err != nil {
		return err
	}
	return setAttrs(int(out.Fd()), &st) // last: the copy changed its times
}

// setAttrs gives the open file fd st's owner, permission bits and times.
func setAttrs(fd int, st *unix.Stat_t) error {
	if err := unix.Fchown(fd, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, st.Mode&0o1777); err != nil {
		return err
	}
	return futimens(fd, st.Atim, st.Mtim)
}

// futimens sets fd's times to the nanosecond: utimensat(fd, NULL, ...),
// which x/sys/unix does not wrap (its Futimes has microseconds only).
func futimens(fd int, atime, mtime unix.Timespec) error {
	ts := [2]unix.Timespec{atime, mtime}
	_, _, errno := unix.Syscall6(unix.SYS_UTIMENSAT, uintptr(fd), 0, uintptr(unsafe.Pointer(&ts[0])), 0, 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

func copySymlinkAt(sfd, dfd int, name string, st *unix.Stat_t) error {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(sfd, name, buf)
	if err != nil {
		if changed(err) || errors.Is(err, unix.EINVAL) { // EINVAL: no longer a symlink
			return nil
		}
		return &fs.PathError{Op: "readlink", Path: name, Err: err}
	}
	if err := unix.Symlinkat(string(buf[:n]), dfd, name); err != nil {
		return &fs.PathError{Op: "symlink", Path: name, Err: err}
	}
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func copyFileAt(ctx context.Context, src, dst *os.File, name string) error {
	// O_NONBLOCK: what was listed as a file may be a fifo by now, and its
	// open must not wait for a writer.
	fd, err := unix.Openat(int(src.Fd()), name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		if changed(err) {
			return nil
		}
		return &fs.PathError{Op: "open", Path: name, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil
	}
	out, err := unix.Openat(int(dst.Fd()), name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return &fs.PathError{Op: "create", Path: name, Err: err}
	}
	defer unix.Close(out)
	if unix.IoctlFileClone(out, fd) != nil {
		if err := copyData(ctx, fd, out, st.Size); err != nil {
			return fmt.Errorf("copy %s: %w", name, err)
		}
	}
	return setAttrs(out, &st)
}

// copyData copies the first size bytes of in to out, skipping holes
// (SEEK_DATA/SEEK_HOLE): a sparse file stays sparse instead of filling
// the disk with zeros. It looks at ctx every copyChunk bytes.
func copyData(ctx context.Context, in, out int, size int64) error {
	end := size
	var buf []byte // for copies the kernel will not do, made on the first
	for off := int64(0); off < end; {
		data, err := unix.Seek(in, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		hole := end
		if err != nil {
			data = off // no SEEK_DATA here: copy it all
		} else if h, err := unix.Seek(in, data, unix.SEEK_HOLE); err == nil && h < end {
			hole = h
		}
		for data < hole {
			if err := ctx.Err(); err != nil {
				return err
			}
			n, err := copyRange(in, out, data, min(hole-data, copyChunk), &buf)
			if err != nil {
				return err
			}
			if n == 0 { // the file shrank under the copy
				end = data
				break
			}
			data += n
		}
		off = hole
	}
	return unix.Ftruncate(out, end)
}

// copyRange copies up to n bytes at off from in to out, in the kernel
// when it can, else through *buf (made once per file).
func copyRange(in, out int, off, n int64, buf *[]byte) (int64, error) {
	roff, woff := off, off
	c, err := unix.CopyFileRange(in, &roff, out, &woff, int(n), 0)
	if err == nil {
		return int64(c), nil
	}
	if !errors.Is(err, unix.EXDEV) && !errors.Is(err, unix.ENOSYS) && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.EOPNOTSUPP) {
		return 0, err
	}
	if *buf == nil {
		*buf = make([]byte, 1<<20)
	}
	b := (*buf)[:min(n, int64(len(*buf)))]
	r, err := unix.Pread(in, b, off)
	if err != nil || r == 0 {
		return 0, err
	}
	w, err := unix.Pwrite(out, b[:r], off)
	return int64(w), err
}

// snapshot copies the contents of the directory home into dst, a new
// directory (private to root) made for them.
func snapshot(ctx context.Context, home, dst string) error {
	src, err := openDir(home)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	out, err := openDir(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	return copyDir(ctx, src, out, 0)
}

// restore replaces the contents of the directory home with those of the
// snapshot src. The home itself stays: it may be mounted in a running
// sandbox.
func restore(ctx context.Context, src, home string) error {
	d, err := openDir(home)
	if err != nil {
		return err
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := removeTree(ctx, d, n); err != nil { // never follows a symlink
			return err
		}
	}
	in, err := openDir(src)
	if err != nil {
		return err
	}
	defer in.Close()
	return copyDir(ctx, in, d, 0)
}

// removeAll is os.RemoveAll(path) for a tree a sandbox may have made,
// through removeTree.
func removeAll(ctx context.Context, path string) error {
	parent, err := openDir(filepath.Dir(path))
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	defer parent.Close()
	return removeTree(ctx, parent, filepath.Base(path))
}

// removeTree removes name in dir, and everything under it, never following
// a symlink, with at most three descriptors open at once. os.RemoveAll
// holds one per level, so a tree deeper than the descriptor limit (which
// a sandbox makes with mkdir d && cd d, over and over) makes it fail, and
// with it every restore and every removal of that sandbox. Here a
// directory that is not empty has its subdirectories' contents lifted
// into it, under names of their own: one level goes per pass.
func removeTree(ctx context.Context, dir *os.File, name string) error {
	dfd := int(dir.Fd())
	for lifted := 0; ; {
		err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
		switch {
		case err == nil, errors.Is(err, unix.ENOENT):
			return nil
		case errors.Is(err, unix.ENOTDIR):
			if err := unix.Unlinkat(dfd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return &fs.PathError{Op: "unlink", Path: name, Err: err}
			}
			return nil
		case !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST):
			return &fs.PathError{Op: "rmdir", Path: name, Err: err}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		sub, err := openDirAt(dir, name)
		if err != nil {
			if changed(err) {
				continue // gone or replaced: look again
			}
			return err
		}
		names, err := sub.Readdirnames(-1)
		moved := false
		if err == nil {
			lifted, moved, err = emptyOneLevel(sub, names, lifted)
		}
		sub.Close()
		if err != nil {
			return err
		}
		if !moved { // an entry that can be neither removed nor lifted
			return &fs.PathError{Op: "remove", Path: name, Err: unix.ENOTEMPTY}
		}
	}
}

// emptyOneLevel removes what it can of names in dir (files, symlinks,
// empty directories) and lifts the contents of the other directories into
// dir, named .managoat-rm-<n> from n on; it returns the next n, and
// whether it removed or lifted anything.
func emptyOneLevel(dir *os.File, names []string, n int) (int, bool, error) {
	dfd := int(dir.Fd())
	moved := false
	for _, c := range names {
		if unix.Unlinkat(dfd, c, 0) == nil || unix.Unlinkat(dfd, c, unix.AT_REMOVEDIR) == nil {
			moved = true
			continue
		}
		child, err := openDirAt(dir, c)
		if err != nil {
			if changed(err) {
				continue
			}
			return n, moved, err
		}
		grand, err := child.Readdirnames(-1)
		for _, g := range grand {
			if err != nil {
				break
			}
			for {
				n++
				err = unix.Renameat2(int(child.Fd()), g, dfd, fmt.Sprintf(".managoat-rm-%d", n), unix.RENAME_NOREPLACE)
				if !errors.Is(err, unix.EEXIST) {
					break
				}
			}
			if err == nil {
				moved = true
			} else if errors.Is(err, unix.ENOENT) {
				err = nil
			}
		}
		child.Close()
		if err != nil {
			return n, moved, err
		}
	}
	return n, moved, nil
}
