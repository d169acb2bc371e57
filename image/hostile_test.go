package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/sandbox"
)

// Layers that try to write outside the image's directory: through "../"
// names, absolute and relative symlinks planted in the same or an earlier
// layer, hard links to host files, whiteouts through links, and device
// nodes. Each either is refused (LayerError, nothing published) or lands
// inside the root; the host directory beside the store is never touched.
func TestHostileLayersStayInside(t *testing.T) {
	reg := imagetest.Serve(t)
	for _, c := range []struct {
		name    string
		layers  func(outside string) []imagetest.Layer
		refused bool
		check   func(t *testing.T, img *image.Image)
	}{
		{name: "dotdot", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "../../../../../../../../" + strings.TrimPrefix(o, "/") + "/pwned", Body: "x"}}}
		}},
		{name: "dotdot-inner", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "a/", Type: tar.TypeDir}, {Name: "a/../../pwned", Body: "x"}}}
		}},
		{name: "abs-symlink-same-layer", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "evil", Type: tar.TypeSymlink, Linkname: o}, {Name: "evil/pwned", Body: "x"}}}
		}, refused: true},
		{name: "abs-symlink-earlier-layer", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{
				{{Name: "evil", Type: tar.TypeSymlink, Linkname: o}},
				{{Name: "evil/pwned", Body: "x"}},
			}
		}, refused: true},
		{name: "abs-symlink-to-existing-dir-inside", layers: func(o string) []imagetest.Layer {
			// The same absolute path made inside the root: the write
			// follows the link there, in the root, as it would in the
			// sandbox.
			return []imagetest.Layer{
				{{Name: strings.TrimPrefix(o, "/") + "/", Type: tar.TypeDir}, {Name: "evil", Type: tar.TypeSymlink, Linkname: o}},
				{{Name: "evil/pwned", Body: "x"}},
			}
		}, check: func(t *testing.T, img *image.Image) {
			if found := findFile(img.Root, "pwned"); found != "" {
				return
			}
			t.Errorf("evil/pwned is not inside the root")
		}},
		{name: "relative-symlink-up", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{
				{Name: "up", Type: tar.TypeSymlink, Linkname: "../../../../../../../../../../" + strings.TrimPrefix(o, "/")},
				{Name: "up/pwned", Body: "x"},
			}}
		}, refused: true},
		{name: "symlink-then-file-replacing-it", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{
				{{Name: "secret", Type: tar.TypeSymlink, Linkname: o + "/secret"}},
				{{Name: "secret", Body: "overwritten"}}, // replaces the link, never writes through it
			}
		}, check: func(t *testing.T, img *image.Image) {
			if b, _ := os.ReadFile(filepath.Join(img.Root, "secret")); string(b) != "overwritten" {
				t.Errorf("secret in the root = %q", b)
			}
		}},
		{name: "hardlink-dotdot", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "h", Type: tar.TypeLink, Linkname: "../../../../../../../../" + strings.TrimPrefix(o, "/") + "/secret"}}}
		}},
		{name: "hardlink-absolute", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "h", Type: tar.TypeLink, Linkname: o + "/secret"}}}
		}},
		{name: "hardlink-through-symlink", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "evil", Type: tar.TypeSymlink, Linkname: o}, {Name: "h", Type: tar.TypeLink, Linkname: "evil/secret"}}}
		}},
		{name: "whiteout-through-symlink", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{
				{{Name: "evil", Type: tar.TypeSymlink, Linkname: o}},
				{{Name: "evil/.wh.secret"}},
			}
		}},
		{name: "opaque-through-symlink", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{
				{{Name: "evil", Type: tar.TypeSymlink, Linkname: o}},
				{{Name: "evil/.wh..wh..opq"}},
			}
		}},
		{name: "whiteout-dotdot", refused: true, layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{{Name: "a/", Type: tar.TypeDir}, {Name: "a/.wh.."}}}
		}},
		{name: "device-nodes", layers: func(o string) []imagetest.Layer {
			return []imagetest.Layer{{
				{Name: "dev/", Type: tar.TypeDir},
				{Name: "dev/sda", Type: tar.TypeBlock, Major: 8},
				{Name: "dev/mem", Type: tar.TypeChar, Major: 1, Mode: 0o666},
				{Name: "ok", Body: "ok"},
			}}
		}, check: func(t *testing.T, img *image.Image) {
			for _, d := range []string{"dev/sda", "dev/mem"} {
				if _, err := os.Lstat(filepath.Join(img.Root, d)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s was made: %v", d, err)
				}
			}
			if img.Skipped != 2 {
				t.Errorf("Skipped = %d, want 2", img.Skipped)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			outside := filepath.Join(dir, "outside")
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o644)
			ref := reg.Push(t, "hostile-"+c.name+":v1", v1.Config{}, c.layers(outside)...)
			s, err := image.Open(filepath.Join(dir, "images"))
			if err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			img, err := s.Pull(context.Background(), ref, image.PullOptions{Transport: tr})
			switch {
			case c.refused && err == nil:
				t.Errorf("pulled: %s", img.Root)
			case c.refused:
				if e := storeEntries(t, s, "roots"); len(e) != 0 {
					t.Errorf("a refused image left roots %v", e)
				}
			case err != nil:
				t.Errorf("refused: %v", err)
			case c.check != nil:
				c.check(t, img)
			}
			ents, _ := os.ReadDir(outside)
			if len(ents) != 1 || ents[0].Name() != "secret" {
				t.Errorf("outside holds %v", ents)
			}
			var st syscall.Stat_t
			if err := syscall.Stat(filepath.Join(outside, "secret"), &st); err != nil || st.Nlink != 1 {
				t.Errorf("the host file was linked or removed: nlink %d, %v", st.Nlink, err)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "host" {
				t.Errorf("the host file reads %q", b)
			}
			for _, p := range []string{filepath.Join(dir, "pwned"), "/pwned"} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written", p)
				}
			}
		})
	}
}

// findFile returns a path under root (not following links) named name.
func findFile(root, name string) string {
	var found string
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == name && d.Type().IsRegular() {
			found = p
		}
		return nil
	})
	return found
}

// A layer whose descriptor names URLs (a foreign layer, which the
// library fetches from those addresses when the registry lacks it) is
// refused before any layer is fetched: an image never chooses where a
// pull connects.
func TestForeignLayerRefused(t *testing.T) {
	reg := imagetest.Serve(t)
	img, err := mutate.Append(empty.Image, mutate.Addendum{Layer: base.V1(), URLs: []string{"https://foreign.invalid/layer"}})
	if err != nil {
		t.Fatal(err)
	}
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	ref := reg.PushImage(t, "foreign:v1", img)
	s, opts := newStore(t)
	if _, err := s.Pull(context.Background(), ref, opts); sandbox.Kind(err) != "invalid" || !strings.Contains(err.Error(), "foreign layer") {
		t.Fatalf("an image with a foreign layer: %v", err)
	}
	for _, sub := range []string{"roots", "refs", "tmp", "blobs/sha256"} {
		if e := storeEntries(t, s, sub); len(e) != 0 {
			t.Errorf("%s holds %v", sub, e)
		}
	}
}
