package image

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/sandbox"
)

// Store is the content-addressed image cache under one directory:
//
//	blobs/sha256/<hex>      layers as downloaded, each verified against its digest
//	roots/<hex>/rootfs      the unpacked root of the image whose manifest digest is <hex>
//	roots/<hex>/image.json  its Image record
//	refs/<hash of ref>.json which manifest a reference named when it was pulled
//	uses/<hex>/<user>       sandboxes running on the root (Use, Release)
//	tmp/                    downloads and unpacks in progress
//
// A blob or a root exists only once complete: each is made in tmp/ and
// renamed into place, under a lock per digest, so concurrent pulls of the
// same image (in one process or several) download each layer once, and a
// pull cut short at any point leaves only a tmp/ entry that no sandbox
// ever sees (Prune removes it).
type Store struct {
	dir string
}

// Open returns the store kept in dir (created when missing).
//
// The store is private to the user who owns it: dir, and any directory
// above it Open makes (the state directory, when an image command is
// the first to run on a host), are made 0700, and a store left more open
// (by an older managoat) is made 0700 again. Image roots keep their
// files' owners and set-id bits, as the sandboxes need them; a setuid
// root program in an image is thus never reachable by another host user,
// who cannot traverse the store, and runs as root only in a sandbox,
// whose mounts of the root are nosuid.
func Open(dir string) (*Store, error) {
	if !filepath.IsAbs(dir) {
		return nil, sandbox.Invalid("image_store", "the store's directory must be an absolute path")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	for _, d := range []string{"blobs/sha256", "roots", "refs", "uses", "tmp", "locks"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, sandbox.Unavailable("image_store", err)
		}
	}
	for _, d := range []string{dir, filepath.Join(dir, "roots")} {
		if err := private(d); err != nil {
			return nil, err
		}
	}
	return &Store{dir: dir}, nil
}

