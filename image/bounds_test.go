package image_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/sandbox"
)

// refusedWhole checks err is the BoundError of bound and that the store
// holds nothing of the image: no root, no ref, no temporary directory.
func refusedWhole(t *testing.T, s *image.Store, ref string, err error, bound string) {
	t.Helper()
	var be *image.BoundError
	if !errors.As(err, &be) || be.Bound != bound || be.Ref != ref {
		t.Fatalf("want a BoundError of %s for %s, got %v", bound, ref, err)
	}
	var ie *sandbox.InvalidError
	if !errors.As(err, &ie) || ie.Reason != "image_too_large" {
		t.Errorf("%v is not invalid image_too_large (%s)", err, sandbox.Kind(err))
	}
	if bound == "MaxBytes" || bound == "MaxEntries" {
		if !strings.Contains(err.Error(), "PullOptions."+bound) {
			t.Errorf("the error does not say how to raise the bound: %v", err)
		}
	}
	for _, sub := range []string{"roots", "refs", "tmp", "uses"} {
		if e := storeEntries(t, s, sub); len(e) != 0 {
			t.Errorf("%s holds %v after the refusal", sub, e)
		}
	}
	if _, err := s.Get(ref); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Get after the refusal: %v", err)
	}
}

// A compression bomb: a layer of a few tens of KiB whose one file
// unpacks to 64 MiB is refused under a 16 MiB bound, with nothing of it
// left in the store; raised past it, the same image pulls.
func TestCompressionBombRefused(t *testing.T) {
	reg := imagetest.Serve(t)
	bomb := imagetest.Layer{{Name: "zeros", Body: strings.Repeat("\x00", 64<<20)}}
	img := imagetest.Image(t, v1.Config{}, bomb)
	ls, _ := img.Layers()
	if size, _ := ls[0].Size(); size > 256<<10 {
		t.Fatalf("the bomb's layer is %d bytes compressed: not a bomb", size)
	}
	ref := reg.PushImage(t, "bomb:v1", img)
	s, opts := newStore(t)
	opts.MaxBytes = 16 << 20
	_, err := s.Pull(context.Background(), ref, opts)
	refusedWhole(t, s, ref, err, "MaxBytes")
	if !strings.Contains(err.Error(), "unpack to more than 16.0 MiB") {
		t.Errorf("the error does not say what passed the bound: %v", err)
	}
	opts.MaxBytes = 128 << 20
	if got, err := s.Pull(context.Background(), ref, opts); err != nil || got.Size < 64<<20 {
		t.Fatalf("under a raised bound: %v %v", got, err)
	}
}

// A file whose header claims 1 TiB (no body follows) is refused by the
// default bound before a byte of it is written.
func TestDeclaredHugeFileRefusedByTheDefault(t *testing.T) {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	raw := b.Bytes()
	reg := imagetest.Serve(t)
	ref := reg.PushImage(t, "huge:v1", rawImage(t, raw))
	s, opts := newStore(t)
	_, err := s.Pull(context.Background(), ref, opts)
	refusedWhole(t, s, ref, err, "MaxBytes")
	if !strings.Contains(err.Error(), fmt.Sprint(image.DefaultMaxBytes)) {
		t.Errorf("not the default bound: %v", err)
	}
}

// rawImage is an image of one layer made of the tar stream raw, as
// written.
func rawImage(t *testing.T, raw ...[]byte) v1.Image {
	t.Helper()
	img := empty.Image
	for _, r := range raw {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(r)), nil })
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func emptyFiles(prefix string, n int) imagetest.Layer {
	l := imagetest.Layer{{Name: prefix + "/", Type: tar.TypeDir}}
	for i := range n {
		l = append(l, imagetest.Entry{Name: fmt.Sprintf("%s/f%05d", prefix, i)})
	}
	return l
}

// A layer of 5000 empty files (a few KiB compressed: an inode bomb) is
// refused under a bound of 1000 entries, and so are two layers of 600
// each (the bound is the image's, summed over its layers); raised, the
// image pulls.
func TestManyEntriesRefused(t *testing.T) {
	reg := imagetest.Serve(t)
	many := reg.Push(t, "many:v1", v1.Config{}, emptyFiles("d", 5000))
	split := reg.Push(t, "split:v1", v1.Config{}, emptyFiles("a", 600), emptyFiles("b", 600))
	s, opts := newStore(t)
	opts.MaxEntries = 1000
	_, err := s.Pull(context.Background(), many, opts)
	refusedWhole(t, s, many, err, "MaxEntries")
	if !strings.Contains(err.Error(), "more than 1000 entries") {
		t.Errorf("the error does not say what passed the bound: %v", err)
	}
	_, err = s.Pull(context.Background(), split, opts)
	refusedWhole(t, s, split, err, "MaxEntries")
	opts.MaxEntries = 10000
	if _, err := s.Pull(context.Background(), many, opts); err != nil {
		t.Fatalf("under a raised bound: %v", err)
	}
}

// Layers whose compressed size passes MaxBytes are refused before any is
// downloaded.
func TestDownloadBoundRefusesBeforeFetching(t *testing.T) {
	noise := make([]byte, 2<<20)
	rand.Read(noise)
	reg := imagetest.Serve(t)
	img := imagetest.Image(t, v1.Config{}, imagetest.Layer{{Name: "noise", Body: string(noise)}})
	ref := reg.PushImage(t, "noise:v1", img)
	s, opts := newStore(t)
	opts.MaxBytes = 1 << 20
	_, err := s.Pull(context.Background(), ref, opts)
	refusedWhole(t, s, ref, err, "MaxBytes")
	if !strings.Contains(err.Error(), "download more than 1.0 MiB") {
		t.Errorf("the error does not say what passed the bound: %v", err)
	}
	ls, _ := img.Layers()
	d, _ := ls[0].Digest()
	if n := reg.BlobGETs(d.String()); n != 0 {
		t.Errorf("the layer was fetched %d times", n)
	}
	if e := storeEntries(t, s, "blobs/sha256"); len(e) != 0 {
		t.Errorf("blobs %v", e)
	}
}

// A layer of one small file followed by 24 MiB of zeros after the tar's
// end (a few tens of KiB compressed; a terabyte would cost a
// decompressor hours) is refused under MaxBytes 1 MiB, MaxEntries 10:
// its stream may be at most its content, 4 KiB an entry and 16 MiB
// longer.
func TestTrailingDataBomb(t *testing.T) {
	raw := append(imagetest.Layer{{Name: "small", Body: "x"}}.Tar(), make([]byte, 24<<20)...)
	reg := imagetest.Serve(t)
	ref := reg.PushImage(t, "trailing:v1", rawImage(t, raw))
	s, opts := newStore(t)
	opts.MaxBytes, opts.MaxEntries = 1<<20, 10
	_, err := s.Pull(context.Background(), ref, opts)
	refusedWhole(t, s, ref, err, "MaxBytes")
	if !strings.Contains(err.Error(), "far longer than their files") {
		t.Errorf("the error does not say what passed the bound: %v", err)
	}
	opts.MaxBytes = 16 << 20 // 16 MiB + 40 KiB + 16 MiB: the 24 MiB pass
	if _, err := s.Pull(context.Background(), ref, opts); err != nil {
		t.Fatalf("under a raised bound: %v", err)
	}
}
