package jail_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// allocated is the bytes allocated on disk below dir.
func allocated(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if info, err := d.Info(); err == nil {
			n += info.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// fsBytes is the size of the file system dir is on.
func fsBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Blocks) * s.Bsize
}

// TestLayerQuota runs the layer's cases on one image (pulled once).
func TestLayerQuota(t *testing.T) {
	testenv.RequireRoot(t)
	img := pullTestImage(t, t.TempDir(), v1.Config{})
	t.Run("Holds", func(t *testing.T) { testLayerQuotaHolds(t, img) })
	t.Run("NotWithoutDisk", func(t *testing.T) { testLayerQuotaNotWithoutDisk(t, img) })
	t.Run("OldStateKeepsUpper", func(t *testing.T) { testLayerQuotaOldStateKeepsUpper(t, img) })
}

// Root of an image sandbox with DiskBytes fills its root (/usr/local,
// /var/tmp): the writes stop at the limit with ENOSPC, in the layer's own
// file system, and the sandbox keeps working; its home has its own limit,
// so the sandbox holds at most twice DiskBytes on the host. The layer
// unmounted behind the jail's back (a reboot) is mounted again by Start
// with its files and its bound. Destroy leaves no mount, loop device or
// image.
func testLayerQuotaHolds(t *testing.T, img *image.Image) {
	j, method := quotaJail(t)
	ctx := context.Background()
	const limit = 16 << 20
	spec := imageSpec(t, img)
	spec.DiskBytes = limit
	started(t, j, "lq", spec)
	base, _, err := j.IDRange("lq")
	if err != nil || base == 0 {
		t.Fatalf("IDRange = %d, %v", base, err)
	}
	home, err := j.HostPath("lq", mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Dir(home)
	layer := filepath.Join(sdir, "layer")

	c := run(t, j, "lq", "id -u; mkdir -p /usr/local /var/tmp && dd if=/dev/zero of=/usr/local/fill bs=1M count=32 2>&1; echo rc=$?")
	out := string(c.Stdout)
	if !strings.HasPrefix(out, "0\n") {
		t.Fatalf("the image's root is not root of the sandbox (no idmapped layer?): %q %q", out, c.Stderr)
	}
	if !strings.Contains(out, "No space left") || strings.Contains(out, "rc=0") {
		t.Fatalf("a 32 MiB write into /usr/local under a 16 MiB limit (%s): %q %q", method, out, c.Stderr)
	}
	// On the host: the write is in the layer's file system, bounded.
	if method == "loop" {
		if m := mountsBelow(t, sdir); !slices.Contains(m, layer) {
			t.Fatalf("the layer is not a mount of its own: %v", m)
		}
		if n := fsBytes(t, layer); n > limit {
			t.Fatalf("the layer's file system holds %d bytes, more than %d", n, limit)
		}
	}
	fi, err := os.Stat(filepath.Join(layer, "upper/usr/local/fill"))
	if err != nil || fi.Size() > limit {
		t.Fatalf("the fill on the host: %v, %v", fi, err)
	}
	if n := allocated(t, layer); n > limit {
		t.Fatalf("the layer holds %d bytes on the host, more than %d", n, limit)
	}
	t.Logf("a 32 MiB dd into /usr/local under DiskBytes %d: the layer holds %d bytes on the host, the fill %d (method %s)", limit, allocated(t, layer), fi.Size(), method)
	// The upper layer's root is still the sandbox's root's on the host.
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(layer, "upper"), &st); err != nil || int(st.Uid) != base || int(st.Gid) != base {
		t.Fatalf("upper/ is %d:%d (%v), want the range's root %d", st.Uid, st.Gid, err, base)
	}
	if _, err := os.Stat(filepath.Join(sdir, "upper")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("an upper/ beside the layer: %v", err)
	}

	// Still working; /var/tmp takes the same bound; the home has its own.
	c = run(t, j, "lq", "rm /usr/local/fill && echo ok > /var/ok && cat /var/ok; dd if=/dev/zero of=/var/tmp/f bs=1M count=32 2>&1 | grep -o 'No space left'; rm -f /var/tmp/f; dd if=/dev/zero of=$HOME/f bs=1M count=8 2>/dev/null && echo home-ok")
	if string(c.Stdout) != "ok\nNo space left\nhome-ok\n" {
		t.Fatalf("after filling: %q %q", c.Stdout, c.Stderr)
	}
	if n := allocated(t, layer) + allocated(t, home); n > 2*limit {
		t.Fatalf("the sandbox holds %d bytes on the host, more than 2 × %d", n, limit)
	}

	if method == "loop" {
		// A reboot: both file systems unmounted; Start mounts them again.
		if err := j.Stop(ctx, "lq"); err != nil {
			t.Fatal(err)
		}
		for _, m := range []string{home, layer} {
			if err := unix.Unmount(m, 0); err != nil {
				t.Fatal(err)
			}
		}
		if err := j.Start(ctx, "lq"); err != nil {
			t.Fatal(err)
		}
		c = run(t, j, "lq", "cat /var/ok; dd if=/dev/zero of=/var/tmp/f bs=1M count=32 2>&1 | grep -o 'No space left'; stat -c %u /")
		if string(c.Stdout) != "ok\nNo space left\n0\n" {
			t.Fatalf("after a remount: %q %q", c.Stdout, c.Stderr)
		}
	}

	if err := j.Destroy(ctx, "lq"); err != nil {
		t.Fatal(err)
	}
	root := filepath.Dir(sdir) // the jail's state directory
	if m := mountsBelow(t, root); len(m) > 0 {
		t.Errorf("mounts left after Destroy: %v", m)
	}
	if l := loopsBacking(root); len(l) > 0 {
		t.Errorf("loop devices left after Destroy: %v", l)
	}
	if _, err := os.Stat(sdir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the sandbox's directory is left: %v", err)
	}
	if img, _ := filepath.Glob(filepath.Join(root, "*", "*.img")); len(img) > 0 {
		t.Errorf("images left: %v", img)
	}
}

