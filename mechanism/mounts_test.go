package mechanism_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism"
)

func TestMountsValidate(t *testing.T) {
	src := t.TempDir()
	ok := []mechanism.Mount{
		{Source: src, Target: "/data"},
		{Source: src, Target: mechanism.Home + "/src", ReadOnly: true},
		{Source: src, Target: "/tmp/x"},
		{Source: src, Target: "/etc/ssl/certs", ReadOnly: true},
	}
	if err := (mechanism.Spec{Mounts: ok}).Validate(); err != nil {
		t.Fatalf("valid mounts refused: %v", err)
	}
	many := make([]mechanism.Mount, mechanism.MaxMounts+1)
	for i := range many {
		many[i] = mechanism.Mount{Source: src, Target: "/m" + strings.Repeat("x", i+1)}
	}
	for _, c := range []struct {
		name string
		ms   []mechanism.Mount
		want string
	}{
		{"relative source", []mechanism.Mount{{Source: "rel", Target: "/data"}}, "not an absolute path"},
		{"unclean source", []mechanism.Mount{{Source: src + "/../x", Target: "/data"}}, "not clean"},
		{"relative target", []mechanism.Mount{{Source: src, Target: "data"}}, "not an absolute path"},
		{"unclean target", []mechanism.Mount{{Source: src, Target: "/data/../proc"}}, "not clean"},
		{"root", []mechanism.Mount{{Source: src, Target: "/"}}, "root"},
		{"proc", []mechanism.Mount{{Source: src, Target: "/proc"}}, "/proc"},
		{"beneath proc", []mechanism.Mount{{Source: src, Target: "/proc/sys"}}, "/proc"},
		{"dev", []mechanism.Mount{{Source: src, Target: "/dev/shm"}}, "/dev"},
		{"sys", []mechanism.Mount{{Source: src, Target: "/sys"}}, "/sys"},
		{"home", []mechanism.Mount{{Source: src, Target: mechanism.Home}}, mechanism.Home},
		{"home's parent", []mechanism.Mount{{Source: src, Target: "/home"}}, mechanism.Home},
		{"tmp", []mechanism.Mount{{Source: src, Target: "/tmp"}}, "/tmp"},
		{"etc", []mechanism.Mount{{Source: src, Target: "/etc"}}, "/etc"},
		{"twice", []mechanism.Mount{{Source: src, Target: "/a"}, {Source: src, Target: "/a"}}, "twice"},
		{"nested", []mechanism.Mount{{Source: src, Target: "/a"}, {Source: src, Target: "/a/b"}}, "nested"},
		{"too many", many, "at most"},
	} {
		err := (mechanism.Spec{Mounts: c.ms}).Validate()
		var inv *mechanism.InvalidError
		if !errors.As(err, &inv) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want Invalid mentioning %q", c.name, err, c.want)
		}
	}
}

func TestResolveMounts(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(real, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "f")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := mechanism.ResolveMounts([]mechanism.Mount{{Source: filepath.Join(dir, "link"), Target: "/a", ReadOnly: true}, {Source: file, Target: "/b"}})
	if err != nil {
		t.Fatal(err)
	}
	wantReal, _ := filepath.EvalSymlinks(real)
	if got[0].Source != wantReal || !got[0].ReadOnly || got[0].Target != "/a" || got[1].Source != mustEval(t, file) {
		t.Fatalf("resolved %+v, want the link followed to %s", got, wantReal)
	}
	if _, err := mechanism.ResolveMounts([]mechanism.Mount{{Source: filepath.Join(dir, "missing"), Target: "/a"}}); !errors.Is(err, mechanism.ErrInvalid) || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("missing source: %v", err)
	}
	if _, err := mechanism.ResolveMounts([]mechanism.Mount{{Source: "/dev/null", Target: "/a"}}); !errors.Is(err, mechanism.ErrInvalid) || !strings.Contains(err.Error(), "neither") {
		t.Errorf("device source: %v", err)
	}
}

func mustEval(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A mechanism that does not guarantee HostMounts is refused a Spec with
// mounts: Unavailable, naming the capability, never a silent drop.
func TestGateRefusesMountsUnlessGuaranteed(t *testing.T) {
	spec := mechanism.Spec{Mounts: []mechanism.Mount{{Source: "/", Target: "/data"}}}
	p := &fakeProber{}
	err := mechanism.Gate(context.Background(), declared{}, spec, p)
	var u *mechanism.UnavailableError
	if !errors.As(err, &u) || len(u.Missing) != 1 || u.Missing[0].Name != mechanism.HostMounts || !strings.Contains(u.Missing[0].Detail, "cannot bind host paths") {
		t.Fatalf("err = %v, want host_mounts missing", err)
	}
	m := declared{con: []mechanism.Capability{mechanism.HostMounts}, gua: []mechanism.Capability{mechanism.HostMounts}}
	if err := mechanism.Gate(context.Background(), m, spec, p); err != nil {
		t.Fatalf("a mechanism constructing host_mounts refused: %v", err)
	}
}
