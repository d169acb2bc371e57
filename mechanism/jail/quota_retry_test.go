package jail_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// A Provision cut short after it mounted the home's loop image (killed
// before it wrote its state: here its state is removed, which is what
// such a Provision leaves) has moved the files of the home its caller
// gave into the image. A retried Provision keeps them, in the home and
// under the quota, whether the image is still mounted or a reboot took
// it off; Destroy then leaves nothing mounted.
func TestDiskQuotaRetriedProvisionKeepsTheHome(t *testing.T) {
	quotaJail(t)
	for _, reboot := range []bool{false, true} {
		name := map[bool]string{false: "mounted", true: "after a reboot"}[reboot]
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			j, err := jail.New(jail.Config{StateDir: root})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			home := filepath.Join(t.TempDir(), "home")
			if err := os.MkdirAll(filepath.Join(home, "work"), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(home, "work", "thesis.tex"), []byte("six years"), 0o644); err != nil {
				t.Fatal(err)
			}
			spec := mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, HomeDir: home}
			if err := j.Provision(ctx, "qr", spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Destroy(context.Background(), "qr") })
			if err := os.Remove(filepath.Join(root, "qr", "state.json")); err != nil {
				t.Fatal(err)
			}
			if reboot {
				if err := unix.Unmount(home, 0); err != nil {
					t.Fatal(err)
				}
			}
			if err := j.Provision(ctx, "qr", spec); err != nil {
				t.Fatalf("the retried Provision: %v", err)
			}
			if b, err := os.ReadFile(filepath.Join(home, "work", "thesis.tex")); err != nil || string(b) != "six years" {
				t.Fatalf("the caller's file after the retry: %q, %v", b, err)
			}
			if m := mountsBelow(t, filepath.Dir(home)); len(m) != 1 || m[0] != home {
				t.Errorf("mounts = %v, want the home's alone", m)
			}
			if err := j.Destroy(ctx, "qr"); err != nil {
				t.Fatal(err)
			}
			if m := append(mountsBelow(t, root), mountsBelow(t, filepath.Dir(home))...); len(m) > 0 {
				t.Errorf("mounts left after Destroy: %v", m)
			}
			if l := loopsBacking(root); len(l) > 0 {
				t.Errorf("loop devices left after Destroy: %v", l)
			}
		})
	}
}

// A retry that asks for no quota, or for another home, after a Provision
// cut short as above: the first home gets its files back, nothing is
// left mounted on it.
func TestDiskQuotaRetryWithAnotherSpec(t *testing.T) {
	quotaJail(t)
	for _, name := range []string{"no quota", "another home"} {
		t.Run(name, func(t *testing.T) {
			root := t.TempDir()
			j, err := jail.New(jail.Config{StateDir: root})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			base := t.TempDir()
			home := filepath.Join(base, "home")
			if err := os.MkdirAll(home, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
				t.Fatal(err)
			}
			spec := mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, HomeDir: home}
			if err := j.Provision(ctx, "qs", spec); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = j.Destroy(context.Background(), "qs") })
			if err := os.Remove(filepath.Join(root, "qs", "state.json")); err != nil {
				t.Fatal(err)
			}
			if name == "no quota" {
				spec.DiskBytes = 0
			} else {
				spec.HomeDir = filepath.Join(base, "other")
			}
			if err := j.Provision(ctx, "qs", spec); err != nil {
				t.Fatalf("the retried Provision: %v", err)
			}
			if m := mountsBelow(t, base); slices.Contains(m, home) {
				t.Errorf("the first home is still mounted: %v", m)
			}
			if b, err := os.ReadFile(filepath.Join(home, "notes")); err != nil || string(b) != "mine" {
				t.Fatalf("the caller's file after the retry: %q, %v", b, err)
			}
		})
	}
}

// A Provision that fails after it bounded the home (here its state
// cannot be written: state.json is a link to nowhere) gives the home
// back its files and leaves nothing mounted.
func TestDiskQuotaFailedProvisionGivesTheHomeBack(t *testing.T) {
	quotaJail(t)
	root := t.TempDir()
	j, err := jail.New(jail.Config{StateDir: root})
	if err != nil {
		t.Fatal(err)
	}
	base := t.TempDir()
	home := filepath.Join(base, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "qf"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(base, "nowhere", "state.json"), filepath.Join(root, "qf", "state.json")); err != nil {
		t.Fatal(err)
	}
	spec := mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, HomeDir: home}
	if err := j.Provision(context.Background(), "qf", spec); err == nil {
		t.Fatal("Provision with no state to write: nil")
	}
	t.Cleanup(func() { _ = j.Destroy(context.Background(), "qf") })
	if m := append(mountsBelow(t, root), mountsBelow(t, base)...); len(m) > 0 {
		t.Errorf("mounts left by the failed Provision: %v", m)
	}
	if b, err := os.ReadFile(filepath.Join(home, "notes")); err != nil || string(b) != "mine" {
		t.Fatalf("the caller's file after the failure: %q, %v", b, err)
	}
	if img, _ := filepath.Glob(filepath.Join(root, "qf", "*.img")); len(img) > 0 {
		t.Errorf("images left: %v", img)
	}
}

// Destroy leaves a home given in Spec.HomeDir in place, with what it
// held and what the workload wrote there, quota or not: the loop image's
// files are copied back under it before the image goes.
func TestDiskQuotaDestroyKeepsTheGivenHome(t *testing.T) {
	j, _ := quotaJail(t)
	base := t.TempDir()
	home := filepath.Join(base, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	started(t, j, "qd", mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, HomeDir: home})
	if c := run(t, j, "qd", "echo result > $HOME/out && cat $HOME/notes"); string(c.Stdout) != "mine" {
		t.Fatalf("in the sandbox: %q %q", c.Stdout, c.Stderr)
	}
	if err := j.Destroy(context.Background(), "qd"); err != nil {
		t.Fatal(err)
	}
	if m := mountsBelow(t, base); len(m) > 0 {
		t.Errorf("mounts left after Destroy: %v", m)
	}
	for name, want := range map[string]string{"notes": "mine", "out": "result\n"} {
		if b, err := os.ReadFile(filepath.Join(home, name)); err != nil || string(b) != want {
			t.Errorf("%s after Destroy: %q, %v; want %q", name, b, err, want)
		}
	}
}

// Destroy of a sandbox whose Provision was cut short after it bounded
// the home (no state: removed here) gives the home its files back and
// leaves nothing mounted.
func TestDiskQuotaDestroyAfterProvisionCutShort(t *testing.T) {
	quotaJail(t)
	root := t.TempDir()
	j, err := jail.New(jail.Config{StateDir: root})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := t.TempDir()
	home := filepath.Join(base, "home")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "notes"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := j.Provision(ctx, "qc", mechanism.Spec{Limits: mechanism.Limits{DiskBytes: 8 << 20}, HomeDir: home}); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "qc", "state.json")); err != nil {
		t.Fatal(err)
	}
	if err := j.Destroy(ctx, "qc"); err != nil {
		t.Fatal(err)
	}
	if m := append(mountsBelow(t, root), mountsBelow(t, base)...); len(m) > 0 {
		t.Errorf("mounts left after Destroy: %v", m)
	}
	if l := loopsBacking(root); len(l) > 0 {
		t.Errorf("loop devices left after Destroy: %v", l)
	}
	if b, err := os.ReadFile(filepath.Join(home, "notes")); err != nil || string(b) != "mine" {
		t.Fatalf("the caller's file after Destroy: %q, %v", b, err)
	}
}
