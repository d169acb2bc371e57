package diskquota

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A loop image is a copy of a template: an empty ext4 file system of the
// limit's size made once by mkfs.ext4 and kept in Options.Templates (the
// mechanism's state directory), one per size. mkfs.ext4 is a process of
// its own and tens of milliseconds on a loaded host, most of a loop
// quota's cost; the copy is the file system's few hundred KiB of
// metadata (the rest of the image is a hole) and a fraction of a
// millisecond (see copySparse for when it reaches the disk). The copies of
// one template share its file system UUID, which the kernel does not
// look at (a mount names its device); every copy is on a loop device of
// its own. The root's owner is set after the mount (Apply), so one
// template serves every owner.
//
// Templates are bounded: at most maxTemplates files (the least recently
// used go when another is made), each at most maxTemplateBytes on disk
// (a larger file system's metadata is made by mkfs for each image, as
// without templates). A template is made under a temporary name and
// renamed into place, so processes sharing a state directory never see
// half of one; a temporary left by a process killed meanwhile is removed
// by the next that makes a template. They go with the state directory.

// templateFormat names how templates are made (makeFS): a change of
// mkfs.ext4's arguments changes it, so that old templates are not used.
const templateFormat = "v1"

const (
	maxTemplates     = 4
	maxTemplateBytes = 16 << 20
)

// fromTemplate makes the image at path, of size bytes, as a copy of the
// template of that size in dir (made first if there is none).
func fromTemplate(ctx context.Context, dir, path string, size int64) error {
	tpl, err := template(ctx, dir, size)
	if err != nil {
		return err
	}
	if tpl == "" {
		return makeFS(ctx, path, size, 0, 0)
	}
	return copySparse(tpl, path, size)
}

// template returns the template of size in dir, made if missing, or ""
// when one of that size would exceed maxTemplateBytes.
func template(ctx context.Context, dir string, size int64) (string, error) {
	name := filepath.Join(dir, fmt.Sprintf("ext4-%s-%d.tpl", templateFormat, size))
	if _, err := os.Stat(name); err == nil {
		now := time.Now()
		_ = os.Chtimes(name, now, now) // recently used: pruned last
		return name, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, ".tmp-"+hex.EncodeToString(rnd[:]))
	if err := makeFS(ctx, tmp, size, 0, 0); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(tmp, &st); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if st.Blocks*512 > maxTemplateBytes {
		_ = os.Remove(tmp)
		return "", nil
	}
	if err := os.Rename(tmp, name); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	pruneTemplates(dir, name)
	return name, nil
}

// pruneTemplates removes from dir the templates past maxTemplates, least
// recently used first, never keep, and temporaries over a minute old.
func pruneTemplates(dir, keep string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type tpl struct {
		path string
		used time.Time
	}
	var tpls []tpl
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() {
			continue
		}
		switch {
		case strings.HasPrefix(e.Name(), ".tmp-"):
			if time.Since(info.ModTime()) > time.Minute {
				_ = os.Remove(p)
			}
		case p != keep && strings.HasPrefix(e.Name(), "ext4-"):
			tpls = append(tpls, tpl{p, info.ModTime()})
		}
	}
	slices.SortFunc(tpls, func(a, b tpl) int { return b.used.Compare(a.used) })
	for _, t := range tpls[min(len(tpls), maxTemplates-1):] {
		_ = os.Remove(t.path)
	}
}

// copySparse copies src's data, not its holes, into a new file at path
// of size bytes (src's size). It is not synced here: the file system's
// first journal commit after the mount (Apply's chown of its root, within
// ext4's 5 s commit interval) flushes the loop device, which syncs the
// image file; a sandbox's state is no more durable before that.
func copySparse(src, path string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if st, err := in.Stat(); err != nil {
		return err
	} else if st.Size() != size {
		return fmt.Errorf("template %s: %d bytes, not %d", src, st.Size(), size)
	}
	_ = os.Remove(path) // a half-made image of an attempt cut short
	out, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = copyData(in, out, size)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("copy the template %s: %w", src, err)
	}
	return nil
}

// copyData copies in's data extents into out, size bytes long: the first
// 4 KiB (the superblock's) last, as mke2fs writes the superblock last, so
// that a copy cut short holds no file system (hasExt4).
func copyData(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	const head = 4096
	ifd, ofd := int(in.Fd()), int(out.Fd())
	for off := int64(head); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := copyRange(ifd, ofd, data, hole); err != nil {
			return err
		}
		off = hole
	}
	return copyRange(ifd, ofd, 0, min(head, size))
}

// copyRange copies bytes [from, to) of ifd to the same offsets of ofd.
func copyRange(ifd, ofd int, from, to int64) error {
	for r, w := from, from; r < to; {
		n, err := unix.CopyFileRange(ifd, &r, ofd, &w, int(min(to-r, 1<<30)), 0)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}
