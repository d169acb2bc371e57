package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/managoat/managoat/sandbox"
)

// The annotations an OCI image layout names its images by: containerd's
// (and docker's) full reference, and the OCI one, which tools fill with
// a tag or a full reference.
const (
	annotationImageName = "io.containerd.image.name"
	annotationRefName   = "org.opencontainers.image.ref.name"
)

// Fixed bounds of an archive: the JSON documents read whole, and the
// entries and images it may hold.
const (
	maxJSONBytes      = 16 << 20
	maxArchiveEntries = 1 << 16
	maxArchiveImages  = 1024
	// archiveSlack is what an archive may hold beyond its layers'
	// bytes (MaxBytes): tar headers, manifests, configs.
	archiveSlack = 16 << 20
)

// LoadOptions configure Load and LoadDir.
type LoadOptions struct {
	// Ref names the image when the archive holds exactly one, besides
	// the names the archive gives it; it is needed when the archive
	// names none (a docker save of an image id, an OCI layout with no
	// annotation) or only by a tag.
	Ref string
	// Platform picks the image of a multi-platform index; the default
	// is linux on this machine's architecture.
	Platform *v1.Platform
	// MaxBytes and MaxEntries bound a loaded image as a pulled one
	// (PullOptions); MaxBytes bounds the archive itself too (it may
	// hold 16 MiB of manifests and headers more).
	MaxBytes, MaxEntries int64
	// Progress, when set, is called as layers are copied into the store.
	Progress func(Progress)
}

func (o LoadOptions) pull() PullOptions {
	return PullOptions{Platform: o.Platform, MaxBytes: o.MaxBytes, MaxEntries: o.MaxEntries, Progress: o.Progress}
}

// loadItem is an image an archive holds, with the names it gives it.
type loadItem struct {
	img   v1.Image
	names []name.Reference
	tag   string // a bare tag the archive names it by (OCI ref.name)
}

// Load puts the images of an archive read from r in the store: a docker
// save tarball (manifest.json; docker 25's, which is also an OCI
// layout, included) or a tar of an OCI image layout (oci-layout,
// index.json). Each image is verified and unpacked as a pulled one
// (digests, diff_ids, the same unpacker and bounds) and named by the
// references the archive gives it (a docker save's RepoTags; an OCI
// layout's io.containerd.image.name, or its
// org.opencontainers.image.ref.name when that is a full reference) and
// by opts.Ref. A multi-platform index gives the image of opts.Platform.
// r is read once; unless it is a regular file, it is first copied into
// the store's tmp/ (bounded by MaxBytes), which is emptied at the end.
func (s *Store) Load(ctx context.Context, r io.Reader, opts LoadOptions) ([]*Image, error) {
	release, err := s.writing(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	tmp, done, err := s.tmpDir("load-")
	if err != nil {
		return nil, err
	}
	defer done()
	maxBytes, _ := opts.pull().bounds()
	limit := maxBytes
	if limit < math.MaxInt64-archiveSlack {
		limit += archiveSlack
	}
	ra, size, err := archiveReader(r, filepath.Join(tmp, "archive"), limit)
	if err != nil {
		return nil, err
	}
	if c, ok := ra.(io.Closer); ok {
		defer c.Close()
	}
	files, err := scanArchive(ctx, ra, size)
	if err != nil {
		return nil, err
	}
	var items []loadItem
	switch {
	case files["manifest.json"].ok:
		items, err = dockerArchive(ra, size, files)
	case files["oci-layout"].ok && files["index.json"].ok:
		dir := filepath.Join(tmp, "layout")
		if err = extractLayout(ctx, ra, size, dir); err == nil {
			items, err = layoutItems(dir, opts.pull())
		}
	default:
		err = sandbox.Invalid("image_archive", "neither a docker save tarball (no manifest.json) nor an OCI image layout (no oci-layout and index.json)")
	}
	if err != nil {
		return nil, err
	}
	return s.loadItems(ctx, items, opts)
}

// LoadDir is Load of the OCI image layout in directory dir (skopeo's
// oci:DIR, docker buildx's --output type=oci,tar=false).
func (s *Store) LoadDir(ctx context.Context, dir string, opts LoadOptions) ([]*Image, error) {
	release, err := s.writing(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	items, err := layoutItems(dir, opts.pull())
	if err != nil {
		return nil, err
	}
	return s.loadItems(ctx, items, opts)
}

// archiveReader is r as a ReaderAt: r itself from its offset when it is
// a regular file, else r copied to spool (at most limit bytes).
func archiveReader(r io.Reader, spool string, limit int64) (io.ReaderAt, int64, error) {
	tooBig := func() error {
		return &BoundError{Ref: "archive", Bound: "MaxBytes", What: fmt.Sprintf("the archive is more than %s", humanBytes(limit)), Limit: limit - archiveSlack}
	}
	if f, ok := r.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
			off, err := f.Seek(0, io.SeekCurrent)
			if err == nil {
				if st.Size()-off > limit {
					return nil, 0, tooBig()
				}
				return io.NewSectionReader(f, off, st.Size()-off), st.Size() - off, nil
			}
		}
	}
	f, err := os.OpenFile(spool, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return nil, 0, sandbox.Unavailable("image_store", err)
	}
	// f stays open for the load (Load closes it).
	n, err := io.CopyBuffer(fileWriter{f}, io.LimitReader(r, limit+1), make([]byte, 1<<20))
	if err != nil {
		f.Close()
		return nil, 0, sandbox.Unavailable("image_archive", fmt.Errorf("read the archive: %w", err))
	}
	if n > limit {
		f.Close()
		return nil, 0, tooBig()
	}
	return &closingSection{io.NewSectionReader(f, 0, n), f}, n, nil
}

