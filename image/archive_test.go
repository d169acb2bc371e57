package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/sandbox"
)

var demoCfg = v1.Config{Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/a", Cmd: []string{"echo", "hi"}}

// sameTree checks the roots a and b hold the same files with the same
// content and modes.
func sameTree(t *testing.T, a, b string) {
	t.Helper()
	list := func(root string) map[string]string {
		m := map[string]string{}
		filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || p == root {
				return nil
			}
			info, _ := d.Info()
			v := info.Mode().String()
			switch {
			case d.Type().IsRegular():
				b, _ := os.ReadFile(p)
				v += " " + string(b)
			case d.Type()&os.ModeSymlink != 0:
				l, _ := os.Readlink(p)
				v += " -> " + l
			}
			rel, _ := filepath.Rel(root, p)
			m[rel] = v
			return nil
		})
		return m
	}
	la, lb := list(a), list(b)
	if len(la) == 0 {
		t.Fatalf("%s is empty", a)
	}
	for k, v := range la {
		if lb[k] != v {
			t.Errorf("%s: %q, loaded %q", k, v, lb[k])
		}
	}
	if len(la) != len(lb) {
		t.Errorf("%d entries, loaded %d", len(la), len(lb))
	}
}

// A pulled image and one committed on it, saved as an OCI layout tar and
// loaded into a fresh store (from a stream, so spooled): the same
// manifest digests, roots, configs and names; a second load changes
// nothing. Saved as a docker save tarball, loaded from a file: the same
// roots and configs.
func TestSaveLoadRoundTrip(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "rt:v1", demoCfg, base, top)
	s, opts := newStore(t)
	pulled, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	os.WriteFile(filepath.Join(home, "state"), []byte("prepared"), 0o644)
	committed, err := s.Commit(context.Background(), pulled, []image.CommitDir{{Src: home, Path: "/home/sprite"}}, "local/made:v1")
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{image.FormatOCI, image.FormatDocker} {
		t.Run(format, func(t *testing.T) {
			var archive bytes.Buffer
			if err := s.Save(context.Background(), &archive, format, ref, "local/made:v1"); err != nil {
				t.Fatal(err)
			}
			s2, _ := newStore(t)
			var src io.Reader = bytes.NewReader(archive.Bytes())
			if format == image.FormatDocker {
				p := filepath.Join(t.TempDir(), "archive.tar")
				os.WriteFile(p, archive.Bytes(), 0o600)
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				defer f.Close()
				src = f
			}
			loaded, err := s2.Load(context.Background(), src, image.LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(loaded) != 2 {
				t.Fatalf("loaded %d images", len(loaded))
			}
			for _, want := range []*image.Image{pulled, committed} {
				got, err := s2.Get(want.Ref)
				if err != nil {
					t.Fatalf("Get %s after the load: %v", want.Ref, err)
				}
				if format == image.FormatOCI && (got.Digest != want.Digest || got.ConfigDigest != want.ConfigDigest) {
					t.Errorf("%s: digest %s config %s, saved %s %s", want.Ref, got.Digest, got.ConfigDigest, want.Digest, want.ConfigDigest)
				}
				if strings.Join(got.Config.Env, " ") != "PATH=/bin A=1" || got.Config.WorkingDir != "/a" || strings.Join(got.Config.Cmd, " ") != "echo hi" {
					t.Errorf("%s: config %+v", want.Ref, got.Config)
				}
				sameTree(t, want.Root, got.Root)
			}
			if b, _ := os.ReadFile(filepath.Join(committed.Root, "home/sprite/state")); string(b) != "prepared" {
				t.Errorf("the committed image lost its home: %q", b)
			}
			for _, sub := range []string{"tmp"} {
				if e := storeEntries(t, s2, sub); len(e) != 0 {
					t.Errorf("%s holds %v after the load", sub, e)
				}
			}
			again, err := s2.Load(context.Background(), bytes.NewReader(archive.Bytes()), image.LoadOptions{})
			if err != nil || len(again) != 2 || again[0].Root != loaded[0].Root {
				t.Fatalf("second load: %v %v", again, err)
			}
			if e := storeEntries(t, s2, "roots"); len(e) != 2 {
				t.Errorf("roots after two loads: %v", e)
			}
			// The loaded image saves again, and commits.
			var again2 bytes.Buffer
			if err := s2.Save(context.Background(), &again2, image.FormatOCI, ref); err != nil {
				t.Fatalf("save of a loaded image: %v", err)
			}
			got, _ := s2.Get(ref)
			if _, err := s2.Commit(context.Background(), got, []image.CommitDir{{Src: home, Path: "/home/sprite"}}, "local/again:v1"); err != nil {
				t.Fatalf("commit on a loaded image: %v", err)
			}
		})
	}
}

