package local

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// homeRel maps a sandbox path (absolute under /home/sprite, or relative to
// it) to a path relative to the home directory, or an InvalidError.
func homeRel(p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", sandbox.Invalid("path", "empty path or NUL byte")
	}
	if !path.IsAbs(p) {
		p = path.Join(mechanism.Home, p)
	}
	clean := path.Clean(p)
	if clean == mechanism.Home {
		return ".", nil
	}
	if !strings.HasPrefix(clean, mechanism.Home+"/") {
		return "", sandbox.Invalid("path", p+" is outside "+mechanism.Home+", the sandbox's writable home")
	}
	return strings.TrimPrefix(clean, mechanism.Home+"/"), nil
}

// owner is the uid and gid the sandbox's files belong to: a mechanism
// that gives each sandbox ids of its own (the jail's uid ranges) says
// which with OwnerOf.
func (p *Provider) owner(m mechanism.Mechanism, iid, home string) (int, int) {
	if o, ok := m.(interface{ OwnerOf(id string) (int, int) }); ok {
		return o.OwnerOf(iid)
	}
	if o, ok := m.(interface{ Owner() (int, int) }); ok {
		return o.Owner()
	}
	if st, err := os.Stat(home); err == nil {
		if s, ok := st.Sys().(*syscall.Stat_t); ok {
			return int(s.Uid), int(s.Gid)
		}
	}
	return os.Getuid(), os.Getgid()
}

func fileErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrNotExist):
		return sandbox.ErrNotFound
	case strings.Contains(err.Error(), "escapes"), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV),
		errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.EISDIR), errors.Is(err, unix.ENOTDIR):
		return sandbox.Invalid("path", err.Error())
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "file", Err: err}
}

// WriteFile writes data at path inside the sandbox's home, creating parent
// directories. An absolute path outside the home (/tmp, the image's tree)
// is written from inside the sandbox, as its user, where the mechanism
// isolates the sandbox's files, and is Invalid where it does not (trusted):
// files_outside.go. It replaces the file (a new file renamed over the old one),
// so it never writes through a hard link, and a reader sees the old data
// or the new, never half. A relative path that escapes the home through
// "../", a path under it that escapes it through a symlink, or one where
// something other than a regular file is (a directory, a symlink, a fifo),
// is Invalid.
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, name string, data []byte, opts sandbox.WriteFileOptions) error {
	return p.WriteFileFrom(ctx, h, name, bytes.NewReader(data), opts)
}

// WriteFileFrom is WriteFile from a stream (sandbox.FileStreamWriter):
// the bytes go to the new file through a 64 KiB buffer, whatever their
// size; a read error from src (a client gone, a body over its bound)
// removes the new file, leaves the old one and is returned as it is.
func (p *Provider) WriteFileFrom(ctx context.Context, h *sandbox.Handle, name string, src io.Reader, opts sandbox.WriteFileOptions) error {
	r, dir, err := p.handle(h)
	if err != nil {
		return err
	}
	if abs, ok := outsideHome(name); ok { // files_outside.go
		m, err := p.mechFor(r)
		if err != nil {
			return mechErr("write_file", err)
		}
		if !isolatesFiles(m) {
			return outsideRefused(abs, m)
		}
		return p.writeOutside(ctx, r, dir, m, abs, src, opts)
	}
	rel, err := homeRel(name)
	if err != nil {
		return err
	}
	if rel == "." {
		return sandbox.Invalid("path", "the home directory itself is not a file")
	}
	if err := r.refuseMounted(rel); err != nil { // mounts.go
		return err
	}
	m, err := p.mechFor(r)
	if err != nil {
		return mechErr("write_file", err)
	}
	home := p.homeDir(r.InstanceID)
	uid, gid := p.owner(m, r.InstanceID, home)
	root, err := os.OpenRoot(home)
	if err != nil {
		return fileErr(err)
	}
	defer root.Close()
	if dir := path.Dir(rel); dir != "." {
		// Create missing parents one by one so each gets the sandbox's owner.
		cur := ""
		for _, part := range strings.Split(dir, "/") {
			cur = path.Join(cur, part)
			if err := root.Mkdir(cur, 0o755); err == nil {
				_ = root.Lchown(cur, uid, gid)
			} else if !errors.Is(err, fs.ErrExist) {
				return fileErr(err)
			}
		}
	}
	mode := opts.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	// The data goes to a new file that then replaces the old one: never
	// through what is at the path, which the sandbox chose (a hard link
	// to a host file, under the trusted mechanism; a fifo, whose open
	// would wait), and a reader never sees half of it.
	if fi, err := root.Lstat(rel); err == nil && !fi.Mode().IsRegular() {
		return sandbox.Invalid("path", name+" is not a regular file")
	}
	tmp := path.Join(path.Dir(rel), ".managoat-write-"+newID())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fileErr(err)
	}
	var srcErr error
	_, err = io.CopyBuffer(f, readerOnly{ctx, src, &srcErr}, make([]byte, streamBuf))
	if err == nil {
		err = f.Chown(uid, gid)
	}
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, rel)
	}
	if err != nil {
		_ = root.Remove(tmp)
		if srcErr != nil {
			return srcErr
		}
		return fileErr(err)
	}
	return nil
}

