package main

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// cp moves files as a tar stream, as docker cp does: so it copies
// directories both ways, keeps modes and modification times, reaches any
// path the sandbox's user may read or write (not only the home), and
// works on every provider that can run a command with stdin (the
// runner's included), with no file API of the provider's.
//
// Into a sandbox, a tar(1) in the sandbox extracts the stream: what it
// does there is the sandbox's own business.
//
// Out of a sandbox, the stream is the sandbox's, and hostile: a sandbox
// can put a tar of its own first on PATH (~/.local/bin/tar) and send any
// entry it likes. So the stream is written by code the sandbox cannot
// replace wherever the provider can (sandbox.TreeExporter: provider/local
// reads the home from the host through a root confined to it), else by
// the sandbox's tar; and either way the host writes only the named
// destination: the file, or the tree under the named directory. An entry
// outside it (../x, /etc/x, .bashrc beside the file), a second entry after
// a file, a device node or a fifo, a symlink that is absolute or resolves
// out of the copy (chained or not), or a hard link to anything but a file
// of the copy fails the copy; set-id and sticky bits are dropped; files
// are written aside and renamed into place (never through a host hard
// link or fifo already there), a new directory is made aside and renamed
// into place whole, so a refused copy leaves nothing, and one merged
// into an existing directory leaves nothing outside it and none of its
// symlinks. Runs of zeros become holes (a sparse or zero-filled file
// costs the host no disk), the sandbox's stderr is kept to 64 KiB, and a
// stream that goes on past the archive's end is cut off. NAME:PATH - (a
// tar on stdout) passes on only entries that pass the same checks.

func cmdCp(g *globals, fs *flag.FlagSet) action {
	return func(ctx context.Context, args []string) error {
		pos, rest, err := positionals(fs, args, 2, "SRC and DST")
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		src, dst := pos[0], pos[1]
		sName, sPath, sIn := sandboxPath(src)
		dName, dPath, dIn := sandboxPath(dst)
		if sIn == dIn {
			return usageError{msg: "exactly one of SRC and DST must be NAME:PATH (- is a tar stream on stdin or stdout)"}
		}
		name := sName
		if dIn {
			name = dName
		}
		reg, h, err := handleFor(g, name)
		if err != nil {
			return err
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		if dIn {
			return wrap("cp to "+dst, upload(ctx, reg, h, src, dPath))
		}
		return wrap("cp from "+src, download(ctx, reg, h, sPath, dst))
	}
}

// sandboxPath splits NAME:PATH; a path with no colon, one starting with a
// dot or a slash (./a:b, /x:y), or "-" is the host's.
func sandboxPath(s string) (name, p string, in bool) {
	if s == "-" || strings.HasPrefix(s, "/") || strings.HasPrefix(s, ".") {
		return "", s, false
	}
	name, p, in = strings.Cut(s, ":")
	if in && p == "" {
		p = "."
	}
	return name, p, in
}

// inSandbox runs argv in the sandbox with stdin from in (nil: none) and
// its stdout to out; a non-zero exit is an error carrying tar's stderr,
// classified (no such file: not_found; permission denied: denied).
func inSandbox(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, argv []string, in io.Reader, out io.Writer) error {
	cmd, err := reg.Spawn(ctx, h, sandbox.Cmd{Name: argv[0], Args: argv[1:]}, sandbox.SpawnOptions{Stdin: in != nil})
	if err != nil {
		return err
	}
	defer func() { _ = cmd.Stop() }()
	if in != nil {
		go forwardStdin(ctx, cmd, in)
	}
	stderr := &cappedBuffer{max: maxStderr}
	code, err := pump(ctx, cmd, out, stderr)
	if err != nil {
		return err
	}
	if code == 0 {
		return nil
	}
	// tar's first complaint, one line (the rest follow from it).
	msg, _, _ := strings.Cut(strings.TrimSpace(stderr.String()), "\n")
	msg = strings.TrimPrefix(msg, "tar: ")
	if msg == "" {
		msg = fmt.Sprintf("%s exited %d", argv[0], code)
	}
	switch {
	case strings.Contains(msg, "No such file or directory"):
		return fmt.Errorf("%s: %w", msg, sandbox.ErrNotFound)
	case strings.Contains(msg, "Permission denied"), strings.Contains(msg, "Read-only file system"):
		return &sandbox.DeniedError{Reason: "path: " + msg}
	}
	return sandbox.Invalid("path", msg)
}

// isDir reports whether p is a directory in the sandbox.
func isDir(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, p string) (bool, error) {
	res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "test", Args: []string{"-d", p}}, sandbox.ExecOptions{})
	if err != nil {
		return false, err
	}
	return res.ExitCode == 0, nil
}