// closingSection is a spooled archive, with its file.
type closingSection struct {
	*io.SectionReader
	f *os.File
}

func (c *closingSection) Close() error { return c.f.Close() }

type archiveFile struct {
	ok     bool
	off    int64 // of the content, in the archive
	size   int64
	link   string // a symlink's target (docker save links repeated layers)
	isLink bool
}

// scanArchive lists the archive's entries: each regular file's place and
// size, each symlink's target.
func scanArchive(ctx context.Context, ra io.ReaderAt, size int64) (map[string]archiveFile, error) {
	sr := io.NewSectionReader(ra, 0, size)
	tr := tar.NewReader(sr)
	files := map[string]archiveFile{}
	for n := 0; ; n++ {
		h, err := tr.Next()
		if err == io.EOF {
			return files, nil
		}
		if err != nil {
			return nil, sandbox.Invalid("image_archive", fmt.Sprintf("not a tar archive: %v", err))
		}
		if n >= maxArchiveEntries {
			return nil, &BoundError{Ref: "archive", Bound: "archive entries", What: fmt.Sprintf("the archive holds more than %d entries", maxArchiveEntries), Limit: maxArchiveEntries}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// Named as go-containerregistry's tarball finds an entry: the
		// first whose cleaned name matches.
		p := path.Clean(h.Name)
		if files[p].ok {
			continue
		}
		switch h.Typeflag {
		case tar.TypeReg:
			off, err := sr.Seek(0, io.SeekCurrent)
			if err != nil {
				return nil, sandbox.Unavailable("image_archive", err)
			}
			files[p] = archiveFile{ok: true, off: off, size: h.Size}
		case tar.TypeSymlink, tar.TypeLink:
			files[p] = archiveFile{ok: true, link: h.Linkname, isLink: true}
		}
	}
}

// resolve is the regular file the archive's entry p is, its links
// followed as go-containerregistry's tarball follows them.
func resolve(files map[string]archiveFile, p string) (archiveFile, bool) {
	p = path.Clean(p)
	for range 16 {
		f := files[p]
		if !f.ok || !f.isLink {
			return f, f.ok
		}
		p = path.Join(path.Dir(p), path.Clean(f.link))
	}
	return archiveFile{}, false
}

type sectionCloser struct{ *io.SectionReader }

func (sectionCloser) Close() error { return nil }

// dockerArchive reads a docker save tarball's manifest.json and gives
// each image it lists with its RepoTags.
func dockerArchive(ra io.ReaderAt, size int64, files map[string]archiveFile) ([]loadItem, error) {
	if f, ok := resolve(files, "manifest.json"); !ok || f.size > maxJSONBytes {
		return nil, &BoundError{Ref: "archive", Bound: "manifest.json", What: fmt.Sprintf("its manifest.json is missing or more than %d bytes", maxJSONBytes), Limit: maxJSONBytes}
	}
	opener := func() (io.ReadCloser, error) { return sectionCloser{io.NewSectionReader(ra, 0, size)}, nil }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, sandbox.Invalid("image_archive", fmt.Sprintf("manifest.json: %v", err))
	}
	if len(m) == 0 || len(m) > maxArchiveImages {
		return nil, sandbox.Invalid("image_archive", fmt.Sprintf("manifest.json lists %d images", len(m)))
	}
	var items []loadItem
	for _, d := range m {
		if f, ok := resolve(files, d.Config); !ok || f.size > maxJSONBytes {
			return nil, sandbox.Invalid("image_archive", fmt.Sprintf("config %q is missing or larger than %d bytes", d.Config, maxJSONBytes))
		}
		if len(d.Layers) > maxLayers {
			return nil, &BoundError{Ref: "archive", Bound: "layers", What: fmt.Sprintf("an image has %d layers", len(d.Layers)), Limit: maxLayers}
		}
		var it loadItem
		var tag *name.Tag
		for _, t := range d.RepoTags {
			r, err := name.NewTag(t)
			if err != nil {
				return nil, sandbox.Invalid("image_archive", fmt.Sprintf("RepoTags %q: %v", t, err))
			}
			if tag == nil {
				tag = &r
			}
			it.names = append(it.names, r)
		}
		if tag == nil && len(m) > 1 {
			return nil, sandbox.Invalid("image_archive", "an image of several in manifest.json has no RepoTags")
		}
		if it.img, err = tarball.Image(opener, tag); err != nil {
			return nil, sandbox.Invalid("image_archive", err.Error())
		}
		items = append(items, it)
	}
	return items, nil
}

