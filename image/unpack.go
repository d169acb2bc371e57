package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Whiteout markers of the OCI image layer format (and Docker's).
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// unpacker applies layers, in order, to one directory: the flattened root
// of an image. Every path a layer names is resolved by the kernel with
// openat2(RESOLVE_IN_ROOT) against the root's descriptor, so neither a
// "../" in a name nor a symlink the image made (absolute or relative,
// planted by this layer or an earlier one) can lead outside the root:
// the kernel treats the root as "/" for the walk. Names with a ".."
// element are refused outright (no image needs one); device nodes are
// skipped (the sandbox gets its own /dev; a node in an image could open
// a host device); hard links may only point at something inside the root.
type unpacker struct {
	root  int // O_PATH descriptor of the root directory
	chown bool
	// created holds the paths this layer made (with their parents), for
	// an opaque whiteout that comes after some of them.
	created map[string]bool
	// dirCache is the last parent directory opened.
	dirName string
	dirFD   int
	skipped int // device nodes left out
	// bytesLeft and entriesLeft are what the image's bounds leave of
	// the bytes of file content and the entries still to unpack
	// (maxBytes and maxEntries, set by newUnpacker's caller; both
	// unbounded by default).
	bytesLeft, entriesLeft int64
	maxBytes, maxEntries   int64
	// streamLeft is what is left of the uncompressed bytes the layers'
	// streams may take: their content, a header's worth per entry and
	// some (setBounds); what a decompressor would otherwise spend hours
	// on, a tar followed by terabytes of zeros, is refused.
	streamLeft int64
}

// Overhead the layer streams of an image may carry beyond their files'
// content: per entry (its header, padding and a long name's PAX
// record) and in all (end-of-archive blocks, the odd large PAX record).
const (
	streamPerEntry = 4 << 10
	streamSlack    = 16 << 20
)

// setBounds bounds the unpacker to maxBytes of file content and
// maxEntries entries (math.MaxInt64: none).
func (u *unpacker) setBounds(maxBytes, maxEntries int64) {
	u.bytesLeft, u.entriesLeft, u.maxBytes, u.maxEntries = maxBytes, maxEntries, maxBytes, maxEntries
	u.streamLeft = math.MaxInt64
	if maxBytes < math.MaxInt64/4 && maxEntries < math.MaxInt64/(4*streamPerEntry) {
		u.streamLeft = maxBytes + maxEntries*streamPerEntry + streamSlack
	}
}

// streamBound counts the uncompressed bytes of the layers read through
// it against the unpacker's streamLeft.
type streamBound struct {
	r io.Reader
	u *unpacker
}

func (b *streamBound) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if b.u.streamLeft -= int64(n); b.u.streamLeft < 0 {
		return n, &BoundError{Bound: "MaxBytes", What: "its layers' uncompressed streams are far longer than their files (data after the archive's end, or headers without files)", Limit: b.u.maxBytes}
	}
	return n, err
}

func newUnpacker(dir string) (*unpacker, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	u := &unpacker{root: fd, chown: os.Geteuid() == 0, dirFD: -1}
	u.setBounds(math.MaxInt64, math.MaxInt64)
	return u, nil
}

func (u *unpacker) close() {
	u.dropDir()
	unix.Close(u.root)
}

func (u *unpacker) dropDir() {
	if u.dirFD >= 0 {
		unix.Close(u.dirFD)
	}
	u.dirFD, u.dirName = -1, ""
}

// LayerError is a layer refused for an entry it holds.
type LayerError struct {
	Entry  string
	Reason string
}

func (e *LayerError) Error() string {
	return fmt.Sprintf("image layer entry %q refused: %s", e.Entry, e.Reason)
}

// cleanName turns a tar entry name into a path relative to the root, or
// refuses it.
func cleanName(name string) (string, error) {
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", &LayerError{Entry: name, Reason: "a path with .. elements"}
		}
	}
	p := strings.TrimPrefix(path.Clean("/"+name), "/")
	if strings.ContainsRune(p, 0) {
		return "", &LayerError{Entry: name, Reason: "a NUL in the name"}
	}
	return p, nil
}

