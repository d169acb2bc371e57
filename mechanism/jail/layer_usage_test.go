package jail_test

import (
	"context"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/internal/testenv"
)

// What an image sandbox writes outside its home (here 4 MiB in /var/tmp)
// is in its writable layer on the host, bounded (DiskBytes: layer/upper)
// or not (upper/), and Usage counts it with the home.
func TestUsageCountsTheLayer(t *testing.T) {
	testenv.RequireRoot(t)
	img := pullTestImage(t, t.TempDir(), v1.Config{})
	for _, disk := range []int64{0, 16 << 20} {
		t.Run(map[bool]string{false: "unbounded", true: "bounded"}[disk > 0], func(t *testing.T) {
			j := newJail(t)
			if disk > 0 {
				method, why := j.DiskQuotaMethod()
				testenv.Require(t, method != "", "a disk quota on this host: "+why)
			}
			spec := imageSpec(t, img)
			spec.DiskBytes = disk
			started(t, j, "lu", spec)
			ctx := context.Background()
			ub, err := j.Usage(ctx, "lu")
			if err != nil {
				t.Fatal(err)
			}
			c := run(t, j, "lu", "mkdir -p /var/tmp && dd if=/dev/urandom of=/var/tmp/f bs=1M count=4 conv=fsync 2>/dev/null && echo ok")
			if string(c.Stdout) != "ok\n" {
				t.Fatalf("the write: %q %q", c.Stdout, c.Stderr)
			}
			ua, err := j.Usage(ctx, "lu")
			if err != nil {
				t.Fatal(err)
			}
			// The write went to the image's /var/tmp, in the layer, not
			// the home: Usage counted only the home before.
			if ua.DiskBytes-ub.DiskBytes < 4<<20 {
				t.Fatalf("Usage counts %d disk bytes after a 4 MiB write into the layer (%d before)", ua.DiskBytes, ub.DiskBytes)
			}
			t.Logf("DiskBytes %d: usage %d → %d bytes", disk, ub.DiskBytes, ua.DiskBytes)
		})
	}
}