// dockerSave writes a tarball as docker save (before docker 25) does:
// uncompressed layers at <id>/layer.tar, a repeated layer as a symlink
// to the first, the config at <hex>.json, manifest.json with RepoTags.
func dockerSave(t *testing.T, tags []string, cfg v1.Config, layers ...imagetest.Layer) []byte {
	t.Helper()
	cf := v1.ConfigFile{OS: "linux", Architecture: runtime.GOARCH, Config: cfg, RootFS: v1.RootFS{Type: "layers"}}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	file := func(name string, body []byte) {
		if err := tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	var paths []string
	first := map[string]string{}
	for i, l := range layers {
		raw := l.Tar()
		sum := sha256.Sum256(raw)
		cf.RootFS.DiffIDs = append(cf.RootFS.DiffIDs, v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(sum[:])})
		id := strings.Repeat(string(rune('a'+i)), 64)
		p := id + "/layer.tar"
		tw.WriteHeader(&tar.Header{Name: id + "/", Typeflag: tar.TypeDir, Mode: 0o755})
		if f, ok := first[string(raw)]; ok {
			tw.WriteHeader(&tar.Header{Name: p, Typeflag: tar.TypeSymlink, Linkname: "../" + f})
		} else {
			first[string(raw)] = p
			file(p, raw)
		}
		paths = append(paths, p)
	}
	cb, _ := json.Marshal(cf)
	sum := sha256.Sum256(cb)
	cfgName := hex.EncodeToString(sum[:]) + ".json"
	file(cfgName, cb)
	mb, _ := json.Marshal([]map[string]any{{"Config": cfgName, "RepoTags": tags, "Layers": paths}})
	file("manifest.json", mb)
	tw.Close()
	return b.Bytes()
}