// upload copies the host's src (a file or a directory; "-": a tar stream
// on stdin) to dst in the sandbox: into dst when it is a directory, else
// as dst.
func upload(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, src, dst string) error {
	if src == "-" {
		// docker cp - NAME:DIR: the stream is extracted into DIR.
		return inSandbox(ctx, reg, h, []string{"tar", "-x", "-p", "-f", "-", "-C", dst}, os.Stdin, io.Discard)
	}
	st, err := os.Lstat(src)
	if err != nil {
		return err
	}
	into, err := isDir(ctx, reg, h, dst)
	if err != nil {
		return err
	}
	// Into an existing directory the copy keeps its own name; otherwise it
	// is dst, made in dst's parent.
	dir, top := dst, filepath.Base(filepath.Clean(src))
	if !into {
		dir, top = path.Dir(dst), path.Base(dst)
		if st.IsDir() || path.Dir(dst) != "." {
			if err := inSandbox(ctx, reg, h, []string{"mkdir", "-p", dir}, nil, io.Discard); err != nil {
				return err
			}
		}
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, src, top)) }()
	err = inSandbox(ctx, reg, h, []string{"tar", "-x", "-p", "-f", "-", "-C", dir}, pr, io.Discard)
	pr.CloseWithError(io.ErrClosedPipe)
	return err
}

