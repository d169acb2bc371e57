package sandbox

import (
	"bytes"
	"context"
	"io"
	"strings"
)

// Streamed files. FileReader and Provider.WriteFile move a whole file as
// one []byte, so a caller holds the file in memory; a provider that can
// stream implements the optional FileOpener and FileStreamWriter, and a
// caller that serves files to others (the platform's file API, the
// runner daemon) uses the Registry's OpenFile and WriteFileFrom, which
// stream through those where the provider has them and fall back to the
// whole-file calls where it has not.
//
// TreeExporter is the other half of the boundary: a provider that can
// read a sandbox's files from outside the sandbox, with code the sandbox
// cannot replace (provider/local reads the home through a root confined
// to it), writes a tar stream of a file or a directory, so that `managoat
// cp` out of the sandbox never runs a tar(1) the sandbox put on its PATH.
// Whatever the stream's producer, its consumer treats every entry as
// hostile (cmd/managoat's cp writes only under the named destination).

// FileOpener is implemented by providers that stream a sandbox's file:
// the reader yields its bytes and size is its length when opened (the
// reader stops there even if the file grows). The caller closes it. The
// errors are ReadFile's: a missing file ErrNotFound, an escape or
// anything but a regular file Invalid.
type FileOpener interface {
	OpenFile(ctx context.Context, h *Handle, path string) (rc io.ReadCloser, size int64, err error)
}

// FileStreamWriter is implemented by providers that write a sandbox's
// file from a stream, holding a bounded buffer whatever its size. It
// replaces the file as WriteFile does; a read error from r leaves the old
// file (or none) in place and is returned as it is.
type FileStreamWriter interface {
	WriteFileFrom(ctx context.Context, h *Handle, path string, r io.Reader, opts WriteFileOptions) error
}

// TreeExporter is implemented by providers that write, from outside the
// sandbox, a tar stream of the file or directory at path: its top entry
// is path's base name, directories and regular files carry their
// permission bits (never set-id), symlinks are kept as links, and nothing
// else (devices, fifos, sockets) is in it. A path the provider cannot read
// from outside (beyond its home, under a mount) is ErrNotSupported,
// answered before anything is written, so the caller can fall back.
type TreeExporter interface {
	ExportTree(ctx context.Context, h *Handle, path string, w io.Writer) error
}

func checkPath(path string) error {
	if path == "" || strings.IndexByte(path, 0) >= 0 {
		return Invalid("path", "empty path or a path with NUL")
	}
	return nil
}

// OpenFile opens a file of the sandbox for reading: streamed where the
// provider is a FileOpener, else read whole through FileReader (size is
// then what was read); ErrNotSupported when it is neither.
func (r *Registry) OpenFile(ctx context.Context, h *Handle, path string) (io.ReadCloser, int64, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, 0, err
	}
	if err := checkPath(path); err != nil {
		return nil, 0, err
	}
	if fo, ok := p.(FileOpener); ok {
		return fo.OpenFile(ctx, h, path)
	}
	fr, ok := p.(FileReader)
	if !ok {
		return nil, 0, ErrNotSupported
	}
	b, err := fr.ReadFile(ctx, h, path)
	if err != nil {
		return nil, 0, err
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

// WriteFileFrom writes the file from src: streamed where the provider is
// a FileStreamWriter, else read whole and given to WriteFile, so the
// caller bounds src (http.MaxBytesReader, io.LimitReader) either way.
func (r *Registry) WriteFileFrom(ctx context.Context, h *Handle, path string, src io.Reader, opts WriteFileOptions) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	if err := checkPath(path); err != nil {
		return err
	}
	if fw, ok := p.(FileStreamWriter); ok {
		return fw.WriteFileFrom(ctx, h, path, src, opts)
	}
	data, err := io.ReadAll(src)
	if err != nil {
		return err
	}
	return p.WriteFile(ctx, h, path, data, opts)
}

// ExportTree writes a tar stream of path from outside the sandbox where
// the provider is a TreeExporter; ErrNotSupported otherwise.
func (r *Registry) ExportTree(ctx context.Context, h *Handle, path string, w io.Writer) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	if err := checkPath(path); err != nil {
		return err
	}
	te, ok := p.(TreeExporter)
	if !ok {
		return ErrNotSupported
	}
	return te.ExportTree(ctx, h, path, w)
}
