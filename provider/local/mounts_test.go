package local

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/sandbox"
)

// Mounts reach the jail's sandbox, are kept in its record, and come back
// with it when the mechanism's sandbox is started again.
func TestMountsKeptAcrossRestart(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	src := t.TempDir()
	if err := os.Chmod(src, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "hello"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mounts := []sandbox.Mount{{Source: src, Target: "/data"}, {Source: src, Target: "/home/sprite/ro", ReadOnly: true}}
	h, err := p.Create(ctx, "mounts", sandbox.CreateOptions{Mounts: mounts})
	if err != nil {
		t.Fatal(err)
	}
	info, err := p.Get(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Mounts []sandbox.Mount `json:"mounts"`
	}
	if err := json.Unmarshal(info.Raw, &raw); err != nil || len(raw.Mounts) != 2 || raw.Mounts[1] != mounts[1] {
		t.Fatalf("Get's mounts: %s %v", info.Raw, err)
	}
	check := func(when string) {
		t.Helper()
		res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "cat /data/hello; echo " + when + " > /data/" + when + "; echo x > /home/sprite/ro/hello || echo refused"}}, sandbox.ExecOptions{})
		if err != nil || !strings.HasPrefix(string(res.Output), "from the host\n") || !strings.Contains(string(res.Output), "refused") {
			t.Fatalf("%s: %q %v", when, res.Output, err)
		}
		if b, err := os.ReadFile(filepath.Join(src, when)); err != nil || string(b) != when+"\n" {
			t.Fatalf("%s: the write did not reach the host: %q %v", when, b, err)
		}
	}
	check("first")
	// WriteFile and ReadFile reach the home through the host's directory,
	// where a mount's target is an empty mount point: refused, by name.
	// HostPath maps into the mount's source.
	var iv *sandbox.InvalidError
	if err := p.WriteFile(ctx, h, "/home/sprite/ro/x", []byte("x"), sandbox.WriteFileOptions{}); !errors.As(err, &iv) || !strings.Contains(err.Error(), "host mount "+src+":/home/sprite/ro:ro") {
		t.Errorf("WriteFile into a mount: %v", err)
	}
	if _, err := p.ReadFile(ctx, h, "ro/hello"); !errors.As(err, &iv) || !strings.Contains(err.Error(), "host mount") {
		t.Errorf("ReadFile in a mount: %v", err)
	}
	if got := p.HostPath(h, "/home/sprite/ro/hello"); got != filepath.Join(src, "hello") {
		t.Errorf("HostPath in a mount = %s", got)
	}
	r, _, _ := p.load(h.Name)
	if err := p.mech.Stop(ctx, r.InstanceID); err != nil {
		t.Fatal(err)
	}
	check("restarted")
}

func TestMountsRefused(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	p := newJail(t)
	for _, c := range []struct {
		m    sandbox.Mount
		want string
	}{
		{sandbox.Mount{Source: src, Target: "/proc"}, "/proc"},
		{sandbox.Mount{Source: src, Target: "/home/sprite"}, "/home/sprite"},
		{sandbox.Mount{Source: filepath.Join(src, "missing"), Target: "/data"}, "does not exist"},
		{sandbox.Mount{Source: "rel", Target: "/data"}, "absolute"},
	} {
		_, err := p.Create(ctx, "refused", sandbox.CreateOptions{Mounts: []sandbox.Mount{c.m}})
		var iv *sandbox.InvalidError
		if !errors.As(err, &iv) || iv.Reason != "mounts" || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want Invalid{mounts} naming %q", c.m, err, c.want)
		}
	}
	// A mechanism that cannot bind (trusted) refuses rather than drops.
	tr := newTrusted(t)
	_, err := tr.Create(ctx, "trusted", sandbox.CreateOptions{Mounts: []sandbox.Mount{{Source: src, Target: "/data"}}})
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) || iv.Reason != "capability_unavailable" || !strings.Contains(err.Error(), "host_mounts") {
		t.Fatalf("trusted with a mount: %v, want capability_unavailable naming host_mounts", err)
	}
	if names, _ := tr.ListAllNames(ctx); len(names) != 0 {
		t.Fatalf("left after a refused create: %v", names)
	}
}