// A docker save tarball made as docker makes it (uncompressed layers,
// a repeated layer linked) loads, named by its RepoTags, its layers
// merged and its config kept; it saves again.
func TestLoadDockerSave(t *testing.T) {
	repeated := imagetest.Layer{{Name: "r/", Type: tar.TypeDir}, {Name: "r/same", Body: "same"}}
	archive := dockerSave(t, []string{"example.test/app:v1", "example.test/app:latest"}, demoCfg, base, repeated, top, repeated)
	s, _ := newStore(t)
	imgs, err := s.Load(context.Background(), bytes.NewReader(archive), image.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(imgs) != 1 || imgs[0].Ref != "example.test/app:v1" {
		t.Fatalf("loaded %+v", imgs)
	}
	for _, ref := range []string{"example.test/app:v1", "example.test/app:latest"} {
		img, err := s.Get(ref)
		if err != nil {
			t.Fatalf("Get %s: %v", ref, err)
		}
		for p, want := range map[string]string{"a/keep": "keep", "b/new": "new", "replaced/inside": "dir now", "r/same": "same"} {
			if got := read(t, filepath.Join(img.Root, p)); got != want {
				t.Errorf("%s: %s = %q, want %q", ref, p, got, want)
			}
		}
		if _, err := os.Lstat(filepath.Join(img.Root, "a/gone")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a/gone survived its whiteout: %v", err)
		}
		if img.Config.WorkingDir != "/a" {
			t.Errorf("config %+v", img.Config)
		}
	}
	var out bytes.Buffer
	if err := s.Save(context.Background(), &out, image.FormatDocker, "example.test/app:v1"); err != nil {
		t.Fatalf("save: %v", err)
	}
}

// An OCI layout directory (as skopeo writes oci:DIR) loads, named by its
// annotations; in a multi-platform index, the image of this machine's
// architecture is the one loaded; a layout naming its image by a bare
// tag needs a name from the caller.
func TestLoadOCILayoutDir(t *testing.T) {
	mine := imagetest.Image(t, demoCfg, base)
	other := imagetest.Image(t, v1.Config{Cmd: []string{"other"}}, top)
	cf, _ := other.ConfigFile()
	cf = cf.DeepCopy()
	cf.Architecture = "s390x-not-this"
	other, _ = mutate.ConfigFile(other, cf)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: other, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "s390x-not-this"}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: runtime.GOARCH}}})
	dir := t.TempDir()
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "example.test/multi:v1"})); err != nil {
		t.Fatal(err)
	}
	s, _ := newStore(t)
	imgs, err := s.LoadDir(context.Background(), dir, image.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := mine.Digest()
	if len(imgs) != 1 || imgs[0].Digest != want.String() || imgs[0].Ref != "example.test/multi:v1" {
		t.Fatalf("loaded %+v, want %s", imgs, want)
	}
	if got := read(t, filepath.Join(imgs[0].Root, "a/gone")); got != "gone" {
		t.Errorf("not this platform's image: a/gone = %q", got)
	}

	tagged := t.TempDir()
	lp, _ = layout.Write(tagged, empty.Index)
	lp.AppendImage(mine, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v2"}))
	s2, _ := newStore(t)
	if _, err := s2.LoadDir(context.Background(), tagged, image.LoadOptions{}); sandbox.Kind(err) != "invalid" || !strings.Contains(err.Error(), "tag v2") {
		t.Fatalf("a layout naming its image by a tag only: %v", err)
	}
	if imgs, err := s2.LoadDir(context.Background(), tagged, image.LoadOptions{Ref: "example.test/named:v2"}); err != nil || imgs[0].Ref != "example.test/named:v2" {
		t.Fatalf("named by the caller: %+v %v", imgs, err)
	}
	if _, err := s2.Get("example.test/named:v2"); err != nil {
		t.Fatal(err)
	}
}

// Archives that lie: not a tar, neither format, a docker manifest naming
// no image, a layout tar with entries that climb out of it. Each is
// refused or ignored, and nothing is written outside the store or left
// in it.
func TestLoadHostileArchives(t *testing.T) {
	outside := t.TempDir()
	layoutTar := func(extra ...imagetest.Entry) []byte {
		img := imagetest.Image(t, v1.Config{}, base)
		dir := t.TempDir()
		lp, _ := layout.Write(dir, empty.Index)
		lp.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": "example.test/h:v1"}))
		var l imagetest.Layer
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			if d.Type().IsRegular() {
				b, _ := os.ReadFile(p)
				l = append(l, imagetest.Entry{Name: rel, Body: string(b)})
			}
			return nil
		})
		return append(l, extra...).Tar()
	}
	escape := strings.TrimPrefix(filepath.Join(outside, "pwned"), "/")
	for _, c := range []struct {
		name    string
		archive []byte
		ok      bool
	}{
		{"not-a-tar", []byte("hello, this is not a tar archive at all, just some bytes............"), false},
		{"neither", imagetest.Layer{{Name: "README", Body: "x"}}.Tar(), false},
		{"no-name", dockerSave(t, nil, v1.Config{}, base), false},
		{"config-outside", imagetest.Layer{{Name: "manifest.json", Body: `[{"Config":"../../../../etc/passwd","RepoTags":["x:v1"],"Layers":[]}]`}}.Tar(), false},
		// go-containerregistry reads the first manifest.json: a large one
		// first is refused, not read whole into memory.
		{"manifest-twice-first-large", imagetest.Layer{
			{Name: "manifest.json", Body: `[{"Config":"c.json","RepoTags":["x:v1"],"Layers":[]}` + strings.Repeat(" ", 17<<20) + "]"},
			{Name: "manifest.json", Body: `[{"Config":"c.json","RepoTags":["x:v1"],"Layers":[]}]`},
			{Name: "c.json", Body: "{}"},
		}.Tar(), false},
		{"config-linked-to-large", imagetest.Layer{
			{Name: "manifest.json", Body: `[{"Config":"c.json","RepoTags":["x:v1"],"Layers":[]}]`},
			{Name: "c.json", Type: tar.TypeSymlink, Linkname: "big"},
			{Name: "big", Body: `{"os":"linux","rootfs":{"type":"layers","diff_ids":[]}}` + strings.Repeat(" ", 17<<20)},
		}.Tar(), false},
		{"layout-climbing-entries", layoutTar(
			imagetest.Entry{Name: "../../../../../../" + escape, Body: "x"},
			imagetest.Entry{Name: "blobs/sha256/../../../../../../../" + escape, Body: "x"},
			imagetest.Entry{Name: "blobs/evil", Type: tar.TypeSymlink, Linkname: outside},
		), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _ := newStore(t)
			_, err := s.Load(context.Background(), bytes.NewReader(c.archive), image.LoadOptions{})
			if c.ok != (err == nil) {
				t.Fatalf("load: %v", err)
			}
			if err != nil && sandbox.Kind(err) != "invalid" {
				t.Errorf("kind %s: %v", sandbox.Kind(err), err)
			}
			if !c.ok {
				for _, sub := range []string{"roots", "refs", "tmp"} {
					if e := storeEntries(t, s, sub); len(e) != 0 {
						t.Errorf("%s holds %v", sub, e)
					}
				}
			}
			if ents, _ := os.ReadDir(outside); len(ents) != 0 {
				t.Errorf("written outside: %v", ents)
			}
			if e := storeEntries(t, s, "tmp"); len(e) != 0 {
				t.Errorf("tmp holds %v", e)
			}
		})
	}
}

