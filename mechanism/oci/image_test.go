package oci_test

import (
	"archive/tar"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/mechanismtest"
	"github.com/managoat/managoat/mechanism/oci"
)

func pullImage(t *testing.T, extra ...imagetest.Layer) *mechanism.ImageRoot {
	t.Helper()
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "ocitest:v1", v1.Config{Env: []string{"FROM_IMAGE=yes"}}, append(imagetest.Conformance(t), extra...)...)
	s, err := image.Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	img, err := s.Pull(context.Background(), ref, image.PullOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest}
}

// runc and runsc run a sandbox on an image's root: the image's files,
// not the host's; writes only in home and /tmp; the image's directory
// unchanged; Destroy unmounts and removes the sandbox's layer.
func TestImageRoot(t *testing.T) {
	for _, rt := range []string{"runc", "runsc"} {
		t.Run(rt, func(t *testing.T) { testImageRoot(t, rt) })
	}
}

func testImageRoot(t *testing.T, rt string) {
	requireRuntime(t, rt)
	root := pullImage(t, imagetest.Layer{
		{Name: "etc/marker", Body: "image-root\n"},
		{Name: "home", Type: tar.TypeSymlink, Linkname: "/etc"}, // replaced, never followed
	})
	dir := t.TempDir()
	m, err := oci.New(oci.Config{Runtime: rt, StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	spec := mechanism.Spec{Image: root, Env: []string{"FROM_IMAGE=yes"}}
	if err := m.Provision(ctx, "img", spec); err != nil {
		t.Fatal(err)
	}
	defer m.Destroy(ctx, "img")
	if err := m.Start(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	c, err := m.Execute(ctx, "img", []string{"sh", "-c", "cat /etc/marker; echo $FROM_IMAGE; test -e /etc/debian_version || echo NOT-THE-HOST; for d in / /etc /usr/bin; do (echo x > $d/probe) 2>/dev/null && echo WROTE:$d; done; echo a > $HOME/f && echo OK"}, mechanism.ExecOptions{})
	if err != nil || string(c.Stdout) != "image-root\nyes\nNOT-THE-HOST\nOK\n" {
		t.Fatalf("inside: %q %q %v", c.Stdout, c.Stderr, err)
	}
	if _, err := os.Lstat(filepath.Join(root.Dir, "home", "sprite")); err == nil {
		t.Fatal("the shared image root was written")
	}
	if err := m.Destroy(ctx, "img"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), dir) {
		t.Fatal("the sandbox's overlay is still mounted after Destroy")
	}
	if _, err := os.Stat(filepath.Join(root.Dir, "etc", "marker")); err != nil {
		t.Fatalf("the image root lost a file: %v", err)
	}
}

// imageMech runs every sandbox of the conformance on one image.
type imageMech struct {
	*oci.Mechanism
	img *mechanism.ImageRoot
}

func (m imageMech) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	spec.Image = m.img
	return m.Mechanism.Provision(ctx, id, spec)
}

// TestConformanceRuncOnImage runs the breach conformance on an image's
// root (imagetest.Conformance) with runc.
func TestConformanceRuncOnImage(t *testing.T) {
	requireRuntime(t, "runc")
	root := pullImage(t)
	f := factory("runc", nil)
	mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
		return imageMech{f(t).(*oci.Mechanism), root}
	}, mechanismtest.Strict(testenv.InCI()))
}
