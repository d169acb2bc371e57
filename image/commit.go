package image

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/managoat/managoat/sandbox"
)

// CommitDir is a host directory a commit puts in the new image's layer,
// at Path (absolute, in the image).
type CommitDir struct {
	Src  string
	Path string
	// IDBase and IDSize are the host ids [IDBase, IDBase+IDSize) of a
	// sandbox whose user namespace maps its ids 0 to IDSize-1 there (the
	// jail's range of its own): their files are written with the ids the
	// sandbox saw (the host id minus IDBase), and a file of any other
	// host id as nobody (65534), which it saw too. IDSize 0: ids as they
	// are on the host.
	IDBase, IDSize int
}

// nobody is the id a user namespace shows for an id it does not map.
const nobody = 65534

// sandboxID is host id id as the sandbox of d saw it.
func (d CommitDir) sandboxID(id int) int {
	switch {
	case d.IDSize == 0:
		return id
	case id >= d.IDBase && id < d.IDBase+d.IDSize:
		return id - d.IDBase
	default:
		return nobody
	}
}

// Commit saves a new image in the store, named ref: base's layers plus one
// layer holding dirs (a sandbox's home, say), so a prepared environment
// can start the next sandbox as E2B templates and Daytona snapshots do.
// The layer is a gzip tar of regular files, directories and symlinks
// (owners, modes and times kept; devices, sockets and fifos left out),
// stored as a blob like a pulled one; the new root is base's root copied
// (with reflinks where the file system has them) and the layer unpacked
// on it by the same unpacker as a pull. The image's digest is that of an
// OCI manifest written for it. A ref already naming an image is moved to
// the new one.
func (s *Store) Commit(ctx context.Context, base *Image, dirs []CommitDir, ref string) (*Image, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	if _, ok := r.(name.Digest); ok {
		return nil, sandbox.Invalid("image", "commit names a tag, not a digest: "+ref)
	}
	if base == nil {
		return nil, sandbox.Invalid("image", "commit needs the image the sandbox runs on")
	}
	release, err := s.writing(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	tmp, done, err := s.tmpDir("commit-")
	if err != nil {
		return nil, err
	}
	defer done()
	// The layer.
	blob := filepath.Join(tmp, "layer.tgz")
	digest, diffID, _, err := writeLayer(ctx, blob, dirs)
	if err != nil {
		return nil, err
	}
	dhex := strings.TrimPrefix(digest, "sha256:")
	if err := os.Rename(blob, s.blobPath(dhex)); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	// The manifest and config, for a digest that names this content:
	// base's config (its diff_ids, history and settings) with the
	// layer's diff_id and a history entry added.
	cfg, descs, err := s.baseMeta(base)
	if err != nil {
		return nil, err
	}
	diff, err := hashOf(diffID)
	if err != nil {
		return nil, err
	}
	ld, _ := hashOf(digest)
	st, err := os.Stat(s.blobPath(dhex))
	if err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	now := time.Now().UTC()
	cfg.Created = v1.Time{Time: now}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, diff)
	cfg.History = append(cfg.History, v1.History{Created: v1.Time{Time: now}, CreatedBy: "managoat commit", Comment: "from " + base.Ref + " (" + base.Digest + ")"})
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	cfgSum := sha256.Sum256(cfgJSON)
	descs = append(descs, v1.Descriptor{MediaType: types.OCILayer, Digest: ld, Size: st.Size()})
	layers := append(append([]string{}, base.Layers...), digest)
	manifest, err := json.Marshal(v1.Manifest{SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		Config: v1.Descriptor{MediaType: types.OCIConfigJSON, Digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(cfgSum[:])}, Size: int64(len(cfgJSON))},
		Layers: descs})
	if err != nil {
		return nil, err
	}
	msum := sha256.Sum256(manifest)
	mhex := hex.EncodeToString(msum[:])
	for p, b := range map[string][]byte{hex.EncodeToString(cfgSum[:]): cfgJSON, mhex: manifest} {
		if err := atomicWrite(s.blobPath(p), b); err != nil {
			return nil, err
		}
	}
	// The root: base's, copied, with the layer unpacked on it.
	rootfs := filepath.Join(tmp, "rootfs")
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", base.Root, rootfs).CombinedOutput(); err != nil {
		return nil, sandbox.Unavailable("image_store", fmt.Errorf("copy %s: %v: %s", base.Root, err, out))
	}
	u, err := newUnpacker(rootfs)
	if err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	// The layer is the sandbox's: it gets an image's default bounds.
	u.setBounds(PullOptions{}.bounds())
	err = withRef(applyBlobDigest(u, s.blobPath(dhex), diffID), r.Name())
	u.close()
	if err != nil {
		return nil, err
	}
	img := &Image{Digest: "sha256:" + mhex, ConfigDigest: "sha256:" + hex.EncodeToString(cfgSum[:]), Layers: layers,
		Config: base.Config, PulledAt: now}
	img.Size = diskUsage(rootfs)
	b, _ := json.MarshalIndent(img, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), b, 0o644); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	dst := filepath.Join(s.dir, "roots", mhex)
	if err := os.Rename(tmp, dst); err != nil && !errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY) {
		return nil, sandbox.Unavailable("image_store", err)
	}
	if err := s.writeRef(r, img.Digest); err != nil {
		return nil, err
	}
	img.Ref, img.Root = r.Name(), filepath.Join(dst, "rootfs")
	return img, nil
}