// A loaded image gets a pulled one's bounds: a docker save of a
// compression bomb's layer and of thousands of entries are refused
// under them, with nothing left of the image; an archive larger than
// MaxBytes is refused as it is read.
func TestLoadBounds(t *testing.T) {
	zeros := imagetest.Layer{{Name: "zeros", Body: strings.Repeat("\x00", 32<<20)}}
	bomb := imagetest.Image(t, v1.Config{}, zeros)
	var gz bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.test/bomb:v1"), bomb, &gz); err != nil {
		t.Fatal(err)
	}
	if gz.Len() > 256<<10 {
		t.Fatalf("the bomb's archive is %d bytes", gz.Len())
	}
	s, _ := newStore(t)
	_, err := s.Load(context.Background(), bytes.NewReader(gz.Bytes()), image.LoadOptions{MaxBytes: 8 << 20})
	refusedWhole(t, s, "example.test/bomb:v1", err, "MaxBytes")

	many := dockerSave(t, []string{"example.test/many:v1"}, v1.Config{}, emptyFiles("d", 3000))
	_, err = s.Load(context.Background(), bytes.NewReader(many), image.LoadOptions{MaxEntries: 1000})
	refusedWhole(t, s, "example.test/many:v1", err, "MaxEntries")

	// The uncompressed archive of the zeros (32 MiB) is more than
	// MaxBytes and the 16 MiB an archive may hold beside its layers.
	plain := dockerSave(t, []string{"example.test/plain:v1"}, v1.Config{}, zeros)
	_, err = s.Load(context.Background(), io.MultiReader(bytes.NewReader(plain)), image.LoadOptions{MaxBytes: 1 << 20})
	var be *image.BoundError
	if !errors.As(err, &be) || be.Bound != "MaxBytes" || !strings.Contains(err.Error(), "the archive is more than") {
		t.Fatalf("an archive past MaxBytes: %v", err)
	}
	for _, sub := range []string{"roots", "refs", "tmp"} {
		if e := storeEntries(t, s, sub); len(e) != 0 {
			t.Errorf("%s holds %v", sub, e)
		}
	}
}

// Save of an image the store keeps no manifest of (pulled by an older
// managoat) says so and how to mend it; an unknown image is not_found.
func TestSaveNeedsTheManifest(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "old:v1", v1.Config{}, base)
	s, opts := newStore(t)
	img, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(s.Dir(), "blobs", "sha256", strings.TrimPrefix(img.Digest, "sha256:")))
	err = s.Save(context.Background(), io.Discard, image.FormatOCI, ref)
	if sandbox.Kind(err) != "invalid" || !strings.Contains(err.Error(), "pull it again") {
		t.Fatalf("save without a manifest: %v", err)
	}
	// A pull again keeps it (one manifest request, no layer).
	if _, err := s.Pull(context.Background(), ref, opts); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(context.Background(), io.Discard, image.FormatOCI, ref); err != nil {
		t.Fatalf("save after the pull: %v", err)
	}
	if err := s.Save(context.Background(), io.Discard, image.FormatOCI, reg.Host+"/nothere:v1"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("save of an unknown image: %v", err)
	}
}
