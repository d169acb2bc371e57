package image

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/managoat/managoat/sandbox"
)

// The archive formats Save writes.
const (
	// FormatOCI is an OCI image layout in a tar (oci-layout, index.json,
	// blobs/sha256/...), as skopeo's oci-archive and docker buildx's
	// type=oci write; each image is named in index.json by
	// io.containerd.image.name (its full reference) and
	// org.opencontainers.image.ref.name (its tag).
	FormatOCI = "oci"
	// FormatDocker is a docker save tarball (manifest.json with
	// RepoTags), which docker load reads.
	FormatDocker = "docker"
)

// V1Image returns the image ref names in the store as a
// go-containerregistry image whose manifest, config and layers are read
// from the store's blobs, byte for byte as pulled, loaded or committed.
// An image the store holds no manifest of (pulled by a managoat older
// than Save; pull it again) is Invalid{image_save}.
func (s *Store) V1Image(ref string) (v1.Image, *Image, error) {
	img, err := s.Get(ref)
	if err != nil {
		return nil, nil, err
	}
	v, err := s.v1Of(img, ref)
	if err != nil {
		return nil, nil, err
	}
	return v, img, nil
}

// v1Of is V1Image of img, which ref names.
func (s *Store) v1Of(img *Image, ref string) (v1.Image, error) {
	read := func(digest, what string) ([]byte, error) {
		hx, err := hexOf(digest)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(s.blobPath(hx))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, sandbox.Invalid("image_save", fmt.Sprintf("the store holds no %s of %s (it was pulled by an older managoat): pull it again", what, ref))
		}
		if err != nil {
			return nil, sandbox.Unavailable("image_store", err)
		}
		if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hx {
			return nil, &DigestError{What: what + " of " + ref + " in the store", Want: digest, Got: "sha256:" + hex.EncodeToString(sum[:])}
		}
		return b, nil
	}
	mb, err := read(img.Digest, "manifest")
	if err != nil {
		return nil, err
	}
	cb, err := read(img.ConfigDigest, "config")
	if err != nil {
		return nil, err
	}
	m, err := v1.ParseManifest(bytes.NewReader(mb))
	if err != nil {
		return nil, sandbox.Unavailable("image_store", fmt.Errorf("manifest of %s: %w", ref, err))
	}
	mt := m.MediaType
	if mt == "" {
		mt = types.OCIManifestSchema1
	}
	si := &storeImage{manifest: mb, config: cb, mt: mt, blobs: map[v1.Hash]storeBlob{}}
	for _, d := range append([]v1.Descriptor{m.Config}, m.Layers...) {
		p := s.blobPath(d.Digest.Hex)
		if d.Digest.Algorithm != "sha256" || !exists(p) {
			return nil, sandbox.Unavailable("image_store", fmt.Errorf("blob %s of %s is not in the store", d.Digest, ref))
		}
		si.blobs[d.Digest] = storeBlob{path: p, desc: d}
	}
	return partial.CompressedToImage(si)
}

// Save writes the images refs name to w as one archive of format
// (FormatOCI, or FormatDocker), for Load on another host or for docker
// load. It holds the store against a Prune while it writes.
func (s *Store) Save(ctx context.Context, w io.Writer, format string, refs ...string) error {
	if len(refs) == 0 {
		return sandbox.Invalid("image_save", "no image to save")
	}
	if format != FormatOCI && format != FormatDocker {
		return sandbox.Invalid("image_save", fmt.Sprintf("unknown format %q (oci, docker)", format))
	}
	release, err := s.writing(ctx)
	if err != nil {
		return err
	}
	defer release()
	type saved struct {
		r   name.Reference
		img v1.Image
	}
	var all []saved
	for _, ref := range refs {
		r, err := ParseRef(ref)
		if err != nil {
			return err
		}
		img, _, err := s.V1Image(ref)
		if err != nil {
			return err
		}
		all = append(all, saved{r, img})
	}
	if format == FormatDocker {
		m := map[name.Reference]v1.Image{}
		for _, a := range all {
			m[a.r] = a.img
		}
		if err := tarball.MultiRefWrite(m, &ctxWriter{ctx, w}); err != nil {
			return saveErr(ctx, err)
		}
		return nil
	}
	tw := tar.NewWriter(&ctxWriter{ctx, w})
	now := time.Now()
	file := func(p string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: now}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	var index v1.IndexManifest
	index.SchemaVersion, index.MediaType = 2, types.OCIImageIndex
	for _, a := range all {
		mt, _ := a.img.MediaType()
		d, _ := a.img.Digest()
		size, _ := a.img.Size()
		ann := map[string]string{annotationImageName: a.r.Name()}
		if t, ok := a.r.(name.Tag); ok {
			ann[annotationRefName] = t.TagStr()
		}
		index.Manifests = append(index.Manifests, v1.Descriptor{MediaType: mt, Digest: d, Size: size, Annotations: ann})
	}
	ib, _ := json.Marshal(index)
	if err := file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return saveErr(ctx, err)
	}
	if err := file("index.json", ib); err != nil {
		return saveErr(ctx, err)
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now}); err != nil {
			return saveErr(ctx, err)
		}
	}
	written := map[v1.Hash]bool{}
	for _, a := range all {
		si := a.img
		mb, _ := si.RawManifest()
		cb, _ := si.RawConfigFile()
		d, _ := si.Digest()
		c, _ := si.ConfigName()
		for _, b := range []struct {
			h v1.Hash
			b []byte
		}{{d, mb}, {c, cb}} {
			if !written[b.h] {
				written[b.h] = true
				if err := file("blobs/sha256/"+b.h.Hex, b.b); err != nil {
					return saveErr(ctx, err)
				}
			}
		}
		layers, err := si.Layers()
		if err != nil {
			return saveErr(ctx, err)
		}
		for _, l := range layers {
			h, _ := l.Digest()
			if written[h] {
				continue
			}
			written[h] = true
			if err := copyBlob(tw, "blobs/sha256/"+h.Hex, l, now); err != nil {
				return saveErr(ctx, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return saveErr(ctx, err)
	}
	return nil
}

// copyBlob writes layer l's blob as the tar entry p.
func copyBlob(tw *tar.Writer, p string, l v1.Layer, now time.Time) error {
	size, err := l.Size()
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeReg, Mode: 0o644, Size: size, ModTime: now}); err != nil {
		return err
	}
	_, err = io.CopyN(tw, rc, size)
	return err
}

// ctxWriter fails its writes once ctx is done, so a save to a slow
// reader ends with its context.
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c *ctxWriter) Write(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(b)
}

func saveErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return sandbox.Unavailable("image_save", err)
}