func resolveInRoot(root int, p string, flags int) (int, error) {
	if p == "" {
		p = "."
	}
	return unix.Openat2(root, p, &unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
}

// parent returns a descriptor of p's parent directory inside the root
// (made, with the directories above it, when missing) and p's last
// element. The descriptor belongs to the unpacker's cache.
func (u *unpacker) parent(p string) (int, string, error) {
	dir, base := path.Split(p)
	dir = strings.TrimSuffix(dir, "/")
	if base == "" || base == "." || base == ".." {
		return -1, "", &LayerError{Entry: p, Reason: "no file name"}
	}
	if dir == u.dirName && u.dirFD >= 0 {
		return u.dirFD, base, nil
	}
	u.dropDir()
	fd, err := resolveInRoot(u.root, dir, unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		if err = u.mkdirAll(dir); err == nil {
			fd, err = resolveInRoot(u.root, dir, unix.O_PATH|unix.O_DIRECTORY)
		}
	}
	if err != nil {
		return -1, "", fmt.Errorf("open %s in the image root: %w", dir, err)
	}
	u.dirName, u.dirFD = dir, fd
	return fd, base, nil
}

// mkdirAll makes dir and the directories above it, each resolved in the
// root.
func (u *unpacker) mkdirAll(dir string) error {
	cur := ""
	for _, el := range strings.Split(dir, "/") {
		if el == "" {
			continue
		}
		pfd, err := resolveInRoot(u.root, cur, unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return err
		}
		err = unix.Mkdirat(pfd, el, 0o755)
		unix.Close(pfd)
		if err != nil && err != unix.EEXIST {
			return err
		}
		cur = path.Join(cur, el)
		u.created[cur] = true
	}
	return nil
}

// removeAt removes name under dirfd, a directory with everything in it.
// Nothing is followed: a symlink is removed, not its target.
func removeAt(dirfd int, name string) error {
	err := unix.Unlinkat(dirfd, name, 0)
	if err == nil || err == unix.ENOENT {
		return nil
	}
	if err != unix.EISDIR && err != unix.EPERM {
		return err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	names, err := f.Readdirnames(-1)
	if err == nil {
		for _, n := range names {
			if err = removeAt(fd, n); err != nil {
				break
			}
		}
	}
	f.Close()
	if err != nil {
		return err
	}
	return unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
}

// markCreated records p and its parents as made by this layer.
func (u *unpacker) markCreated(p string) {
	for p != "" && p != "." && !u.created[p] {
		u.created[p] = true
		p = path.Dir(p)
	}
}

// apply unpacks one layer's tar stream. Whiteouts remove what earlier
// layers put there.
func (u *unpacker) apply(r io.Reader) error {
	u.created = map[string]bool{}
	defer u.dropDir()
	tr := tar.NewReader(r)
	buf := make([]byte, 256<<10)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read layer: %w", err)
		}
		if u.entriesLeft--; u.entriesLeft < 0 {
			return &BoundError{Bound: "MaxEntries", What: fmt.Sprintf("its layers hold more than %d entries", u.maxEntries), Limit: u.maxEntries}
		}
		p, err := cleanName(h.Name)
		if err != nil {
			return err
		}
		if p == "" {
			continue // the root itself
		}
		base := path.Base(p)
		if base == whiteoutOpaque {
			if err := u.opaque(path.Dir(p)); err != nil {
				return err
			}
			continue
		}
		if strings.HasPrefix(base, whiteoutPrefix) {
			wh := strings.TrimPrefix(base, whiteoutPrefix)
			if wh == "" || wh == "." || wh == ".." {
				return &LayerError{Entry: h.Name, Reason: "a whiteout of no file"}
			}
			target := path.Join(path.Dir(p), wh)
			pfd, name, err := u.parent(target)
			if err != nil {
				return err
			}
			if err := removeAt(pfd, name); err != nil {
				return fmt.Errorf("whiteout %s: %w", target, err)
			}
			u.dropDir()
			continue
		}
		if err := u.entry(tr, h, p, buf); err != nil {
			return err
		}
	}
}

// opaque removes from dir whatever this layer did not make (an opaque
// directory hides the lower layers' content, to any depth).
func (u *unpacker) opaque(dir string) error {
	fd, err := resolveInRoot(u.root, dir, unix.O_RDONLY|unix.O_DIRECTORY)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("opaque %s: %w", dir, err)
	}
	defer u.dropDir()
	return u.prune(fd, dir)
}

// prune takes ownership of fd.
func (u *unpacker) prune(fd int, dir string) error {
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	for _, n := range names {
		p := path.Join(dir, n)
		if !u.created[p] {
			if err := removeAt(fd, n); err != nil {
				return fmt.Errorf("opaque %s: %w", p, err)
			}
			continue
		}
		cfd, err := unix.Openat(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			continue // not a directory
		}
		if err := u.prune(cfd, p); err != nil {
			return err
		}
	}
	return nil
}

// clear makes room for a new entry at name: anything there goes, but a
// directory that a directory replaces stays (its content merges).
func clearFor(pfd int, name string, dir bool) (exists bool, err error) {
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if err == unix.ENOENT {
			return false, nil
		}
		return false, err
	}
	if dir && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return true, nil
	}
	return false, removeAt(pfd, name)
}