// applyBlobDigest is applyBlob with the diff_id as a string.
func applyBlobDigest(u *unpacker, path, diffID string) error {
	h, err := hashOf(diffID)
	if err != nil {
		return err
	}
	return applyBlob(u, path, h)
}

// writeLayer writes dirs as a gzip tar at path and returns its digest,
// its uncompressed digest (diff_id) and its size.
func writeLayer(ctx context.Context, path string, dirs []CommitDir) (digest, diffID string, size int64, err error) {
	f, err := os.Create(path)
	if err != nil {
		return "", "", 0, sandbox.Unavailable("image_store", err)
	}
	defer f.Close()
	zh, th := sha256.New(), sha256.New()
	zw := gzip.NewWriter(io.MultiWriter(f, zh))
	tw := tar.NewWriter(io.MultiWriter(zw, th))
	for _, d := range dirs {
		if !filepath.IsAbs(d.Path) {
			return "", "", 0, sandbox.Invalid("commit", "an image path must be absolute: "+d.Path)
		}
		// The directories above Path.
		parts := strings.Split(strings.Trim(d.Path, "/"), "/")
		for i := 1; i < len(parts); i++ {
			if err := tw.WriteHeader(&tar.Header{Name: strings.Join(parts[:i], "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Now()}); err != nil {
				return "", "", 0, err
			}
		}
		root, err := os.OpenRoot(d.Src)
		if err != nil {
			return "", "", 0, sandbox.Unavailable("commit", err)
		}
		err = fs.WalkDir(root.FS(), ".", func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			info, err := e.Info()
			if err != nil {
				return err
			}
			link := ""
			if info.Mode()&fs.ModeSymlink != 0 {
				if link, err = root.Readlink(p); err != nil {
					return err
				}
			} else if !info.Mode().IsRegular() && !info.IsDir() {
				return nil // no devices, sockets or fifos
			}
			h, err := tar.FileInfoHeader(info, link)
			if err != nil {
				return err
			}
			h.Name = strings.Trim(d.Path, "/")
			if p != "." {
				h.Name += "/" + p
			}
			if info.IsDir() {
				h.Name += "/"
			}
			h.Uname, h.Gname, h.Format = "", "", tar.FormatPAX
			h.Uid, h.Gid = d.sandboxID(h.Uid), d.sandboxID(h.Gid)
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if info.Mode().IsRegular() {
				rf, err := root.Open(p)
				if err != nil {
					return err
				}
				_, err = io.CopyN(tw, rf, h.Size)
				rf.Close()
				return err
			}
			return nil
		})
		root.Close()
		if err != nil {
			return "", "", 0, fmt.Errorf("commit %s: %w", d.Src, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", "", 0, err
	}
	if err := zw.Close(); err != nil {
		return "", "", 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return "", "", 0, err
	}
	return "sha256:" + hex.EncodeToString(zh.Sum(nil)), "sha256:" + hex.EncodeToString(th.Sum(nil)), st.Size(), f.Close()
}

// UsedBy returns the image user (a sandbox's id) runs on, from Use.
func (s *Store) UsedBy(user string) (*Image, error) {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "uses"))
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(s.dir, "uses", e.Name(), filepath.Base(user))); err == nil {
			return s.byDigest("sha256:" + e.Name())
		}
	}
	return nil, fmt.Errorf("%w: %s runs on no image of the store", sandbox.ErrNotFound, user)
}