var blobName = regexp.MustCompile(`^blobs/sha256/[0-9a-f]{64}$`)

// extractLayout writes the OCI layout's files of the archive into dir:
// oci-layout, index.json and blobs/sha256/<hex>, regular files only;
// anything else is left out.
func extractLayout(ctx context.Context, ra io.ReaderAt, size int64, dir string) error {
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	defer root.Close()
	tr := tar.NewReader(io.NewSectionReader(ra, 0, size))
	buf := make([]byte, 1<<20)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return sandbox.Invalid("image_archive", fmt.Sprintf("not a tar archive: %v", err))
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		p := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if h.Typeflag != tar.TypeReg || !(p == "oci-layout" || p == "index.json" || blobName.MatchString(p)) {
			continue
		}
		f, err := root.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return sandbox.Invalid("image_archive", fmt.Sprintf("%s: %v", p, err))
		}
		_, err = io.CopyBuffer(fileWriter{f}, tr, buf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return sandbox.Unavailable("image_archive", err)
		}
	}
}

// layoutItems gives the images of the OCI layout in dir, each with the
// names its descriptor's annotations give it; an index in it gives its
// image for the platform.
func layoutItems(dir string, opts PullOptions) ([]loadItem, error) {
	if st, err := os.Stat(filepath.Join(dir, "index.json")); err != nil || st.Size() > maxJSONBytes {
		return nil, sandbox.Invalid("image_archive", fmt.Sprintf("%s holds no OCI layout index.json of at most %d bytes", dir, maxJSONBytes))
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, sandbox.Invalid("image_archive", err.Error())
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, sandbox.Invalid("image_archive", err.Error())
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, sandbox.Invalid("image_archive", fmt.Sprintf("index.json: %v", err))
	}
	if len(im.Manifests) == 0 || len(im.Manifests) > maxArchiveImages {
		return nil, sandbox.Invalid("image_archive", fmt.Sprintf("index.json lists %d manifests", len(im.Manifests)))
	}
	plat := v1.Platform{OS: "linux", Architecture: goarch()}
	if opts.Platform != nil {
		plat = *opts.Platform
	}
	small := func(d v1.Descriptor) error {
		st, err := os.Stat(filepath.Join(dir, "blobs", d.Digest.Algorithm, d.Digest.Hex))
		if err != nil {
			return sandbox.Invalid("image_archive", fmt.Sprintf("the layout lacks %s", d.Digest))
		}
		if d.Size > maxJSONBytes || st.Size() > maxJSONBytes {
			return &BoundError{Ref: "archive", Bound: "manifest", What: fmt.Sprintf("manifest %s is more than %d bytes", d.Digest, maxJSONBytes), Limit: maxJSONBytes}
		}
		return nil
	}
	var items []loadItem
	for _, d := range im.Manifests {
		var it loadItem
		if n := d.Annotations[annotationImageName]; n != "" {
			r, err := name.ParseReference(n)
			if err != nil {
				return nil, sandbox.Invalid("image_archive", fmt.Sprintf("%s %q: %v", annotationImageName, n, err))
			}
			it.names = append(it.names, r)
		} else if n := d.Annotations[annotationRefName]; n != "" {
			if strings.ContainsAny(n, "/@") || strings.Contains(n, ":") && !strings.HasPrefix(n, ":") {
				r, err := name.ParseReference(n)
				if err != nil {
					return nil, sandbox.Invalid("image_archive", fmt.Sprintf("%s %q: %v", annotationRefName, n, err))
				}
				it.names = append(it.names, r)
			} else {
				it.tag = n
			}
		}
		if err := small(d); err != nil {
			return nil, err
		}
		switch {
		case d.MediaType.IsImage():
			if it.img, err = idx.Image(d.Digest); err != nil {
				return nil, sandbox.Invalid("image_archive", err.Error())
			}
		case d.MediaType.IsIndex():
			child, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, sandbox.Invalid("image_archive", err.Error())
			}
			cm, err := child.IndexManifest()
			if err != nil {
				return nil, sandbox.Invalid("image_archive", err.Error())
			}
			for _, c := range cm.Manifests {
				if c.MediaType.IsImage() && (c.Platform == nil || c.Platform.Satisfies(plat)) {
					if err := small(c); err != nil {
						return nil, err
					}
					if it.img, err = child.Image(c.Digest); err != nil {
						return nil, sandbox.Invalid("image_archive", err.Error())
					}
					break
				}
			}
			if it.img == nil {
				return nil, notFound(fmt.Sprint(it.names), fmt.Sprintf("the archive's index %s has no image for %s", d.Digest, plat))
			}
		default:
			continue // not an image (an attestation, a signature)
		}
		items = append(items, it)
	}
	if len(items) == 0 {
		return nil, sandbox.Invalid("image_archive", "the OCI layout holds no image")
	}
	return items, nil
}

