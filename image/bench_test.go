package image_test

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
)

// benchLayers are three layers of 1500 files each (4 KiB to 64 KiB of
// text that compresses about as well as programs do), in nested
// directories: about 50 MiB unpacked.
func benchLayers() []imagetest.Layer {
	var layers []imagetest.Layer
	seed := uint32(1)
	for l := range 3 {
		var layer imagetest.Layer
		for d := range 30 {
			layer = append(layer, imagetest.Entry{Name: fmt.Sprintf("l%d/d%d/", l, d), Type: tar.TypeDir})
			for f := range 50 {
				n := 4096 << ((d + f) % 5)
				b := make([]byte, n)
				for i := range b {
					seed = seed*1664525 + 1013904223
					b[i] = "abcdefghijklmnopqrstuvwxyz0123456789 \n"[seed>>27%38]
				}
				layer = append(layer, imagetest.Entry{Name: fmt.Sprintf("l%d/d%d/f%d", l, d, f), Body: string(b)})
			}
		}
		layers = append(layers, layer)
	}
	return layers
}

// BenchmarkPullUnpack measures a pull of a three-layer image from a
// registry served in this process into an empty store (download, digest
// and diff_id verification, unpack) against `tar -xzf` of the same gzip
// layers from local files into an empty directory, in the same run:
// pull_vs_tar is tar's time over the pull's (the target: at
// least 0.5).
func BenchmarkPullUnpack(b *testing.B) {
	reg := imagetest.Serve(b)
	layers := benchLayers()
	img := imagetest.Image(b, v1.Config{}, layers...)
	ref := reg.PushImage(b, "bench:v1", img)
	dir := b.TempDir()
	// The same layers as local gzip files, for tar.
	ls, _ := img.Layers()
	var files []string
	var unpacked int64
	for i, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			b.Fatal(err)
		}
		p := filepath.Join(dir, fmt.Sprintf("layer%d.tgz", i))
		f, _ := os.Create(p)
		io.Copy(f, rc)
		f.Close()
		rc.Close()
		files = append(files, p)
	}
	for _, l := range layers {
		for _, e := range l {
			unpacked += int64(len(e.Body))
		}
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	var pull, untar time.Duration
	b.ResetTimer()
	for i := range b.N {
		s, err := image.Open(filepath.Join(dir, fmt.Sprintf("store%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		t0 := time.Now()
		if _, err := s.Pull(context.Background(), ref, image.PullOptions{Transport: tr}); err != nil {
			b.Fatal(err)
		}
		pull += time.Since(t0)
		out := filepath.Join(dir, fmt.Sprintf("tar%d", i))
		os.Mkdir(out, 0o755)
		t0 = time.Now()
		for _, f := range files {
			if o, err := exec.Command("tar", "-xzf", f, "-C", out).CombinedOutput(); err != nil {
				b.Fatalf("tar: %v %s", err, o)
			}
		}
		untar += time.Since(t0)
		b.StopTimer()
		os.RemoveAll(s.Dir())
		os.RemoveAll(out)
		b.StartTimer()
	}
	b.ReportMetric(float64(untar)/float64(pull), "pull_vs_tar")
	b.ReportMetric(float64(unpacked)*float64(b.N)/pull.Seconds()/(1<<20), "pull_MiB/s")
	b.ReportMetric(float64(unpacked)*float64(b.N)/untar.Seconds()/(1<<20), "tar_MiB/s")
}