// writeTar writes the tree at src as a tar stream whose top entry is
// named top; symlinks are kept as links.
func writeTar(w io.Writer, src, top string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		rel, _ := filepath.Rel(src, p)
		hdr.Name = filepath.ToSlash(filepath.Join(top, rel))
		if info.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", 0, 0
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// download copies src in the sandbox (a file or a directory) to the
// host's dst ("-": a tar stream on stdout): into dst when it is a
// directory, else as dst.
//
// The tar stream comes from outside the sandbox where the provider can
// read it there (sandbox.TreeExporter: provider/local reads the home
// through a root confined to it), else from a tar(1) in the sandbox,
// which the sandbox may have replaced (a tar of its own first on PATH).
// Either way every entry is checked (see tarCheck) and the host gets
// only the named destination: a stream that names anything else, or a
// device, a fifo, a link leading out of the copy, fails the copy with
// nothing written outside the destination (and, for a destination that
// did not exist, nothing at all).
func download(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, src, dst string) error {
	clean := path.Clean(src)
	dir, top := path.Dir(clean), path.Base(clean)
	if top == "/" {
		dir, top = "/", "."
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	produce := func(w io.Writer) error {
		err := reg.ExportTree(ctx, h, clean, w)
		if !errors.Is(err, sandbox.ErrNotSupported) {
			return err
		}
		return inSandbox(ctx, reg, h, []string{"tar", "-c", "-f", "-", "-C", dir, top}, nil, w)
	}
	var consume func(io.Reader) error
	if dst == "-" {
		consume = func(r io.Reader) error { return filterTar(r, os.Stdout, top) }
	} else {
		target := dst
		if st, err := os.Stat(dst); err == nil && st.IsDir() {
			base := top
			if base == "." {
				base = "root"
			}
			target = filepath.Join(dst, base)
		}
		consume = func(r io.Reader) error { return extractTo(r, target, top) }
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := consume(pr)
		if err == nil || errors.Is(err, errNoEntry) {
			// What follows the archive's end (a tar pads to its record
			// size) is read and dropped, up to a bound: a producer that
			// goes on past it is cut off.
			// (An empty archive is what a tar that failed writes: its
			// exit says why.)
			if n, _ := io.Copy(io.Discard, io.LimitReader(pr, maxTrailer+1)); n > maxTrailer {
				err = fmt.Errorf("the sandbox sent more than %d bytes after the archive's end", maxTrailer)
			}
		}
		if err != nil && !errors.Is(err, errNoEntry) {
			cancel() // a refused stream ends the producer, however long it would go on
		}
		pr.CloseWithError(cmpErr(err, io.ErrClosedPipe))
		done <- err
	}()
	err := produce(pw)
	pw.CloseWithError(cmpErr(err, io.EOF))
	xerr := <-done
	if err != nil && !errors.Is(err, context.Canceled) && (xerr == nil || !errors.Is(err, xerr)) {
		return err // the producer's own failure (no such file, denied), which ended the stream
	}
	if xerr != nil {
		return xerr // the refusal, not the producer's end it caused
	}
	return err
}

func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

var errNoEntry = errors.New("the sandbox sent no entry")

// maxTrailer bounds what cp reads and drops after a tar stream's end.
const maxTrailer = 1 << 20

// maxStderr bounds what cp keeps of a sandbox command's stderr.
const maxStderr = 64 << 10

// cappedBuffer keeps the first max bytes written to it and drops the rest.
type cappedBuffer struct {
	bytes.Buffer
	max int
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	if room := c.max - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

// tarCheck reads a tar stream from a sandbox as hostile: each entry must
// be the copy's top (named top; "." copies a whole tree, whose entries are
// all below it) or below it, without "..", absolute names or NULs; the
// first entry is the top; a top that is a file is the only entry; the
// types are directories, regular files, symlinks whose target is relative
// and stays in the copy, and hard links to a regular file earlier in the
// copy. Devices, fifos and everything else are refused; modes keep their
// permission bits only (never set-id or sticky).
type tarCheck struct {
	top     string
	n       int
	topKind byte
	files   map[string]bool // regular files so far, the only hard-link targets
}

// maxLinkTargets bounds the regular files a copy remembers as hard-link
// targets (a hostile stream of tiny files would otherwise grow it).
const maxLinkTargets = 1 << 20

// rel is name relative to the copy's top ("." for the top itself).
func (c *tarCheck) rel(name string) (string, error) {
	if name == "" || strings.IndexByte(name, 0) >= 0 || strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("tar entry %q is not in the copy of %s", name, c.top)
	}
	clean := path.Clean(name)
	var r string
	switch {
	case c.top == ".":
		r = clean
	case clean == c.top:
		r = "."
	default:
		rest, ok := strings.CutPrefix(clean, c.top+"/")
		if !ok {
			return "", fmt.Errorf("tar entry %q is not in the copy of %s", name, c.top)
		}
		r = rest
	}
	if !fs.ValidPath(r) {
		return "", fmt.Errorf("tar entry %q leaves the copy of %s", name, c.top)
	}
	return r, nil
}

// next checks one header and returns its path relative to the top; skip
// is true for a header that carries no file (a pax global header).
func (c *tarCheck) next(hdr *tar.Header) (rel string, skip bool, err error) {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return "", true, nil
	}
	rel, err = c.rel(hdr.Name)
	if err != nil {
		return "", false, err
	}
	c.n++
	if c.n == 1 {
		if rel != "." {
			return "", false, fmt.Errorf("tar entry %q comes before the copy's top %s", hdr.Name, c.top)
		}
		c.topKind = hdr.Typeflag
	} else if c.topKind != tar.TypeDir {
		return "", false, fmt.Errorf("tar entry %q follows %s, a file: a file's copy is one entry", hdr.Name, c.top)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		if rel == "." && c.n > 1 {
			return "", true, nil // the top again: nothing to make
		}
	case tar.TypeReg:
		if c.files == nil {
			c.files = map[string]bool{}
		}
		if len(c.files) < maxLinkTargets {
			c.files[rel] = true
		}
		if hdr.Size < 0 {
			return "", false, fmt.Errorf("tar entry %q has a negative size", hdr.Name)
		}
	case tar.TypeSymlink:
		if rel == "." {
			return "", false, fmt.Errorf("%s is a symbolic link: copy what it points to", c.top)
		}
		t := hdr.Linkname
		if t == "" || strings.IndexByte(t, 0) >= 0 || path.IsAbs(t) || !fs.ValidPath(path.Clean(path.Join(path.Dir(rel), t))) {
			return "", false, fmt.Errorf("tar entry %q is a symbolic link to %q, outside the copy of %s", hdr.Name, t, c.top)
		}
	case tar.TypeLink:
		t, err := c.rel(hdr.Linkname)
		if err != nil || !c.files[t] || rel == "." {
			return "", false, fmt.Errorf("tar entry %q is a hard link to %q, not a file of the copy of %s", hdr.Name, hdr.Linkname, c.top)
		}
		if len(c.files) < maxLinkTargets {
			c.files[rel] = true
		}
	case tar.TypeChar, tar.TypeBlock:
		return "", false, fmt.Errorf("tar entry %q is a device node: devices are not copied out of a sandbox", hdr.Name)
	case tar.TypeFifo:
		return "", false, fmt.Errorf("tar entry %q is a fifo: fifos are not copied out of a sandbox", hdr.Name)
	default:
		return "", false, fmt.Errorf("tar entry %q has type %q, which cp does not copy out of a sandbox", hdr.Name, hdr.Typeflag)
	}
	return rel, false, nil
}

// perm is an entry's mode as it lands on the host: permission bits only.
func perm(hdr *tar.Header) fs.FileMode { return fs.FileMode(hdr.Mode).Perm() }

// filterTar copies a sandbox's tar stream to w (cp NAME:PATH -), each
// entry checked as extractTo checks it, set-id and sticky bits dropped.
func filterTar(r io.Reader, w io.Writer, top string) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	c := &tarCheck{top: top}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if _, skip, err := c.next(hdr); err != nil {
			return err
		} else if skip {
			continue
		}
		out := &tar.Header{Typeflag: hdr.Typeflag, Name: hdr.Name, Linkname: hdr.Linkname, Size: hdr.Size,
			Mode: int64(perm(hdr)), ModTime: hdr.ModTime, Format: tar.FormatPAX}
		if hdr.Typeflag != tar.TypeReg {
			out.Size = 0
		}
		if err := tw.WriteHeader(out); err != nil {
			return err
		}
		if out.Size > 0 {
			if _, err := io.CopyN(tw, tr, out.Size); err != nil {
				return err
			}
		}
	}
	if c.n == 0 {
		return fmt.Errorf("%w for %s", errNoEntry, top)
	}
	return tw.Close()
}

