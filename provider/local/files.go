package local

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
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

// owner is the uid and gid the sandbox's files belong to.
func (p *Provider) owner(m mechanism.Mechanism, home string) (int, int) {
	if o, ok := m.(interface{ Owner() (int, int) }); ok {
		return o.Owner()
	}
	if st, err := os.Stat(home); err == nil {
		if s, ok := st.Sys().(*unix.Stat_t); ok {
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
	case strings.Contains(err.Error(), "escapes"), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EXDEV):
		return sandbox.Invalid("path", err.Error())
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "file", Err: err}
}

// WriteFile writes data at path inside the sandbox's home, creating parent
// directories. A path outside the home, or one that escapes it through
// "../" or a symlink, is Invalid.
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, name string, data []byte, opts sandbox.WriteFileOptions) error {
	r, _, err := p.handle(h)
	if err != nil {
		return err
	}
	rel, err := homeRel(name)
	if err != nil {
		return err
	}
	if rel == "." {
		return sandbox.Invalid("path", "the home directory itself is not a file")
	}
	m, err := p.mechFor(r)
	if err != nil {
		return mechErr("write_file", err)
	}
	home := p.homeDir(r.InstanceID)
	uid, gid := p.owner(m, home)
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
	f, err := root.OpenFile(rel, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_NOFOLLOW, mode)
	if err != nil {
		return fileErr(err)
	}
	_ = f.Chown(uid, gid)
	_ = f.Chmod(mode)
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fileErr(err)
	}
	return fileErr(f.Close())
}

// ReadFile reads a file inside the sandbox's home; escapes are Invalid,
// a missing file ErrNotFound.
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, name string) ([]byte, error) {
	r, _, err := p.handle(h)
	if err != nil {
		return nil, err
	}
	rel, err := homeRel(name)
	if err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(p.homeDir(r.InstanceID))
	if err != nil {
		return nil, fileErr(err)
	}
	defer root.Close()
	b, err := root.ReadFile(rel)
	return b, fileErr(err)
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

// CreateCheckpoint snapshots the sandbox's home (with reflinks where the
// filesystem allows, else a copy) and returns the checkpoint's id.
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
	if err := copyTree(ctx, p.homeDir(r.InstanceID), tmp); err != nil {
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
	if err := copyTree(ctx, p.homeDir(r.InstanceID), tmp); err != nil {
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
	home := p.homeDir(r.InstanceID)
	// The home may be bind-mounted into a running sandbox: replace its
	// contents, never the directory itself.
	ents, err := os.ReadDir(home)
	if err != nil {
		return &sandbox.RestoreFailedError{Detail: err.Error()}
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(home, e.Name())); err != nil {
			return &sandbox.RestoreFailedError{Detail: err.Error()}
		}
	}
	ents, err = os.ReadDir(src)
	if err != nil {
		return &sandbox.RestoreFailedError{Detail: err.Error()}
	}
	for _, e := range ents {
		if err := copyTree(ctx, filepath.Join(src, e.Name()), filepath.Join(home, e.Name())); err != nil {
			return &sandbox.RestoreFailedError{Detail: err.Error()}
		}
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

// copyTree copies src to dst (which must not exist), keeping modes,
// owners and symlinks; regular files are reflinked when the filesystem
// can (FICLONE), else copied.
func copyTree(ctx context.Context, src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, _ := info.Sys().(*unix.Stat_t)
		chown := func() {
			if st != nil {
				_ = os.Lchown(target, int(st.Uid), int(st.Gid))
			}
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			chown()
			_ = os.Chmod(target, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(l, target); err != nil {
				return err
			}
			chown()
		case info.Mode().IsRegular():
			if err := copyFile(p, target, info.Mode().Perm()); err != nil {
				return err
			}
			chown()
			_ = os.Chmod(target, info.Mode().Perm())
		default:
			// sockets, fifos, devices: not part of a snapshot
		}
		return nil
	})
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return out.Close()
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