// Without DiskBytes an image sandbox is as before: its upper layer beside
// its home, on the state's file system, nothing mounted, no bound.
func testLayerQuotaNotWithoutDisk(t *testing.T, img *image.Image) {
	j := newJail(t)
	started(t, j, "nolq", imageSpec(t, img))
	home, err := j.HostPath("nolq", mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Dir(home)
	c := run(t, j, "nolq", "id -u; mkdir -p /usr/local && dd if=/dev/zero of=/usr/local/fill bs=1M count=20 2>/dev/null && echo rc=$?")
	if string(c.Stdout) != "0\nrc=0\n" {
		t.Fatalf("an unbounded 20 MiB write: %q %q", c.Stdout, c.Stderr)
	}
	if fi, err := os.Stat(filepath.Join(sdir, "upper/usr/local/fill")); err != nil || fi.Size() != 20<<20 {
		t.Fatalf("the write in upper/: %v, %v", fi, err)
	}
	if _, err := os.Stat(filepath.Join(sdir, "layer")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("a layer/ without DiskBytes: %v", err)
	}
	if m := mountsBelow(t, filepath.Dir(sdir)); len(m) > 0 {
		t.Fatalf("mounts without DiskBytes: %v", m)
	}
}

// A Provision that fails after the layer was bounded (here the image's
// directory has a ',' overlayfs cannot take) leaves nothing mounted,
// attached or made.
func TestLayerQuotaFailedProvisionLeavesNothing(t *testing.T) {
	quotaJail(t)
	root := t.TempDir()
	j, err := jail.New(jail.Config{StateDir: root})
	if err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(t.TempDir(), "a,b")
	if err := os.Mkdir(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	err = j.Provision(context.Background(), "lqbad", mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, Image: &mechanism.ImageRoot{Dir: bad}})
	var inv *mechanism.InvalidError
	if !errors.As(err, &inv) {
		t.Fatalf("Provision = %v, want Invalid", err)
	}
	if m := mountsBelow(t, root); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if l := loopsBacking(root); len(l) > 0 {
		t.Errorf("loop devices left: %v", l)
	}
	if img, _ := filepath.Glob(filepath.Join(root, "*", "*.img")); len(img) > 0 {
		t.Errorf("images left: %v", img)
	}
	_ = j.Destroy(context.Background(), "lqbad")
}

// A sandbox provisioned before layers were bounded (its state has no
// layer: here a new one's made so, with upper/ and work/ beside its home
// as Provision made them then) keeps its upper/ where it is, and its
// home's quota.
func testLayerQuotaOldStateKeepsUpper(t *testing.T, img *image.Image) {
	j, method := quotaJail(t)
	if method != "loop" {
		t.Skip("the old state is made from a loop-mounted layer")
	}
	ctx := context.Background()
	spec := imageSpec(t, img)
	spec.DiskBytes = 16 << 20
	if err := j.Provision(ctx, "oldlq", spec); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := j.Destroy(context.Background(), "oldlq"); err != nil {
			t.Errorf("destroy: %v", err)
		}
	})
	base, _, _ := j.IDRange("oldlq")
	home, err := j.HostPath("oldlq", mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Dir(home)
	if err := unix.Unmount(filepath.Join(sdir, "layer"), 0); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"layer", "layer.img"} {
		if err := os.Remove(filepath.Join(sdir, p)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(sdir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(filepath.Join(sdir, "upper"), base, base); err != nil {
		t.Fatal(err)
	}
	// The state as an earlier version wrote it: no layer, no checksum.
	b, err := os.ReadFile(filepath.Join(sdir, "state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var st map[string]any
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if _, ok := st["layer"]; !ok {
		t.Fatalf("the new state records no layer: %s", b)
	}
	for k := range st {
		if k == "layer" || k == "sum" {
			delete(st, k)
		}
	}
	if b, err = json.Marshal(st); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sdir, "state.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "oldlq"); err != nil {
		t.Fatal(err)
	}
	c := run(t, j, "oldlq", "mkdir -p /usr/local && echo x > /usr/local/x && cat /usr/local/x; dd if=/dev/zero of=$HOME/f bs=1M count=32 2>&1 | grep -o 'No space left'")
	if string(c.Stdout) != "x\nNo space left\n" {
		t.Fatalf("inside: %q %q", c.Stdout, c.Stderr)
	}
	if _, err := os.Stat(filepath.Join(sdir, "upper/usr/local/x")); err != nil {
		t.Fatalf("the write is not in the old upper/: %v", err)
	}
	if m := mountsBelow(t, sdir); len(m) != 1 || m[0] != home {
		t.Fatalf("mounts: %v, want the home's only", m)
	}
}

// BenchmarkColdStartImageDisk: provision + start + first execute of
// /bin/true on a cached image with DiskBytes (the home and the layer
// each on a quota: two loop images here) against the same without,
// interleaved in one run; disk_vs_plain is the ratio of the medians.
func BenchmarkColdStartImageDisk(b *testing.B) {
	j := newJail(b)
	method, why := j.DiskQuotaMethod()
	testenv.Require(b, method != "", "a disk quota on this host: "+why)
	img := pullTestImage(b, b.TempDir(), v1.Config{})
	plain := mechanism.Spec{Image: &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest}}
	disk := plain
	disk.DiskBytes = 64 << 20
	n := 0
	once := func(spec mechanism.Spec) time.Duration {
		n++
		return coldStart(b, j, fmt.Sprintf("cd%d", n), spec)
	}
	once(disk)
	once(plain)
	var withDisk, without []time.Duration
	b.ResetTimer()
	for range b.N {
		withDisk = append(withDisk, once(disk))
		without = append(without, once(plain))
	}
	b.ReportMetric(float64(median(withDisk).Microseconds()), "disk_µs")
	b.ReportMetric(float64(median(without).Microseconds()), "plain_µs")
	b.ReportMetric(float64(median(withDisk))/float64(median(without)), "disk_vs_plain")
}