// extractTo writes a sandbox's tar stream of top as target on the host:
// a file replaces target (written aside, then renamed over it); a
// directory becomes target when target does not exist (made aside, then
// renamed into place, so a refused stream leaves nothing) or is merged
// into target when it is a directory already (a refused stream then
// leaves what it wrote inside target, and none of its symlinks). Every
// write goes through a root confined to the copy, and through no file
// that was there (a file is written aside and renamed over it), so a host
// hard link or a fifo in target is never written through.
func extractTo(r io.Reader, target, top string) error {
	tr := tar.NewReader(r)
	c := &tarCheck{top: top}
	hdr, err := tr.Next()
	for err == nil && hdr.Typeflag == tar.TypeXGlobalHeader {
		hdr, err = tr.Next()
	}
	if err == io.EOF {
		return fmt.Errorf("%w for %s", errNoEntry, top)
	}
	if err != nil {
		return err
	}
	if _, _, err := c.next(hdr); err != nil {
		return err
	}
	parent, base := filepath.Dir(target), filepath.Base(target)
	proot, err := os.OpenRoot(parent)
	if err != nil {
		return err
	}
	defer proot.Close()
	st, statErr := proot.Lstat(base)
	if statErr != nil && !errors.Is(statErr, fs.ErrNotExist) {
		return statErr
	}
	exists := statErr == nil
	if hdr.Typeflag == tar.TypeReg {
		if exists && !st.Mode().IsRegular() {
			return fmt.Errorf("%s exists and is not a regular file", target)
		}
		if err := writeFileIn(proot, base, tr, hdr); err != nil {
			return err
		}
		// A file's copy is one entry: anything after it is refused, the
		// copy with it.
		if next, err := tr.Next(); err != io.EOF {
			if err == nil {
				_, _, err = c.next(next)
			}
			if err == nil {
				err = fmt.Errorf("tar entry %q follows the file %s", next.Name, top)
			}
			_ = proot.Remove(base)
			return err
		}
		return nil
	}
	// A directory (c.next allowed no other top).
	dirName, fresh := base, !exists
	if exists && !st.IsDir() {
		return fmt.Errorf("%s exists and is not a directory", target)
	}
	if fresh {
		dirName = "." + base + ".managoat-cp-" + randSuffix()
		if err := proot.Mkdir(dirName, 0o700); err != nil {
			return err
		}
	}
	root, err := proot.OpenRoot(dirName)
	if err != nil {
		return err
	}
	x := &extraction{root: root, check: c}
	err = x.run(tr)
	if err != nil && !fresh {
		x.undoLinks()
	}
	root.Close()
	if err != nil {
		if fresh {
			_ = proot.RemoveAll(dirName)
		}
		return err
	}
	if fresh {
		if err := proot.Chmod(dirName, perm(hdr)); err != nil {
			_ = proot.RemoveAll(dirName)
			return err
		}
		_ = proot.Chtimes(dirName, hdr.ModTime, hdr.ModTime)
		// Rename refuses to replace a directory that appeared meanwhile
		// unless it is empty; a file or a symlink there is refused here.
		if st, err := proot.Lstat(base); err == nil && !st.IsDir() {
			_ = proot.RemoveAll(dirName)
			return fmt.Errorf("%s appeared during the copy", target)
		}
		if err := proot.Rename(dirName, base); err != nil {
			_ = proot.RemoveAll(dirName)
			return err
		}
	}
	return nil
}

