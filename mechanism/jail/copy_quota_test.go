package jail_test

import (
	"archive/tar"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// On a host without overlayfs (simulated: jail.NoOverlay) an image
// sandbox runs on a copy of its image (rootfs/ in its directory), which
// Spec.DiskBytes does not bound; it needs no bound, because the workload
// cannot write it: without overlayfs there is no idmapped layer, so the
// workload is not root of its root and Landlock allows writes only in its
// home, /tmp and /dev/shm. Here, as the image's user, it fails to make a
// file in a world-writable directory of the image or to grow a
// world-writable file there, and the copy holds no more than before.
func TestCopyRootNotWritable(t *testing.T) {
	testenv.RequireRoot(t)
	img := pullTestImage(t, t.TempDir(), v1.Config{}, imagetest.Layer{
		{Name: "var/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "var/tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "var/tmp/open", Body: "x", Mode: 0o666},
	})
	jail.NoOverlay(t)
	j := newJail(t)
	spec := imageSpec(t, img)
	spec.DiskBytes = 16 << 20
	if method, _ := j.DiskQuotaMethod(); method == "" {
		spec.DiskBytes = 0
	}
	started(t, j, "cr", spec)
	home, err := j.HostPath("cr", mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	copyRoot := filepath.Join(filepath.Dir(home), "rootfs")
	before := allocated(t, copyRoot)
	c := run(t, j, "cr", "id -u; ls -ld /var/tmp | cut -c1-10; "+
		"dd if=/dev/zero of=/var/tmp/new bs=1M count=4 2>&1 | head -1; "+
		"dd if=/dev/zero of=/var/tmp/open bs=1M count=4 2>&1 | head -1; "+
		"dd if=/dev/zero of=$HOME/f bs=1M count=1 2>/dev/null && echo home-ok")
	out := string(c.Stdout)
	if !strings.HasPrefix(out, "1000\ndrwxrwxrwt\n") || !strings.HasSuffix(out, "home-ok\n") {
		t.Fatalf("not the case this test is about (the image's user in a world-writable /var/tmp): %q %q", out, c.Stderr)
	}
	if strings.Count(out, "Permission denied") != 2 {
		t.Fatalf("writes into the copy of the image: %q %q", out, c.Stderr)
	}
	if after := allocated(t, copyRoot); after > before {
		t.Fatalf("the copy grew from %d to %d bytes", before, after)
	}
	t.Logf("the copy holds %d bytes (the image %d): %q", before, allocated(t, img.Root), out)
}
