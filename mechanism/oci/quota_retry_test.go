package oci_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
)

// A create cut short after it mounted the home's loop image and before
// it wrote quota.json (here quota.json is removed, which is what it
// leaves) has moved the files of the home its caller gave into the
// image. The next Start keeps them, in the home and under the quota,
// whether the image is still mounted or a reboot took it off.
func TestDiskQuotaRetriedCreateKeepsTheHome(t *testing.T) {
	for _, rt := range runtimes {
		for _, reboot := range []bool{false, true} {
			t.Run(rt+map[bool]string{false: "/mounted", true: "/after a reboot"}[reboot], func(t *testing.T) {
				requireRuntime(t, rt)
				dir := t.TempDir()
				m := newMech(t, rt, dir)
				method, why := m.DiskQuotaMethod()
				testenv.Require(t, method != "", "a home quota on this host: "+why)
				home := filepath.Join(t.TempDir(), "home")
				if err := os.Mkdir(home, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
					t.Fatal(err)
				}
				id := tid("qretry")
				started(t, m, id, mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 16 << 20}, HomeDir: home})
				ctx := context.Background()
				if err := m.Stop(ctx, id); err != nil {
					t.Fatal(err)
				}
				qf, _ := filepath.Glob(filepath.Join(dir, "*", "sandboxes", id, "quota.json"))
				if len(qf) != 1 {
					t.Fatalf("quota.json of %s: %v", id, qf)
				}
				if err := os.Remove(qf[0]); err != nil {
					t.Fatal(err)
				}
				if reboot {
					if err := unix.Unmount(home, 0); err != nil {
						t.Fatal(err)
					}
				}
				if err := m.Start(ctx, id); err != nil {
					t.Fatal(err)
				}
				c, err := m.Execute(ctx, id, []string{"/bin/sh", "-c", "cat $HOME/notes; df -B1M --output=size $HOME | tail -1"}, mechanism.ExecOptions{})
				if err != nil {
					t.Fatal(err)
				}
				if !strings.HasPrefix(string(c.Stdout), "mine") {
					t.Fatalf("the caller's file after the retry: %q %q", c.Stdout, c.Stderr)
				}
				b, _ := os.ReadFile("/proc/self/mountinfo")
				if !strings.Contains(string(b), " "+home+" ") {
					t.Errorf("the home is not under its quota after the retry")
				}
			})
		}
	}
}

// Destroy leaves a home given in Spec.HomeDir with what it held and what
// the workload wrote there, as without a quota: the loop image's files
// are copied back under it before the image goes.
func TestDiskQuotaDestroyKeepsTheGivenHome(t *testing.T) {
	rt := runtimes[0]
	requireRuntime(t, rt)
	m := newMech(t, rt, t.TempDir())
	method, why := m.DiskQuotaMethod()
	testenv.Require(t, method != "", "a home quota on this host: "+why)
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := tid("qdestroy")
	started(t, m, id, mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 16 << 20}, HomeDir: home})
	ctx := context.Background()
	c, err := m.Execute(ctx, id, []string{"/bin/sh", "-c", "echo result > $HOME/out && cat $HOME/notes"}, mechanism.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(c.Stdout) != "mine" {
		t.Fatalf("in the sandbox: %q %q", c.Stdout, c.Stderr)
	}
	if err := m.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(b), " "+home+" ") {
		t.Errorf("the home is still mounted after Destroy")
	}
	for name, want := range map[string]string{"notes": "mine", "out": "result\n"} {
		if b, err := os.ReadFile(filepath.Join(home, name)); err != nil || string(b) != want {
			t.Errorf("%s after Destroy: %q, %v; want %q", name, b, err, want)
		}
	}
}

// Destroy after a create cut short before it wrote quota.json (removed
// here): the home gets its files back, nothing is left mounted.
func TestDiskQuotaDestroyAfterCreateCutShort(t *testing.T) {
	rt := runtimes[0]
	requireRuntime(t, rt)
	dir := t.TempDir()
	m := newMech(t, rt, dir)
	method, why := m.DiskQuotaMethod()
	testenv.Require(t, method != "", "a home quota on this host: "+why)
	home := filepath.Join(t.TempDir(), "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	id := tid("qcut")
	started(t, m, id, mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 16 << 20}, HomeDir: home})
	ctx := context.Background()
	if err := m.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	qf, _ := filepath.Glob(filepath.Join(dir, "*", "sandboxes", id, "quota.json"))
	if len(qf) != 1 {
		t.Fatalf("quota.json of %s: %v", id, qf)
	}
	if err := os.Remove(qf[0]); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(b), " "+home+" ") {
		t.Errorf("the home is still mounted after Destroy")
	}
	if b, err := os.ReadFile(filepath.Join(home, "notes")); err != nil || string(b) != "mine" {
		t.Errorf("the caller's file after Destroy: %q, %v", b, err)
	}
}