// extraction is one directory's extraction under root.
type extraction struct {
	root  *os.Root
	check *tarCheck
	links []string // the symlinks made, removed again if the copy fails
}

func (x *extraction) run(tr *tar.Reader) error {
	type dirTime struct {
		name string
		hdr  *tar.Header
	}
	dirs := []dirTime{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name, skip, err := x.check.next(hdr)
		if err != nil {
			return err
		}
		if skip {
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := x.root.Mkdir(name, 0o700); err != nil {
				if !errors.Is(err, fs.ErrExist) {
					return err
				}
				if st, err := x.root.Lstat(name); err != nil || !st.IsDir() {
					return fmt.Errorf("tar entry %q: a directory where something else is", hdr.Name)
				}
			}
			if len(dirs) < maxLinkTargets {
				dirs = append(dirs, dirTime{name, hdr})
			}
		case tar.TypeReg:
			if err := writeFileIn(x.root, name, tr, hdr); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := x.replaceable(name); err != nil {
				return err
			}
			if err := x.root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
			x.links = append(x.links, name)
		case tar.TypeLink:
			old, _ := x.check.rel(hdr.Linkname)
			if fi, err := x.root.Lstat(old); err != nil || !fi.Mode().IsRegular() {
				return fmt.Errorf("tar entry %q is a hard link to %q, not a file of the copy", hdr.Name, hdr.Linkname)
			}
			if err := x.replaceable(name); err != nil {
				return err
			}
			if err := x.root.Link(old, name); err != nil {
				return err
			}
		}
	}
	// Every symlink resolves inside the copy, however they chain ("a" ->
	// "b/..", "b" -> "."): the root refuses a resolution that leaves it.
	for _, l := range x.links {
		if _, err := x.root.Stat(l); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("the symbolic link %s leads out of the copy: %w", l, err)
		}
	}
	// Directories last, deepest first, so their entries did not change
	// them. (The root follows a symlink that replaced one, inside the
	// copy.)
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		if err := x.root.Chmod(d.name, perm(d.hdr)); err != nil {
			return err
		}
		_ = x.root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
	}
	return nil
}

// replaceable removes a file or symlink at name, so a link can be made
// there; a directory there is an error.
func (x *extraction) replaceable(name string) error {
	fi, err := x.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return fmt.Errorf("%s: a link where a directory is", name)
	}
	return x.root.Remove(name)
}

func (x *extraction) undoLinks() {
	for _, l := range x.links {
		if fi, err := x.root.Lstat(l); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			_ = x.root.Remove(l)
		}
	}
}

// writeFileIn writes a regular file's entry as name under root: to a new
// file beside it, renamed over name at the end, so nothing at name (a
// hard link, a fifo) is written through and a failed copy leaves what was
// there. Blocks of zeros become holes, so a sparse file stays sparse and
// a stream of zeros costs the host no disk.
func writeFileIn(root *os.Root, name string, r io.Reader, hdr *tar.Header) error {
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		return fmt.Errorf("%s: a file where a directory is", name)
	}
	tmp := path.Join(path.Dir(name), ".managoat-cp-"+randSuffix())
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = copySparse(f, r, hdr.Size)
	if err == nil {
		err = f.Chmod(perm(hdr))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		_ = root.Chtimes(tmp, hdr.ModTime, hdr.ModTime)
		err = root.Rename(tmp, name)
	}
	if err != nil {
		_ = root.Remove(tmp)
	}
	return err
}

// copySparse copies exactly size bytes of r to f, seeking over blocks of
// zeros.
func copySparse(f *os.File, r io.Reader, size int64) error {
	buf := make([]byte, 64<<10)
	var off int64
	for off < size {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if n > 0 {
			if !allZero(buf[:n]) {
				if _, werr := f.WriteAt(buf[:n], off); werr != nil {
					return werr
				}
			}
			off += int64(n)
		}
		if err != nil {
			if err == io.EOF || err == io.ErrUnexpectedEOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return f.Truncate(size)
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func randSuffix() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