func (u *unpacker) entry(tr *tar.Reader, h *tar.Header, p string, buf []byte) error {
	mode := uint32(h.Mode) & 0o7777
	switch h.Typeflag {
	case tar.TypeDir:
		pfd, name, err := u.parent(p)
		if err != nil {
			return err
		}
		exists, err := clearFor(pfd, name, true)
		if err != nil {
			return err
		}
		if !exists {
			if err := unix.Mkdirat(pfd, name, 0o700); err != nil {
				return fmt.Errorf("mkdir %s: %w", p, err)
			}
		} else if u.dirName == p || strings.HasPrefix(u.dirName, p+"/") {
			u.dropDir()
		}
		u.markCreated(p)
		return u.attrs(pfd, name, h, mode, false)
	case tar.TypeReg:
		if h.Size > u.bytesLeft {
			return bytesBound("its layers unpack to", u.maxBytes)
		}
		pfd, name, err := u.parent(p)
		if err != nil {
			return err
		}
		// Create first, as tar does: whatever is there is looked at only
		// when the name is taken.
		const flags = unix.O_CREAT | unix.O_EXCL | unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
		fd, err := unix.Openat(pfd, name, flags, 0o600)
		if err == unix.EEXIST {
			if _, err = clearFor(pfd, name, false); err == nil {
				fd, err = unix.Openat(pfd, name, flags, 0o600)
			}
		}
		if err != nil {
			return fmt.Errorf("create %s: %w", p, err)
		}
		f := os.NewFile(uintptr(fd), p)
		// The header's size is what the tar reader yields (a sparse
		// file's holes as zeros, which are written): at most bytesLeft.
		n, err := io.CopyBuffer(fileWriter{f}, tr, buf)
		u.bytesLeft -= n
		if err == nil {
			err = u.fileAttrs(fd, h, mode)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", p, err)
		}
		u.markCreated(p)
		return nil
	case tar.TypeSymlink:
		pfd, name, err := u.parent(p)
		if err != nil {
			return err
		}
		if _, err := clearFor(pfd, name, false); err != nil {
			return err
		}
		// The link is made as written: inside the sandbox "/" is the
		// image's root; here nothing ever follows it out (RESOLVE_IN_ROOT).
		if err := unix.Symlinkat(h.Linkname, pfd, name); err != nil {
			return fmt.Errorf("symlink %s: %w", p, err)
		}
		u.markCreated(p)
		return u.attrs(pfd, name, h, 0, true)
	case tar.TypeLink:
		target, err := cleanName(h.Linkname)
		if err != nil || target == "" {
			return &LayerError{Entry: h.Name, Reason: "a hard link to " + h.Linkname}
		}
		tdir, tbase := path.Split(target)
		tfd, err := resolveInRoot(u.root, strings.TrimSuffix(tdir, "/"), unix.O_PATH|unix.O_DIRECTORY)
		if err != nil {
			return fmt.Errorf("hard link %s to %s: %w", p, target, err)
		}
		defer unix.Close(tfd)
		pfd, name, err := u.parent(p)
		if err != nil {
			return err
		}
		if _, err := clearFor(pfd, name, false); err != nil {
			return err
		}
		// No AT_SYMLINK_FOLLOW: a symlink target is linked itself, never
		// followed out of the root.
		if err := unix.Linkat(tfd, tbase, pfd, name, 0); err != nil {
			return fmt.Errorf("hard link %s to %s: %w", p, target, err)
		}
		u.markCreated(p)
		return nil
	case tar.TypeFifo:
		pfd, name, err := u.parent(p)
		if err != nil {
			return err
		}
		if _, err := clearFor(pfd, name, false); err != nil {
			return err
		}
		if err := unix.Mkfifoat(pfd, name, 0o600); err != nil {
			return fmt.Errorf("mkfifo %s: %w", p, err)
		}
		u.markCreated(p)
		return u.attrs(pfd, name, h, mode, false)
	case tar.TypeChar, tar.TypeBlock:
		u.skipped++ // never a device node from an image
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	default:
		return nil // other kinds (GNU sparse, ...) carry no file
	}
}

// fileAttrs is attrs for a regular file open at fd (three system calls
// on the descriptor rather than three path walks).
func (u *unpacker) fileAttrs(fd int, h *tar.Header, mode uint32) error {
	if u.chown {
		if err := unix.Fchown(fd, h.Uid, h.Gid); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(fd, mode); err != nil { // after chown, which clears set-id bits
		return err
	}
	if !h.ModTime.IsZero() && !h.ModTime.Before(time.Unix(0, 0)) {
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		_ = unix.UtimesNanoAt(fd, "", ts, unix.AT_EMPTY_PATH)
	}
	return nil
}

// attrs sets ownership (as root), mode and modification time of name.
func (u *unpacker) attrs(pfd int, name string, h *tar.Header, mode uint32, link bool) error {
	if u.chown {
		if err := unix.Fchownat(pfd, name, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("chown %s: %w", name, err)
		}
	}
	if !link {
		// After chown, which clears set-id bits.
		if err := unix.Fchmodat(pfd, name, mode, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", name, err)
		}
	}
	if !h.ModTime.IsZero() && h.Typeflag != tar.TypeDir {
		ts := []unix.Timespec{unix.NsecToTimespec(h.ModTime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
		if h.ModTime.Before(time.Unix(0, 0)) {
			ts[0], ts[1] = unix.Timespec{}, unix.Timespec{}
		}
		_ = unix.UtimesNanoAt(pfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	return nil
}

// fileWriter hides *os.File's ReadFrom, which would probe for
// copy_file_range and sendfile on a tar reader for nothing.
type fileWriter struct{ f *os.File }

func (w fileWriter) Write(b []byte) (int, error) { return w.f.Write(b) }
