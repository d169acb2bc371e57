package jail_test

import (
	"context"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// BenchmarkColdStartImage: provision + start + first execute of
// /bin/true on a cached image (imagetest.Conformance, already pulled)
// against the same on the host's root, interleaved in one run;
// image_vs_host is the ratio of the medians (the target: at most
// 1.5). One sandbox of each is made first, untimed (the gate's probes).
func BenchmarkColdStartImage(b *testing.B) {
	j := newJail(b)
	img := pullTestImage(b, b.TempDir(), v1.Config{})
	onImage := mechanism.Spec{Image: &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest}}
	n := 0
	once := func(spec mechanism.Spec) time.Duration {
		n++
		return coldStart(b, j, fmt.Sprintf("ci%d", n), spec)
	}
	once(onImage)
	once(mechanism.Spec{})
	var image, host []time.Duration
	b.ResetTimer()
	for range b.N {
		image = append(image, once(onImage))
		host = append(host, once(mechanism.Spec{}))
	}
	b.ReportMetric(float64(median(image).Microseconds()), "image_µs")
	b.ReportMetric(float64(median(host).Microseconds()), "host_µs")
	b.ReportMetric(float64(median(image))/float64(median(host)), "image_vs_host")
}

// BenchmarkHundredSandboxesDisk starts 100 sandboxes on one image and
// reports the bytes on disk: the image's unpacked root (once), what the
// 100 sandboxes' own layers hold together, and total over what 100
// copies of the image would take (hundred_vs_copies).
func BenchmarkHundredSandboxesDisk(b *testing.B) {
	testenv.RequireRoot(b)
	state := b.TempDir()
	j, err := jail.New(jail.Config{StateDir: state})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	dir := b.TempDir()
	img := pullTestImage(b, dir, v1.Config{})
	spec := mechanism.Spec{Image: &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest}}
	for range b.N {
		ids := make([]string, 100)
		for i := range ids {
			ids[i] = fmt.Sprintf("d%d", i)
			if err := j.Provision(ctx, ids[i], spec); err != nil {
				b.Fatal(err)
			}
			if err := j.Start(ctx, ids[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		imageBytes := blocks(img.Root)
		var own int64
		for _, id := range ids {
			own += blocks(filepath.Join(state, id, "upper")) + blocks(filepath.Join(state, id, "work"))
		}
		for _, id := range ids {
			if err := j.Destroy(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(imageBytes), "image_bytes")
		b.ReportMetric(float64(own), "own_layers_bytes")
		b.ReportMetric(float64(imageBytes+own)/float64(100*imageBytes), "hundred_vs_copies")
		b.StartTimer()
	}
}

// blocks is the bytes allocated under dir, each inode once (the image's
// hard links share their blocks).
func blocks(dir string) int64 {
	var n int64
	seen := map[uint64]bool{}
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil {
			if info, err := d.Info(); err == nil {
				st := info.Sys().(*syscall.Stat_t)
				if !seen[st.Ino] {
					seen[st.Ino] = true
					n += st.Blocks * 512
				}
			}
		}
		return nil
	})
	return n
}