// private makes directory d 0700 when it is open to others.
func private(d string) error {
	st, err := os.Lstat(d)
	if err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	if !st.IsDir() {
		return sandbox.Unavailable("image_store", fmt.Errorf("%s is not a directory", d))
	}
	if st.Mode().Perm()&0o077 == 0 {
		return nil
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return sandbox.Unavailable("image_store", fmt.Errorf("%s is mode %#o and cannot be made private: %w", d, st.Mode().Perm(), err))
	}
	return nil
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Config is the part of an image's configuration a sandbox honours.
type Config struct {
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"working_dir,omitempty"`
	User       string   `json:"user,omitempty"`
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
}

// Command is what the image runs when the caller gives no command:
// Entrypoint followed by Cmd (the caller's args replace Cmd).
func (c Config) Command(args []string) []string {
	if len(args) == 0 {
		args = c.Cmd
	}
	return append(append([]string{}, c.Entrypoint...), args...)
}

// Image is an image unpacked in the store.
type Image struct {
	// Ref is the reference it was pulled by, fully qualified.
	Ref string `json:"ref"`
	// Refs are every reference that names it in the store (List only).
	Refs []string `json:"refs,omitempty"`
	// Digest is the manifest's digest ("sha256:...").
	Digest string `json:"digest"`
	// ConfigDigest is the config blob's digest: the image id.
	ConfigDigest string   `json:"config_digest"`
	Layers       []string `json:"layers"`
	Config       Config   `json:"config"`
	// Size is the bytes the unpacked root takes on disk.
	Size int64 `json:"size"`
	// Root is the unpacked root directory, shared read-only.
	Root     string    `json:"-"`
	PulledAt time.Time `json:"pulled_at"`
	// Skipped counts device nodes the layers held and the unpack left out.
	Skipped int `json:"skipped,omitempty"`
}

// Progress is a layer's download progress.
type Progress struct {
	Layer    string // digest
	Index, N int    // layer Index of N (0-based)
	Done     int64  // bytes downloaded
	Total    int64  // the layer's size
	Cached   bool   // already in the store: nothing downloaded
}

// PullOptions configure Pull.
type PullOptions struct {
	// Keychain finds credentials; nil means the usual docker config
	// ($DOCKER_CONFIG/config.json, ~/.docker/config.json, credential
	// helpers): authn.DefaultKeychain.
	Keychain authn.Keychain
	// Transport carries the requests; nil means http.DefaultTransport.
	Transport http.RoundTripper
	// Platform picks the image of a multi-platform index; the default is
	// linux on this machine's architecture.
	Platform *v1.Platform
	// Progress, when set, is called as layers download (from several
	// goroutines at once, never concurrently for one layer).
	Progress func(Progress)
	// MaxBytes bounds the bytes an image may bring: its layers as
	// downloaded (compressed) and the content of the files they unpack
	// to, each summed over its layers. 0 means DefaultMaxBytes; a
	// negative value, no bound.
	MaxBytes int64
	// MaxEntries bounds the entries (files, directories, links,
	// whiteouts) an image's layers hold, summed over its layers: the
	// inodes its root may take. 0 means DefaultMaxEntries; a negative
	// value, no bound.
	MaxEntries int64
}

// The bounds of an image a pull or load takes unless told otherwise
// (PullOptions.MaxBytes, MaxEntries; managoat image pull --max-bytes,
// --max-entries). They are above the largest images in common use (a
// CUDA development image unpacks to about 10 GB in some 150,000
// entries) and cap what any image, a compression bomb among them (gzip
// expands up to a thousandfold), writes to the host's disk.
const (
	DefaultMaxBytes   int64 = 16 << 30
	DefaultMaxEntries int64 = 1_000_000
)

// Fixed bounds: no image needs more, and each is read whole into memory
// (the config) or costs a download slot (a layer).
const (
	maxLayers      = 1024
	maxConfigBytes = 16 << 20
)

func (o PullOptions) bounds() (maxBytes, maxEntries int64) {
	maxBytes, maxEntries = o.MaxBytes, o.MaxEntries
	switch {
	case maxBytes == 0:
		maxBytes = DefaultMaxBytes
	case maxBytes < 0:
		maxBytes = math.MaxInt64
	}
	switch {
	case maxEntries == 0:
		maxEntries = DefaultMaxEntries
	case maxEntries < 0:
		maxEntries = math.MaxInt64
	}
	return maxBytes, maxEntries
}

// BoundError is an image refused for passing one of its bounds
// (PullOptions.MaxBytes or MaxEntries, or a fixed one): nothing of it is
// published, and what was unpacked of it is removed. Layers downloaded
// whole and verified stay in the store's cache of blobs until a Prune.
// It is sandbox.Invalid{image_too_large}.
type BoundError struct {
	Ref string
	// Bound names it: "MaxBytes", "MaxEntries", "layers" or "config".
	Bound string
	// What says what passed it: "its layers unpack to more than ...".
	What  string
	Limit int64
}

func (e *BoundError) Error() string {
	s := fmt.Sprintf("image %s refused: %s", e.Ref, e.What)
	if e.Ref == "archive" {
		s = "image archive refused: " + e.What
	}
	switch e.Bound {
	case "MaxBytes", "MaxEntries":
		s += fmt.Sprintf(" (its bound, PullOptions.%s, is %d; a larger one takes it)", e.Bound, e.Limit)
	default:
		s += fmt.Sprintf(" (a fixed bound of %d)", e.Limit)
	}
	return s
}

// Unwrap makes a BoundError sandbox.Invalid{image_too_large}.
func (e *BoundError) Unwrap() error {
	return &sandbox.InvalidError{Reason: "image_too_large", Msg: e.What}
}

// bytesBound is a BoundError of MaxBytes.
func bytesBound(what string, limit int64) *BoundError {
	return &BoundError{Bound: "MaxBytes", What: fmt.Sprintf("%s more than %s", what, humanBytes(limit)), Limit: limit}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}

func hexOf(digest string) (string, error) {
	h, err := v1.NewHash(digest)
	if err != nil || h.Algorithm != "sha256" {
		return "", sandbox.Invalid("digest", fmt.Sprintf("%q is not a sha256 digest", digest))
	}
	return h.Hex, nil
}

// ParseRef validates and fully qualifies an image reference ("debian:12"
// is index.docker.io/library/debian:12).
func ParseRef(ref string) (name.Reference, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, sandbox.Invalid("image", fmt.Sprintf("%q is not an image reference: %v", ref, err))
	}
	return r, nil
}

func refFile(r name.Reference) string {
	sum := sha256.Sum256([]byte(r.Name()))
	return hex.EncodeToString(sum[:16]) + ".json"
}

type refRecord struct {
	Ref    string `json:"ref"`
	Digest string `json:"digest"`
}

// Get returns an image already in the store: NotFound naming ref when it
// is not.
func (s *Store) Get(ref string) (*Image, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	var digest string
	if d, ok := r.(name.Digest); ok {
		digest = d.DigestStr()
	} else {
		b, err := os.ReadFile(filepath.Join(s.dir, "refs", refFile(r)))
		if errors.Is(err, fs.ErrNotExist) {
			return nil, notFound(r.Name(), "not in the image store (managoat image pull it)")
		}
		if err != nil {
			return nil, sandbox.Unavailable("image_store", err)
		}
		var rr refRecord
		if err := json.Unmarshal(b, &rr); err != nil {
			return nil, sandbox.Unavailable("image_store", err)
		}
		digest = rr.Digest
	}
	img, err := s.byDigest(digest)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notFound(r.Name(), "not in the image store")
	}
	if err != nil {
		return nil, err
	}
	img.Ref = r.Name()
	return img, nil
}

func (s *Store) byDigest(digest string) (*Image, error) {
	hx, err := hexOf(digest)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(s.dir, "roots", hx)
	b, err := os.ReadFile(filepath.Join(dir, "image.json"))
	if err != nil {
		return nil, err
	}
	var img Image
	if err := json.Unmarshal(b, &img); err != nil {
		return nil, sandbox.Unavailable("image_store", fmt.Errorf("corrupt %s: %w", dir, err))
	}
	img.Root = filepath.Join(dir, "rootfs")
	return &img, nil
}

// NotFoundError is an image the registry or the store does not have.
type NotFoundError struct {
	Ref    string
	Detail string
}

func (e *NotFoundError) Error() string {
	return fmt.Sprintf("image %s not found: %s", e.Ref, e.Detail)
}

// Is makes a NotFoundError match sandbox.ErrNotFound.
func (e *NotFoundError) Is(target error) bool { return target == sandbox.ErrNotFound }

func notFound(ref, detail string) error { return &NotFoundError{Ref: ref, Detail: detail} }

// registryErr maps a registry's answer into the sandbox taxonomy.
func registryErr(ref string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusNotFound:
			return notFound(ref, "the registry has no such repository or tag")
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return &sandbox.DeniedError{Reason: "registry refused the credentials for " + ref, HTTP: &sandbox.HTTPDetail{Status: te.StatusCode}}
		case te.StatusCode == http.StatusTooManyRequests:
			return &sandbox.RateLimitedError{}
		}
		for _, d := range te.Errors {
			switch d.Code {
			case transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode, transport.BlobUnknownErrorCode:
				return notFound(ref, d.Message)
			case transport.UnauthorizedErrorCode, transport.DeniedErrorCode:
				return &sandbox.DeniedError{Reason: "registry refused the credentials for " + ref, HTTP: &sandbox.HTTPDetail{Status: te.StatusCode}}
			}
		}
		return sandbox.FromHTTPStatus(te.StatusCode, "", 0)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var de *DigestError
	var le *LayerError
	var be *BoundError
	if errors.As(err, &de) || errors.As(err, &le) || errors.As(err, &be) {
		return err
	}
	if strings.Contains(err.Error(), "error verifying sha256 checksum") {
		// The library's verification (internal/verify) of a manifest or
		// config: nothing of it was stored.
		return &DigestError{What: ref, Want: "the digest asked for", Got: err.Error()}
	}
	return sandbox.Unavailable("registry", fmt.Errorf("%s: %w", ref, err))
}

// DigestError is content that does not match the digest it was asked by:
// refused, and removed from the store.
type DigestError struct {
	What, Want, Got string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("%s: digest mismatch: want %s, got %s (refused and deleted)", e.What, e.Want, e.Got)
}

// Ensure returns the image from the store, pulling it first when absent.
func (s *Store) Ensure(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	if img, err := s.Get(ref); err == nil {
		return img, nil
	} else if !errors.Is(err, sandbox.ErrNotFound) {
		return nil, err
	}
	return s.Pull(ctx, ref, opts)
}

// Pull fetches ref's manifest from its registry, downloads the layers the
// store lacks (verifying each against its digest), unpacks the image once
// and records ref as naming it. An image already unpacked costs one
// manifest request.
func (s *Store) Pull(ctx context.Context, ref string, opts PullOptions) (*Image, error) {
	r, err := ParseRef(ref)
	if err != nil {
		return nil, err
	}
	kc := opts.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
	if opts.Transport != nil {
		ropts = append(ropts, remote.WithTransport(opts.Transport))
	}
	plat := v1.Platform{OS: "linux", Architecture: goarch()}
	if opts.Platform != nil {
		plat = *opts.Platform
	}
	ropts = append(ropts, remote.WithPlatform(plat))
	release, err := s.writing(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	desc, err := remote.Get(r, ropts...)
	if err != nil {
		return nil, registryErr(r.Name(), err)
	}
	rimg, err := desc.Image()
	if err != nil {
		return nil, registryErr(r.Name(), err)
	}
	mdigest, err := rimg.Digest()
	if err != nil {
		return nil, registryErr(r.Name(), err)
	}
	img, err := s.byDigest(mdigest.String())
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if img, err = s.unpackImage(ctx, r.Name(), mdigest, rimg, opts); err != nil {
			return nil, err
		}
	} else if err := s.keepMeta(rimg); err != nil { // unpacked by an older managoat
		return nil, registryErr(r.Name(), err)
	}
	if err := s.writeRef(r, img.Digest); err != nil {
		return nil, err
	}
	img.Ref = r.Name()
	return img, nil
}

func (s *Store) writeRef(r name.Reference, digest string) error {
	b, _ := json.Marshal(refRecord{Ref: r.Name(), Digest: digest})
	return atomicWrite(filepath.Join(s.dir, "refs", refFile(r)), b)
}

func atomicWrite(path string, b []byte) error {
	tmp := path + ".tmp-" + randHex()
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return sandbox.Unavailable("image_store", err)
	}
	return nil
}

func randHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// lock takes the store's lock named key (one file per digest).
func (s *Store) lock(ctx context.Context, key string) (func(), error) {
	return s.lockAs(ctx, key, flock.Lock)
}

// keyStore is the lock every pull and commit holds shared while it
// writes, and Prune exclusive: a blob fetched and not yet unpacked is
// kept by no root, so a Prune meanwhile would remove it from under the
// pull.
const keyStore = "store"

func (s *Store) lockAs(ctx context.Context, key string, take func(context.Context, string) (func(), error)) (func(), error) {
	p := filepath.Join(s.dir, "locks", key)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDONLY, 0o644)
	if err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	f.Close()
	return take(ctx, p)
}

// writing holds the store against a Prune while a pull or a commit adds
// to it.
func (s *Store) writing(ctx context.Context) (func(), error) {
	return s.lockAs(ctx, keyStore, flock.LockShared)
}

// tmpDir makes a directory in tmp/, locked while in use so Prune leaves
// it alone.
func (s *Store) tmpDir(prefix string) (string, func(), error) {
	d, err := os.MkdirTemp(filepath.Join(s.dir, "tmp"), prefix)
	if err != nil {
		return "", nil, sandbox.Unavailable("image_store", err)
	}
	unlock, ok := flock.TryLock(d)
	if !ok {
		os.RemoveAll(d)
		return "", nil, sandbox.Unavailable("image_store", errors.New("cannot lock "+d))
	}
	return d, func() { os.RemoveAll(d); unlock() }, nil
}

func (s *Store) blobPath(hx string) string { return filepath.Join(s.dir, "blobs", "sha256", hx) }

// fetchLayer puts layer l's blob in the store (once, whoever asks) and
// returns its path.
func (s *Store) fetchLayer(ctx context.Context, ref string, l v1.Layer, idx, n int, progress func(Progress)) (string, error) {
	d, err := l.Digest()
	if err != nil {
		return "", registryErr(ref, err)
	}
	if d.Algorithm != "sha256" {
		return "", sandbox.Invalid("digest", "layer digest "+d.String()+" is not sha256")
	}
	size, _ := l.Size()
	dst := s.blobPath(d.Hex)
	report := func(p Progress) {
		if progress != nil {
			p.Layer, p.Index, p.N, p.Total = d.String(), idx, n, size
			progress(p)
		}
	}
	if _, err := os.Stat(dst); err == nil {
		report(Progress{Done: size, Cached: true})
		return dst, nil
	}
	unlock, err := s.lock(ctx, "blob-"+d.Hex)
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(dst); err == nil { // another pull fetched it meanwhile
		report(Progress{Done: size, Cached: true})
		return dst, nil
	}
	tmp, done, err := s.tmpDir("blob-")
	if err != nil {
		return "", err
	}
	defer done()
	rc, err := l.Compressed()
	if err != nil {
		return "", registryErr(ref, err)
	}
	defer rc.Close()
	f, err := os.Create(filepath.Join(tmp, "blob"))
	if err != nil {
		return "", sandbox.Unavailable("image_store", err)
	}
	h := sha256.New()
	pr := &progressReader{r: rc, h: h, report: report}
	_, err = io.CopyBuffer(fileWriter{f}, pr, make([]byte, 1<<20))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if strings.Contains(err.Error(), "error verifying sha256 checksum") {
			// The library's own verification (internal/verify) failed
			// first, at the end of the stream: the same refusal.
			return "", &DigestError{What: "layer " + d.String() + " of " + ref, Want: d.String(), Got: err.Error()}
		}
		return "", registryErr(ref, err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != d.String() {
		return "", &DigestError{What: "layer " + d.String() + " of " + ref, Want: d.String(), Got: got}
	}
	if err := os.Rename(filepath.Join(tmp, "blob"), dst); err != nil {
		return "", sandbox.Unavailable("image_store", err)
	}
	return dst, nil
}

type progressReader struct {
	r      io.Reader
	h      hash.Hash
	done   int64
	last   time.Time
	report func(Progress)
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.h.Write(b[:n])
		p.done += int64(n)
		if now := time.Now(); now.Sub(p.last) > 100*time.Millisecond || err == io.EOF {
			p.last = now
			p.report(Progress{Done: p.done})
		}
	}
	if err == io.EOF {
		p.report(Progress{Done: p.done})
	}
	return n, err
}

// unpackImage downloads what is missing and unpacks the image under its
// manifest digest, once.
func (s *Store) unpackImage(ctx context.Context, ref string, mdigest v1.Hash, rimg v1.Image, opts PullOptions) (*Image, error) {
	cfgDigest, err := rimg.ConfigName()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	m, err := rimg.Manifest()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	if m.Config.Size > maxConfigBytes {
		return nil, &BoundError{Ref: ref, Bound: "config", What: fmt.Sprintf("its config is %d bytes", m.Config.Size), Limit: maxConfigBytes}
	}
	if len(m.Layers) > maxLayers {
		return nil, &BoundError{Ref: ref, Bound: "layers", What: fmt.Sprintf("it has %d layers", len(m.Layers)), Limit: maxLayers}
	}
	for _, d := range m.Layers {
		if len(d.URLs) > 0 {
			// A foreign layer, to be fetched from an address of the
			// image's choosing when the registry lacks it: Windows
			// images have them, Linux ones do not.
			return nil, sandbox.Invalid("image", fmt.Sprintf("%s: layer %s names URLs to fetch it from (a foreign layer): refused", ref, d.Digest))
		}
	}
	cf, err := rimg.ConfigFile() // verified against cfgDigest by the library
	if err != nil {
		return nil, registryErr(ref, err)
	}
	layers, err := rimg.Layers()
	if err != nil {
		return nil, registryErr(ref, err)
	}
	maxBytes, maxEntries := opts.bounds()
	var download int64
	for _, l := range layers {
		size, err := l.Size()
		if err != nil {
			return nil, registryErr(ref, err)
		}
		if download += size; size < 0 || download > maxBytes {
			return nil, withRef(bytesBound("its layers download", maxBytes), ref)
		}
	}
	if len(cf.RootFS.DiffIDs) != len(layers) {
		return nil, sandbox.Invalid("image", fmt.Sprintf("%s: %d layers but %d diff_ids in its config", ref, len(layers), len(cf.RootFS.DiffIDs)))
	}
	unlock, err := s.lock(ctx, "root-"+mdigest.Hex)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if img, err := s.byDigest(mdigest.String()); err == nil {
		return img, nil // another pull unpacked it meanwhile
	}
	// Downloads run ahead (up to three at once); layers are unpacked in
	// order as each arrives.
	type got struct {
		path string
		err  error
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	results := make([]chan got, len(layers))
	sem := make(chan struct{}, 3)
	var wg sync.WaitGroup
	for i, l := range layers {
		results[i] = make(chan got, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				results[i] <- got{err: ctx.Err()}
				return
			}
			defer func() { <-sem }()
			p, err := s.fetchLayer(ctx, ref, l, i, len(layers), opts.Progress)
			results[i] <- got{p, err}
		}()
	}
	defer wg.Wait()
	tmp, done, err := s.tmpDir("root-")
	if err != nil {
		return nil, err
	}
	defer done()
	rootfs := filepath.Join(tmp, "rootfs")
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	u, err := newUnpacker(rootfs)
	if err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	defer u.close()
	u.setBounds(maxBytes, maxEntries)
	img := &Image{Digest: mdigest.String(), ConfigDigest: cfgDigest.String(), PulledAt: time.Now().UTC(),
		Config: Config{Env: cf.Config.Env, WorkingDir: cf.Config.WorkingDir, User: cf.Config.User,
			Entrypoint: cf.Config.Entrypoint, Cmd: cf.Config.Cmd}}
	for i := range layers {
		g := <-results[i]
		if g.err != nil {
			return nil, g.err
		}
		img.Layers = append(img.Layers, "sha256:"+filepath.Base(g.path))
		if err := applyBlob(u, g.path, cf.RootFS.DiffIDs[i]); err != nil {
			var de *DigestError
			if errors.As(err, &de) {
				os.Remove(g.path) // a blob whose content is not what the config says
			}
			return nil, withRef(err, ref)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	img.Skipped = u.skipped
	img.Size = diskUsage(rootfs)
	if err := s.keepMeta(rimg); err != nil { // for Save and Commit
		return nil, registryErr(ref, err)
	}
	b, _ := json.MarshalIndent(img, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, "image.json"), b, 0o644); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	dst := filepath.Join(s.dir, "roots", mdigest.Hex)
	if err := os.Rename(tmp, dst); err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	img.Root = filepath.Join(dst, "rootfs")
	return img, nil
}

// withRef names ref in a BoundError err.
func withRef(err error, ref string) error {
	var be *BoundError
	if errors.As(err, &be) && be.Ref == "" {
		be.Ref = ref
	}
	return err
}

// applyBlob unpacks one layer blob (gzip, zstd or plain tar) and checks
// the uncompressed stream against the config's diff_id.
func applyBlob(u *unpacker, path string, diffID v1.Hash) error {
	f, err := os.Open(path)
	if err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	defer f.Close()
	r, _, closeR, err := decompressed(f)
	if err != nil {
		return fmt.Errorf("layer %s: %w", filepath.Base(path), err)
	}
	defer closeR()
	h := sha256.New()
	tr := io.TeeReader(&streamBound{r, u}, h)
	if err := u.apply(tr); err != nil {
		var be *BoundError
		if errors.As(err, &be) {
			return be // through the tar reader's wrapping
		}
		return err
	}
	if _, err := io.Copy(io.Discard, tr); err != nil { // tar's padding
		var be *BoundError
		if errors.As(err, &be) {
			return be
		}
		return fmt.Errorf("layer %s: %w", filepath.Base(path), err)
	}
	if got := "sha256:" + hex.EncodeToString(h.Sum(nil)); got != diffID.String() {
		return &DigestError{What: "uncompressed layer sha256:" + filepath.Base(path), Want: diffID.String(), Got: got}
	}
	return nil
}

// decompressed reads the layer blob f (gzip, zstd or plain tar) from its
// start uncompressed; it names its OCI media type.
func decompressed(f *os.File) (io.Reader, types.MediaType, func(), error) {
	var magic [4]byte
	n, _ := io.ReadFull(f, magic[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, "", nil, err
	}
	switch {
	case n >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, "", nil, err
		}
		return zr, types.OCILayer, func() { zr.Close() }, nil
	case n == 4 && magic == [4]byte{0x28, 0xb5, 0x2f, 0xfd}:
		zr, err := zstd.NewReader(f)
		if err != nil {
			return nil, "", nil, err
		}
		return zr, types.OCILayerZStd, zr.Close, nil
	}
	return f, types.OCIUncompressedLayer, func() {}, nil
}

// diskUsage is the bytes allocated under dir, each inode counted once
// (an image's hard links share their blocks).
func diskUsage(dir string) int64 {
	var n int64
	seen := map[[2]uint64]bool{}
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok && !seen[[2]uint64{st.Dev, st.Ino}] {
				seen[[2]uint64{st.Dev, st.Ino}] = true
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// List returns every image unpacked in the store, with the references
// that name it, newest first.
func (s *Store) List() ([]Image, error) {
	ents, err := os.ReadDir(filepath.Join(s.dir, "roots"))
	if err != nil {
		return nil, sandbox.Unavailable("image_store", err)
	}
	refs := s.refs()
	var out []Image
	for _, e := range ents {
		img, err := s.byDigest("sha256:" + e.Name())
		if err != nil {
			continue
		}
		img.Refs = refs[img.Digest]
		sort.Strings(img.Refs)
		if len(img.Refs) > 0 {
			img.Ref = img.Refs[0]
		}
		out = append(out, *img)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PulledAt.After(out[j].PulledAt) })
	return out, nil
}

// refs maps each manifest digest to the references naming it.
func (s *Store) refs() map[string][]string {
	m := map[string][]string{}
	ents, _ := os.ReadDir(filepath.Join(s.dir, "refs"))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(s.dir, "refs", e.Name()))
		if err != nil {
			continue
		}
		var rr refRecord
		if json.Unmarshal(b, &rr) == nil {
			m[rr.Digest] = append(m[rr.Digest], rr.Ref)
		}
	}
	return m
}

// Use records that user (a sandbox's id) runs on img's root, so Remove
// and Prune leave it alone until Release.
func (s *Store) Use(img *Image, user string) error {
	hx, err := hexOf(img.Digest)
	if err != nil {
		return err
	}
	d := filepath.Join(s.dir, "uses", hx)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	if err := os.WriteFile(filepath.Join(d, filepath.Base(user)), nil, 0o644); err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	return nil
}

// Release undoes Use for user, whichever image it used.
func (s *Store) Release(user string) {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "uses"))
	for _, e := range ents {
		os.Remove(filepath.Join(s.dir, "uses", e.Name(), filepath.Base(user)))
	}
}

func (s *Store) users(hx string) []string {
	ents, _ := os.ReadDir(filepath.Join(s.dir, "uses", hx))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// Remove forgets ref; the image's root goes too when no other reference
// names it and no sandbox uses it (Invalid{image_in_use} otherwise,
// naming the sandboxes). An unknown ref is NotFound.
func (s *Store) Remove(ctx context.Context, ref string) error {
	img, err := s.Get(ref)
	if err != nil {
		return err
	}
	hx, _ := hexOf(img.Digest)
	r, _ := ParseRef(ref)
	others := 0
	for _, n := range s.refs()[img.Digest] {
		if n != r.Name() {
			others++
		}
	}
	if _, isDigest := r.(name.Digest); !isDigest {
		if others > 0 {
			return os.Remove(filepath.Join(s.dir, "refs", refFile(r)))
		}
	}
	if u := s.users(hx); len(u) > 0 {
		return sandbox.Invalid("image_in_use", fmt.Sprintf("%s is used by %s", ref, strings.Join(u, ", ")))
	}
	unlock, err := s.lock(ctx, "root-"+hx)
	if err != nil {
		return err
	}
	defer unlock()
	for _, n := range s.refs()[img.Digest] {
		rr, err := name.ParseReference(n)
		if err == nil {
			os.Remove(filepath.Join(s.dir, "refs", refFile(rr)))
		}
	}
	return s.removeRoot(hx)
}

func (s *Store) removeRoot(hx string) error {
	gone := filepath.Join(s.dir, "tmp", "gone-"+randHex())
	if err := os.Rename(filepath.Join(s.dir, "roots", hx), gone); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return sandbox.Unavailable("image_store", err)
	}
	if err := os.RemoveAll(gone); err != nil {
		return sandbox.Unavailable("image_store", err)
	}
	return nil
}

// PruneResult says what Prune removed.
type PruneResult struct {
	Roots, Blobs, Partial int
	Bytes                 int64
}

// Prune removes what nothing needs: roots no reference names and no
// sandbox uses, blobs of layers no remaining root was unpacked from, and
// what pulls cut short left in tmp/ (entries nobody holds locked). It
// first waits (until ctx ends) for the pulls and commits in progress, in
// this process or another, whose layers no root keeps yet.
func (s *Store) Prune(ctx context.Context) (PruneResult, error) {
	var res PruneResult
	unlock, err := s.lockAs(ctx, keyStore, flock.Lock) // no pull or commit midway
	if err != nil {
		return res, err
	}
	defer unlock()
	refs := s.refs()
	ents, err := os.ReadDir(filepath.Join(s.dir, "roots"))
	if err != nil {
		return res, sandbox.Unavailable("image_store", err)
	}
	keep := map[string]bool{}
	for _, e := range ents {
		img, err := s.byDigest("sha256:" + e.Name())
		if err == nil && (len(refs[img.Digest]) > 0 || len(s.users(e.Name())) > 0) {
			for _, l := range img.Layers {
				keep[l] = true
			}
			keep[img.Digest], keep[img.ConfigDigest] = true, true // a commit's manifest and config
			continue
		}
		unlock, ok := flock.TryLock(filepath.Join(s.dir, "locks", "root-"+e.Name()))
		if !ok && err == nil {
			continue // being pulled
		}
		res.Bytes += diskUsage(filepath.Join(s.dir, "roots", e.Name()))
		err = s.removeRoot(e.Name())
		if unlock != nil {
			unlock()
		}
		if err != nil {
			return res, err
		}
		res.Roots++
	}
	blobs, _ := os.ReadDir(filepath.Join(s.dir, "blobs", "sha256"))
	for _, b := range blobs {
		if keep["sha256:"+b.Name()] {
			continue
		}
		if unlock, ok := flock.TryLock(filepath.Join(s.dir, "locks", "blob-"+b.Name())); ok || !exists(filepath.Join(s.dir, "locks", "blob-"+b.Name())) {
			p := s.blobPath(b.Name())
			if info, err := os.Stat(p); err == nil {
				res.Bytes += info.Size()
			}
			if os.Remove(p) == nil {
				res.Blobs++
			}
			if unlock != nil {
				unlock()
			}
		}
	}
	tmps, _ := os.ReadDir(filepath.Join(s.dir, "tmp"))
	for _, t := range tmps {
		p := filepath.Join(s.dir, "tmp", t.Name())
		unlock, ok := flock.TryLock(p)
		if !ok {
			continue
		}
		res.Bytes += diskUsage(p)
		os.RemoveAll(p)
		unlock()
		res.Partial++
	}
	return res, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }
