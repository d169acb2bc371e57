package oci_test

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/mechanism"
)

// An image sandbox's upper layer, on the host's disk outside any quota,
// takes none of the workload's writes: the container's root is read-only
// (bundle.go), so a world-writable directory of the image (/var/tmp,
// /data) refuses a write with EROFS and the layer stays as the mechanism
// made it. That is this mechanism's bound on the layer; the jail, whose
// workload may write its root, bounds the layer with Spec.DiskBytes
// instead (mechanism/jail/quota.go).
func TestImageLayerTakesNoWrites(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			dir := t.TempDir()
			m := newMech(t, rt, dir)
			img := pullImage(t, imagetest.Layer{
				{Name: "var/", Type: tar.TypeDir}, {Name: "var/tmp/", Type: tar.TypeDir, Mode: 0o1777},
				{Name: "data/", Type: tar.TypeDir, Mode: 0o777},
			})
			id := tid("rolayer")
			started(t, m, id, mechanism.Spec{Image: img})
			c, err := m.Execute(context.Background(), id, []string{"/bin/sh", "-c",
				"stat -c %a /var/tmp /data; for d in /var/tmp /data; do dd if=/dev/zero of=$d/fill bs=1M count=4 2>&1; echo rc=$?; done; echo ok > $HOME/ok && cat $HOME/ok"}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out := string(c.Stdout)
			if !strings.HasPrefix(out, "1777\n777\n") || strings.Count(out, "Read-only file system") != 2 || strings.Contains(out, "rc=0") || !strings.HasSuffix(out, "ok\n") {
				t.Fatalf("writes into the image's world-writable directories: %q %q", out, c.Stderr)
			}
			upper := filepath.Join(dir, rt, "sandboxes", id, "upper")
			for _, p := range []string{"var/tmp/fill", "data/fill"} {
				if _, err := os.Lstat(filepath.Join(upper, p)); err == nil {
					t.Errorf("the upper layer took the workload's %s", p)
				}
			}
		})
	}
}