// ociLayerType is the OCI media type of a layer of Docker's type (the
// same bytes): a committed image's manifest is an OCI one.
func ociLayerType(mt types.MediaType) types.MediaType {
	switch mt {
	case types.DockerLayer:
		return types.OCILayer
	case types.DockerUncompressedLayer:
		return types.OCIUncompressedLayer
	case types.DockerForeignLayer:
		return types.OCIRestrictedLayer
	}
	return mt
}

// baseMeta returns base's config and its layers' descriptors: from the
// manifest and config the store keeps, or, for an image pulled by an
// older managoat, made from its record and its layers (their diff_ids
// computed from the blobs).
func (s *Store) baseMeta(base *Image) (*v1.ConfigFile, []v1.Descriptor, error) {
	if v, err := s.v1Of(base, base.Ref); err == nil {
		cf, err := v.ConfigFile()
		if err != nil {
			return nil, nil, sandbox.Unavailable("image_store", err)
		}
		m, err := v.Manifest()
		if err != nil {
			return nil, nil, sandbox.Unavailable("image_store", err)
		}
		if len(m.Layers) == len(base.Layers) && len(cf.RootFS.DiffIDs) == len(m.Layers) {
			descs := make([]v1.Descriptor, len(m.Layers))
			for i, d := range m.Layers {
				descs[i] = v1.Descriptor{MediaType: ociLayerType(d.MediaType), Digest: d.Digest, Size: d.Size}
			}
			return cf.DeepCopy(), descs, nil
		}
	}
	cf := &v1.ConfigFile{OS: "linux", Architecture: goarch(), RootFS: v1.RootFS{Type: "layers"},
		Config: v1.Config{Env: base.Config.Env, WorkingDir: base.Config.WorkingDir, User: base.Config.User, Entrypoint: base.Config.Entrypoint, Cmd: base.Config.Cmd}}
	var descs []v1.Descriptor
	for _, l := range base.Layers {
		h, err := hashOf(l)
		if err != nil {
			return nil, nil, err
		}
		p := s.blobPath(h.Hex)
		diff, mt, err := diffIDOf(p)
		if err != nil {
			return nil, nil, sandbox.Unavailable("image_store", fmt.Errorf("layer %s of %s: %w", l, base.Ref, err))
		}
		st, err := os.Stat(p)
		if err != nil {
			return nil, nil, sandbox.Unavailable("image_store", err)
		}
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, diff)
		descs = append(descs, v1.Descriptor{MediaType: mt, Digest: h, Size: st.Size()})
	}
	return cf, descs, nil
}

// diffIDOf is the digest of the blob at path uncompressed, and its media
// type.
func diffIDOf(path string) (v1.Hash, types.MediaType, error) {
	f, err := os.Open(path)
	if err != nil {
		return v1.Hash{}, "", err
	}
	defer f.Close()
	r, mt, closeR, err := decompressed(f)
	if err != nil {
		return v1.Hash{}, "", err
	}
	defer closeR()
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return v1.Hash{}, "", err
	}
	return v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(h.Sum(nil))}, mt, nil
}