// streamBuf is the buffer a streamed read or write holds.
const streamBuf = 64 << 10

// readerOnly hides src's WriterTo (io.CopyBuffer would use it, and its
// buffer), notes src's own error apart from the file's, and stops at
// ctx's end.
type readerOnly struct {
	ctx context.Context
	r   io.Reader
	err *error
}

func (r readerOnly) Read(b []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		*r.err = err
		return 0, err
	}
	n, err := r.r.Read(b)
	if err != nil && err != io.EOF {
		*r.err = err
	}
	return n, err
}

// MaxReadFile is the largest file ReadFile returns: a bigger one is
// Invalid (file_too_large) rather than a heap the size of the file; read
// it through OpenFile (a stream), HostPath, or a command, instead.
const MaxReadFile = 1 << 30

// ReadFile reads a regular file inside the sandbox's home (an absolute
// path outside it as WriteFile does: files_outside.go); escapes, and
// anything but a regular file, are Invalid, a missing file ErrNotFound.
// The result holds the file, so a file over MaxReadFile is refused before
// a byte is read; OpenFile streams one of any size.
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, name string) ([]byte, error) {
	rc, size, err := p.OpenFile(ctx, h, name)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > MaxReadFile {
		return nil, sandbox.Invalid("file_too_large", fmt.Sprintf("%s has %d bytes, more than ReadFile's %d", name, size, MaxReadFile))
	}
	// The buffer grows with what is read (the size is the sandbox's to
	// change while this reads), never ahead of it.
	b, err := io.ReadAll(rc)
	if err != nil {
		return nil, fileErr(err)
	}
	return b, nil
}

// OpenFile opens a regular file inside the sandbox's home for a streamed
// read (sandbox.FileOpener): escapes, and anything but a regular file, are
// Invalid, a missing file ErrNotFound. The reader yields at most size
// bytes, the file's length when opened, and holds no buffer of its own.
func (p *Provider) OpenFile(ctx context.Context, h *sandbox.Handle, name string) (io.ReadCloser, int64, error) {
	r, dir, err := p.handle(h)
	if err != nil {
		return nil, 0, err
	}
	if abs, ok := outsideHome(name); ok { // files_outside.go
		m, err := p.mechFor(r)
		if err != nil {
			return nil, 0, mechErr("read_file", err)
		}
		if !isolatesFiles(m) {
			return nil, 0, outsideRefused(abs, m)
		}
		return p.openOutside(ctx, r, dir, m, abs)
	}
	rel, err := homeRel(name)
	if err != nil {
		return nil, 0, err
	}
	if err := r.refuseMounted(rel); err != nil { // mounts.go
		return nil, 0, err
	}
	root, err := os.OpenRoot(p.homeDir(r.InstanceID))
	if err != nil {
		return nil, 0, fileErr(err)
	}
	defer root.Close()
	f, fi, err := openRegular(root, rel)
	if err != nil {
		if errors.Is(err, errNotRegular) {
			return nil, 0, sandbox.Invalid("path", name+" is not a regular file")
		}
		return nil, 0, fileErr(err)
	}
	return &limitedFile{f: f, r: io.LimitReader(f, fi.Size())}, fi.Size(), nil
}

var errNotRegular = errors.New("not a regular file")

// openRegular opens rel under root for reading, a regular file only.
// O_NONBLOCK: the open of a fifo returns at once, to be refused; no
// controlling terminal is taken from a device.
func openRegular(root *os.Root, rel string) (*os.File, fs.FileInfo, error) {
	f, err := root.OpenFile(rel, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, errNotRegular
	}
	return f, fi, nil
}

type limitedFile struct {
	f *os.File
	r io.Reader
}

