package main

import (
	"archive/tar"
	"bytes"
	"context"
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

// cp moves files as a tar stream through a tar(1) that runs in the
// sandbox, as docker cp does through the container's file system: so it
// copies directories both ways, keeps modes and modification times,
// reaches any path the sandbox's user may read or write (not only the
// home), and works on every provider that can run a command with stdin
// (the runner's included), with no file API of the provider's. It needs a
// tar in the sandbox, which every image the providers start has.

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
	var stderr bytes.Buffer
	code, err := pump(ctx, cmd, out, &stderr)
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
func download(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, src, dst string) error {
	clean := path.Clean(src)
	argv := []string{"tar", "-c", "-f", "-", "-C", path.Dir(clean), path.Base(clean)}
	if dst == "-" {
		return inSandbox(ctx, reg, h, argv, nil, os.Stdout)
	}
	dir, rename := dst, ""
	if st, err := os.Stat(dst); err != nil || !st.IsDir() {
		dir, rename = filepath.Dir(dst), filepath.Base(dst)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := extractTar(pr, root, path.Base(clean), rename)
		pr.CloseWithError(err)
		if err == nil {
			_, _ = io.Copy(io.Discard, pr)
		}
		done <- err
	}()
	err = inSandbox(ctx, reg, h, argv, nil, pw)
	pw.CloseWithError(err)
	if xerr := <-done; err == nil {
		err = xerr
	}
	return err
}

// extractTar writes a tar stream's entries under root, each made with its
// mode and modification time; the top entry (named top) is renamed to
// rename when that is set. root confines every write: an entry or a link
// leading out of it fails.
func extractTar(r io.Reader, root *os.Root, top, rename string) error {
	tr := tar.NewReader(r)
	type dirTime struct {
		name string
		hdr  *tar.Header
	}
	var dirs []dirTime
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(hdr.Name)
		if rename != "" {
			if name == top {
				name = rename
			} else if rest, ok := strings.CutPrefix(name, top+"/"); ok {
				name = rename + "/" + rest
			}
		}
		if !fs.ValidPath(name) {
			return fmt.Errorf("tar entry %q leaves the destination", hdr.Name)
		}
		mode := fs.FileMode(hdr.Mode).Perm() | fs.FileMode(hdr.Mode)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
				return err
			}
			dirs = append(dirs, dirTime{name, hdr})
		case tar.TypeReg:
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := root.Chmod(name, mode); err != nil {
				return err
			}
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return err
			}
		default:
			// Devices, fifos and hard links are not copied out of a sandbox.
			continue
		}
	}
	// Directories last, deepest first, so their entries did not change them.
	for i := len(dirs) - 1; i >= 0; i-- {
		d := dirs[i]
		mode := fs.FileMode(d.hdr.Mode).Perm()
		if err := root.Chmod(d.name, mode); err != nil {
			return err
		}
		_ = root.Chtimes(d.name, d.hdr.ModTime, d.hdr.ModTime)
	}
	return nil
}
