package jail_test

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
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/mechanismtest"
)

// pullTestImage serves an image of imagetest.Conformance's layers and
// extra layers, pulls it into a store under dir and
// returns it.
func pullTestImage(t testing.TB, dir string, cfg v1.Config, extra ...imagetest.Layer) *image.Image {
	t.Helper()
	reg := imagetest.Serve(t)
	layers := append(imagetest.Conformance(t), extra...)
	ref := reg.Push(t, "jailtest:v1", cfg, layers...)
	s, err := image.Open(filepath.Join(dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	img, err := s.Pull(context.Background(), ref, image.PullOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func imageSpec(t *testing.T, img *image.Image) mechanism.Spec {
	t.Helper()
	uid, gid, err := image.ResolveUser(img.Root, img.Config.User)
	if err != nil {
		t.Fatal(err)
	}
	return mechanism.Spec{Env: img.Config.Env, Image: &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest, UID: uid, GID: gid}}
}

// A sandbox on an image sees the image's root, runs as the image's user,
// gets the image's environment, and writes only its home and /tmp; two
// sandboxes share the image's directory, which neither changes.
func TestImageRoot(t *testing.T) {
	j := newJail(t)
	dir := t.TempDir()
	img := pullTestImage(t, dir, v1.Config{Env: []string{"FROM_IMAGE=yes"}, User: "app"},
		imagetest.Layer{{Name: "etc/marker", Body: "image-root\n"}})
	spec := imageSpec(t, img)
	started(t, j, "img-a", spec)
	started(t, j, "img-b", spec)
	c := run(t, j, "img-a", "cat /etc/marker; id -u; id -g; echo $FROM_IMAGE; hostname; grep -c img-a /etc/hosts; ls /usr/bin/bash; test -e /etc/debian_version || echo NOT-THE-HOST")
	want := "image-root\n1234\n1234\nyes\nimg-a\n1\n/usr/bin/bash\nNOT-THE-HOST\n"
	if string(c.Stdout) != want || c.ExitStatus != 0 {
		t.Fatalf("inside the image: %q (stderr %q, exit %d), want %q", c.Stdout, c.Stderr, c.ExitStatus, want)
	}
	c = run(t, j, "img-a", "for d in / /etc /usr/bin /bin; do (echo x > $d/probe) 2>/dev/null && echo WROTE:$d; done; echo a > $HOME/f && echo a > /tmp/f && echo OK")
	if strings.Contains(string(c.Stdout), "WROTE") || !strings.Contains(string(c.Stdout), "OK") {
		t.Fatalf("writes: %q %q", c.Stdout, c.Stderr)
	}
	c = run(t, j, "img-b", "cat $HOME/f /tmp/f 2>&1; hostname")
	if strings.Contains(string(c.Stdout), "a\n") || !strings.Contains(string(c.Stdout), "img-b") {
		t.Fatalf("img-b sees img-a's files or the wrong name: %q", c.Stdout)
	}
	// The image's directory is untouched: no hosts file written there.
	if b, err := os.ReadFile(filepath.Join(img.Root, "etc/hosts")); err == nil {
		t.Fatalf("the shared image root was written: etc/hosts = %q", b)
	}
	// Stop and start again: the same root, the same user.
	ctx := context.Background()
	if err := j.Stop(ctx, "img-a"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "img-a"); err != nil {
		t.Fatal(err)
	}
	if c := run(t, j, "img-a", "cat /etc/marker $HOME/f"); string(c.Stdout) != "image-root\na\n" {
		t.Fatalf("after a restart: %q %q", c.Stdout, c.Stderr)
	}
}

// An image whose mount points and /etc files are symlinks to host paths
// (absolute ones, which would resolve against the host while the root is
// built) gets real directories and files there; the host's are untouched.
func TestImageSymlinksAreNotFollowed(t *testing.T) {
	j := newJail(t)
	dir := t.TempDir()
	hostDir := filepath.Join(dir, "hostdir")
	os.Mkdir(hostDir, 0o755)
	hostFile := filepath.Join(hostDir, "hosts")
	os.WriteFile(hostFile, []byte("HOST"), 0o644)
	img := pullTestImage(t, dir, v1.Config{}, imagetest.Layer{
		{Name: "home", Type: tar.TypeSymlink, Linkname: hostDir},
		{Name: "etc/hosts", Type: tar.TypeSymlink, Linkname: hostFile},
		{Name: "etc/hostname", Type: tar.TypeSymlink, Linkname: "../../../../../../../.." + hostFile},
		{Name: "tmp", Type: tar.TypeSymlink, Linkname: hostDir},
		{Name: "dev", Type: tar.TypeSymlink, Linkname: "/dev"},
		{Name: "proc", Type: tar.TypeSymlink, Linkname: hostDir},
	})
	started(t, j, "img-links", imageSpec(t, img))
	c := run(t, j, "img-links", "cat /etc/hostname; echo hi > $HOME/x && echo hi > /tmp/y && echo WROTE; ls /proc/self/ns >/dev/null && echo PROC")
	if string(c.Stdout) != "img-links\nWROTE\nPROC\n" {
		t.Fatalf("inside: %q %q", c.Stdout, c.Stderr)
	}
	ents, _ := os.ReadDir(hostDir)
	if len(ents) != 1 {
		t.Fatalf("the host directory holds %v", ents)
	}
	if b, _ := os.ReadFile(hostFile); string(b) != "HOST" {
		t.Fatalf("the host file reads %q", b)
	}
}

// imageJail is a Jail whose every sandbox runs on one image: the breach
// conformance, run unmodified, then runs on the image's root.
type imageJail struct {
	*jail.Jail
	img *mechanism.ImageRoot
}

func (m imageJail) Provision(ctx context.Context, id string, spec mechanism.Spec) error {
	spec.Image = m.img
	return m.Jail.Provision(ctx, id, spec)
}

// TestConformanceOnImage runs the breach conformance on an image root
// (imagetest.Conformance) whose user is "app" (uid 1234): the suite's
// "nothing outside home and /tmp is writable" is a non-root workload's
// guarantee. An image whose user is root gets root of the sandbox's user
// namespace, which writes its own root (TestImageRootInUserns).
func TestConformanceOnImage(t *testing.T) {
	testenv.RequireRoot(t)
	dir := t.TempDir()
	img := pullTestImage(t, dir, v1.Config{User: "app"})
	root := &mechanism.ImageRoot{Dir: img.Root, Ref: img.Ref, Digest: img.Digest, UID: 1234, GID: 1234}
	mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
		return imageJail{newForSuite(t).(*jail.Jail), root}
	}, mechanismtest.Strict(testenv.InCI()))
}