func (l *limitedFile) Read(b []byte) (int, error) { return l.r.Read(b) }
func (l *limitedFile) Close() error               { return l.f.Close() }

// ExportTree writes a tar stream of the file or directory at name in the
// sandbox's home (sandbox.TreeExporter), read by this process through a
// root confined to the home, so no program of the sandbox's makes it
// (`managoat cp` out of a sandbox uses it; the sandbox can put a tar of
// its own first on PATH). The top entry is name's base; directories and
// regular files carry their permission bits (set-id and sticky dropped)
// and modification times, each file at most the size it had when opened;
// symlinks are kept as links (the copy's reader judges where they lead);
// fifos, sockets and devices are left out; hard links become files of
// their own. A path outside the home, one reached through a symlink out
// of it, or one at, beneath or above a host mount (the host's view of the
// home has an empty mount point there), is ErrNotSupported before
// anything is written: cp then falls back to a
// tar in the sandbox, whose stream it checks entry by entry.
func (p *Provider) ExportTree(ctx context.Context, h *sandbox.Handle, name string, w io.Writer) error {
	r, _, err := p.handle(h)
	if err != nil {
		return err
	}
	rel, err := homeRel(name)
	if err != nil {
		return sandbox.ErrNotSupported
	}
	if _, _, ok := r.mountAt(rel); ok {
		return sandbox.ErrNotSupported
	}
	for _, m := range r.Mounts {
		if below, ok := strings.CutPrefix(m.Target, path.Join(mechanism.Home, rel)+"/"); ok && below != "" || rel == "." {
			return sandbox.ErrNotSupported
		}
	}
	root, err := os.OpenRoot(p.homeDir(r.InstanceID))
	if err != nil {
		return fileErr(err)
	}
	defer root.Close()
	// The top is named as the caller named it (cp's "." stays ".").
	top := path.Base(path.Clean(name))
	if top == "/" {
		top = "."
	}
	if _, err := root.Lstat(rel); err != nil {
		var ie *sandbox.InvalidError
		if err := fileErr(err); errors.As(err, &ie) {
			// A parent that is a symlink out of the home (to /tmp, which
			// the sandbox sees and the host does not): the sandbox's own
			// view is needed.
			return sandbox.ErrNotSupported
		}
		return fileErr(err)
	}
	tw := tar.NewWriter(w)
	buf := make([]byte, streamBuf)
	err = fs.WalkDir(root.FS(), rel, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		name := top
		if p != rel {
			name = top + "/" + strings.TrimPrefix(p, rel+"/")
			if rel == "." {
				name = top + "/" + p
			}
		}
		switch t := d.Type(); {
		case t.IsDir():
			fi, err := root.Lstat(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX})
		case t&fs.ModeSymlink != 0:
			target, err := root.Readlink(p)
			if err != nil {
				return err
			}
			fi, err := root.Lstat(p)
			if err != nil {
				return err
			}
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: fi.ModTime(), Format: tar.FormatPAX})
		case t.IsRegular():
			f, fi, err := openRegular(root, p)
			if errors.Is(err, errNotRegular) {
				return nil // replaced meanwhile by something cp does not copy
			}
			if err != nil {
				return err
			}
			defer f.Close()
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: fi.Size(), Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime(), Format: tar.FormatPAX}); err != nil {
				return err
			}
			n, err := io.CopyBuffer(tw, io.LimitReader(f, fi.Size()), buf)
			if err == nil && n < fi.Size() {
				err = fmt.Errorf("%s shrank while it was read", path.Join(mechanism.Home, p))
			}
			return err
		}
		return nil // fifos, sockets, devices
	})
	if err != nil {
		return fileErr(err)
	}
	return tw.Close()
}

// HostPath maps a path under the sandbox's home to the host file backing
// it; any other path is returned unchanged.
func (p *Provider) HostPath(h *sandbox.Handle, name string) string {
	if sandbox.CheckHandle(h, Name) != nil {
		return name
	}
	r, _, err := p.load(h.Name)
	if err != nil {
		return name
	}
	rel, err := homeRel(name)
	if err != nil {
		return name
	}
	if m, below, ok := r.mountAt(rel); ok { // mounts.go
		return filepath.Join(m.Source, filepath.FromSlash(below))
	}
	return filepath.Join(p.homeDir(r.InstanceID), filepath.FromSlash(rel))
}

func (p *Provider) checkpointsDir(iid string) string {
	return filepath.Join(p.instanceDir(iid), "checkpoints")
}

