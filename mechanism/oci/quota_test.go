package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// Spec.DiskBytes holds inside a container of each runtime: dd past the
// limit fails with ENOSPC, the container keeps working, and Destroy
// leaves no mount, loop device or image.
func TestDiskQuota(t *testing.T) {
	for _, rt := range runtimes {
		t.Run(rt, func(t *testing.T) {
			requireRuntime(t, rt)
			dir := t.TempDir()
			m := newMech(t, rt, dir)
			method, why := m.DiskQuotaMethod()
			testenv.Require(t, method != "", "a home quota on this host: "+why)
			if !slices.Contains(mechanism.Guaranteed(m), mechanism.DiskQuota) {
				t.Fatal("disk_quota not guaranteed")
			}
			id := tid("quota")
			home := filepath.Join(t.TempDir(), "home")
			if err := os.Mkdir(home, 0o755); err != nil {
				t.Fatal(err)
			}
			started(t, m, id, mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 16 << 20}, HomeDir: home})
			ctx := context.Background()
			c, err := m.Execute(ctx, id, []string{"/bin/sh", "-c", "dd if=/dev/zero of=$HOME/fill bs=1M count=64 2>&1; echo rc=$?"}, mechanism.ExecOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if out := string(c.Stdout); !strings.Contains(out, "No space left") || strings.Contains(out, "rc=0") {
				t.Fatalf("a 64 MiB write under a 16 MiB limit: %s %s", out, c.Stderr)
			}
			if fi, err := os.Stat(filepath.Join(home, "fill")); err != nil || fi.Size() > 16<<20 {
				t.Fatalf("the fill on the host: %v %v", fi, err)
			}
			c, err = m.Execute(ctx, id, []string{"/bin/sh", "-c", "rm $HOME/fill && echo ok > $HOME/x && cat $HOME/x"}, mechanism.ExecOptions{})
			if err != nil || string(c.Stdout) != "ok\n" {
				t.Fatalf("after filling: %+v %v", c, err)
			}
			// A reboot unmounts the home: a file written through HostPath
			// before the next start lands in the quota's file system.
			if err := m.Stop(ctx, id); err != nil {
				t.Fatal(err)
			}
			if err := unix.Unmount(home, 0); err != nil {
				t.Fatal(err)
			}
			p, err := m.HostPath(id, "/home/sprite/from-host")
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := m.Start(ctx, id); err != nil {
				t.Fatal(err)
			}
			c, err = m.Execute(ctx, id, []string{"/bin/sh", "-c", "cat $HOME/from-host; df -B1M --output=size $HOME | tail -1"}, mechanism.ExecOptions{})
			if err != nil || !strings.HasPrefix(string(c.Stdout), "kept") {
				t.Fatalf("after a remount: %+v %v", c, err)
			}
			if err := m.Destroy(ctx, id); err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile("/proc/self/mountinfo")
			if strings.Contains(string(b), " "+home+" ") {
				t.Errorf("the home is still mounted after Destroy")
			}
			loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
			for _, l := range loops {
				if b, err := os.ReadFile(l); err == nil && strings.HasPrefix(string(b), dir+"/") {
					t.Errorf("loop device left: %s: %s", l, b)
				}
			}
			if imgs, _ := filepath.Glob(filepath.Join(dir, "*", "*", "home.img")); len(imgs) > 0 {
				t.Errorf("images left: %v", imgs)
			}
		})
	}
}