// loadItems names the items and puts each in the store.
func (s *Store) loadItems(ctx context.Context, items []loadItem, opts LoadOptions) ([]*Image, error) {
	if opts.Ref != "" {
		if len(items) != 1 {
			return nil, sandbox.Invalid("image_archive", fmt.Sprintf("the archive holds %d images: a name given to the load names one", len(items)))
		}
		r, err := ParseRef(opts.Ref)
		if err != nil {
			return nil, err
		}
		items[0].names = append(items[0].names, r)
	}
	for _, it := range items {
		if len(it.names) == 0 {
			what := "no image"
			if it.tag != "" {
				what = "its image only by the tag " + it.tag
			}
			return nil, sandbox.Invalid("image_archive", "the archive names "+what+": give the load a name for it (managoat image load --tag REF)")
		}
	}
	popts := opts.pull()
	var out []*Image
	for _, it := range items {
		ref := it.names[0].Name()
		mdigest, err := it.img.Digest()
		if err != nil {
			return nil, sandbox.Invalid("image_archive", fmt.Sprintf("%s: %v", ref, err))
		}
		img, err := s.byDigest(mdigest.String())
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
			if img, err = s.unpackImage(ctx, ref, mdigest, it.img, popts); err != nil {
				return nil, archiveErr(ref, err)
			}
		} else if err := s.keepMeta(it.img); err != nil {
			return nil, archiveErr(ref, err)
		}
		for _, r := range it.names {
			if err := s.writeRef(r, img.Digest); err != nil {
				return nil, err
			}
		}
		img.Ref = ref
		for _, r := range it.names {
			img.Refs = append(img.Refs, r.Name())
		}
		out = append(out, img)
	}
	return out, nil
}

// archiveErr is an error of the library reading an archive's image:
// the taxonomy's own errors pass, the rest is Invalid{image_archive}.
func archiveErr(ref string, err error) error {
	var de *DigestError
	var le *LayerError
	var be *BoundError
	var ie *sandbox.InvalidError
	var ue *sandbox.UnavailableError
	if errors.As(err, &de) || errors.As(err, &le) || errors.As(err, &be) || errors.As(err, &ie) || errors.As(err, &ue) ||
		errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return sandbox.Invalid("image_archive", fmt.Sprintf("%s: %v", ref, err))
}

// keepMeta keeps an image's manifest and config as blobs of the store,
// for Save and Commit.
func (s *Store) keepMeta(img v1.Image) error {
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	if exists(s.blobPath(mdigest.Hex)) && exists(s.blobPath(cdigest.Hex)) {
		return nil
	}
	mb, err := img.RawManifest()
	if err != nil {
		return err
	}
	cb, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	for _, b := range []struct {
		hex string
		b   []byte
	}{{mdigest.Hex, mb}, {cdigest.Hex, cb}} {
		if !exists(s.blobPath(b.hex)) {
			if err := atomicWrite(s.blobPath(b.hex), b.b); err != nil {
				return err
			}
		}
	}
	return nil
}

// storeImage is an image of the store as a go-containerregistry image:
// its manifest, config and layers read from the store's blobs.
type storeImage struct {
	manifest, config []byte
	mt               types.MediaType
	blobs            map[v1.Hash]storeBlob
}

type storeBlob struct {
	path string
	desc v1.Descriptor
}

func (i *storeImage) RawConfigFile() ([]byte, error)      { return i.config, nil }
func (i *storeImage) MediaType() (types.MediaType, error) { return i.mt, nil }
func (i *storeImage) RawManifest() ([]byte, error)        { return i.manifest, nil }
func (i *storeImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	b, ok := i.blobs[h]
	if !ok {
		return nil, fmt.Errorf("no blob %s in the image", h)
	}
	return b, nil
}

func (b storeBlob) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b storeBlob) Compressed() (io.ReadCloser, error)  { return os.Open(b.path) }
func (b storeBlob) Size() (int64, error)                { return b.desc.Size, nil }
func (b storeBlob) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