func validCheckpointID(id string) bool {
	if id == "" || len(id) > 128 || strings.HasPrefix(id, ".") {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// CreateCheckpoint snapshots the sandbox's home and returns the
// checkpoint's id. Files are reflinked where the file system can, else
// copied with their holes kept; owners, permission bits, times and
// symlinks are kept; setuid and setgid bits, hard links between files
// (each becomes a file of its own), sockets, fifos and devices are not.
// The copy never leaves the home, whatever the sandbox renames while it
// runs (copytree.go).
func (p *Provider) CreateCheckpoint(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOptions) (string, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return "", err
	}
	id := "cp-" + time.Now().UTC().Format("20060102T150405") + "-" + newID()[:8]
	dir := p.checkpointsDir(r.InstanceID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", stateErr("checkpoint", err)
	}
	tmp := filepath.Join(dir, "."+id)
	if err := snapshot(ctx, p.homeDir(r.InstanceID), tmp); err != nil {
		os.RemoveAll(tmp)
		return "", stateErr("checkpoint", err)
	}
	if opts.Comment != "" {
		_ = os.WriteFile(tmp+".comment", []byte(opts.Comment), 0o600)
		_ = os.Rename(tmp+".comment", filepath.Join(dir, id+".comment"))
	}
	if err := os.Rename(tmp, filepath.Join(dir, id)); err != nil {
		os.RemoveAll(tmp)
		return "", stateErr("checkpoint", err)
	}
	return id, nil
}

// CreateCheckpointOnce is the bounded checkpoint creation correlated to a
// host operation id: the checkpoint is "op-<OperationID>", made once (an
// operation id already used answers its checkpoint again), within
// opts.Timeout (default 30 s, at most 120 s; expiry is
// Unavailable{checkpoint_timeout} and leaves no checkpoint).
func (p *Provider) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOnceOptions) (string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return "", err
	}
	if !validOperationID(opts.OperationID) {
		return "", sandbox.Invalid("checkpoint_operation_id", "operation id must match ^[A-Za-z0-9_-]{1,128}$")
	}
	timeout := opts.Timeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	if timeout < time.Millisecond || timeout > 120*time.Second {
		return "", sandbox.Invalid("checkpoint_timeout", "timeout must be between 1 ms and 120 s")
	}
	r, _, err := p.load(h.Name)
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	id := "op-" + opts.OperationID
	dir := p.checkpointsDir(r.InstanceID)
	final := filepath.Join(dir, id)
	if st, err := os.Stat(final); err == nil && st.IsDir() {
		return id, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", stateErr("checkpoint", err)
	}
	tmp := filepath.Join(dir, "."+id+"-"+newID())
	if err := snapshot(ctx, p.homeDir(r.InstanceID), tmp); err != nil {
		os.RemoveAll(tmp)
		if ctx.Err() != nil {
			return "", sandbox.Unavailable("checkpoint_timeout", err)
		}
		return "", stateErr("checkpoint", err)
	}
	_ = os.WriteFile(filepath.Join(dir, id+".comment"), []byte("sandbox-operation:"+opts.OperationID), 0o600)
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		if st, serr := os.Stat(final); serr == nil && st.IsDir() {
			return id, nil // a concurrent call of the same operation made it
		}
		return "", stateErr("checkpoint", err)
	}
	return id, nil
}

func validOperationID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return false
		}
	}
	return true
}

// RestoreCheckpoint replaces the home's contents with checkpoint id's. An
// unknown id is ErrNotFound; a restore that failed part-way is
// RestoreFailed.
func (p *Provider) RestoreCheckpoint(ctx context.Context, h *sandbox.Handle, id string) error {
	r, _, err := p.handle(h)
	if err != nil {
		return err
	}
	if !validCheckpointID(id) {
		return sandbox.Invalid("checkpoint", "malformed checkpoint id")
	}
	src := filepath.Join(p.checkpointsDir(r.InstanceID), id)
	if st, err := os.Stat(src); err != nil || !st.IsDir() {
		return sandbox.ErrNotFound
	}
	if err := restore(ctx, src, p.homeDir(r.InstanceID)); err != nil {
		return &sandbox.RestoreFailedError{Detail: err.Error()}
	}
	return nil
}

// Checkpoints lists the sandbox's checkpoint ids, oldest first.
func (p *Provider) Checkpoints(ctx context.Context, h *sandbox.Handle) ([]string, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(p.checkpointsDir(r.InstanceID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, stateErr("checkpoint", err)
	}
	ids := []string{}
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}
