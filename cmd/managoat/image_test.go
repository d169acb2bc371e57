package main

import (
	"archive/tar"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
)

// The image commands and --image end to end, against a registry served
// by this test: pull, ls, run on the image (its Entrypoint and Cmd when
// no command is given), create on it, commit it and run on the committed
// image (its home kept), rm refused while a sandbox uses it, prune; an
// unknown image is not_found naming it.
func TestImageCommands(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "cli:v1", v1.Config{Entrypoint: []string{"/bin/sh", "-c"}, Cmd: []string{"cat /etc/marker; echo $FROM_IMAGE"}, Env: []string{"FROM_IMAGE=yes"}},
		append(imagetest.Conformance(t), imagetest.Layer{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/marker", Body: "from the image\n"}})...)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	mg := func(args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, nil, env, args...)
	}
	if out, e, code := mg("image", "pull", ref); code != 0 || !strings.HasPrefix(out, ref+" sha256:") {
		t.Fatalf("pull: %d %q %q", code, out, e)
	}
	if out, e, code := mg("image", "ls"); code != 0 || !strings.Contains(out, ref) {
		t.Fatalf("ls: %d %q %q", code, out, e)
	}
	if out, e, code := mg("run", "--image", ref); code != 0 || out != "from the image\nyes\n" {
		t.Fatalf("run with the image's command: %d %q %q", code, out, e)
	}
	if out, e, code := mg("run", "--image", ref, "--", "sh", "-c", "cat /etc/marker; test -e /etc/debian_version || echo NOT-THE-HOST"); code != 0 || out != "from the image\nNOT-THE-HOST\n" {
		t.Fatalf("run a command on the image: %d %q %q", code, out, e)
	}
	if _, e, code := mg("create", "--image", ref, "onimg"); code != 0 {
		t.Fatalf("create: %d %q", code, e)
	}
	if out, e, code := mg("exec", "onimg", "--", "cat", "/etc/marker"); code != 0 || out != "from the image\n" {
		t.Fatalf("exec: %d %q %q", code, out, e)
	}
	if _, e, code := mg("exec", "onimg", "--", "sh", "-c", "echo prepared > $HOME/state"); code != 0 {
		t.Fatalf("prepare: %d %q", code, e)
	}
	if out, e, code := mg("commit", "onimg", "local/prepared:v1"); code != 0 || !strings.Contains(out, "local/prepared:v1 sha256:") {
		t.Fatalf("commit: %d %q %q", code, out, e)
	}
	if out, e, code := mg("run", "--image", "local/prepared:v1", "--", "sh", "-c", "cat $HOME/state /etc/marker"); code != 0 || out != "prepared\nfrom the image\n" {
		t.Fatalf("run on the committed image: %d %q %q", code, out, e)
	}
	if _, e, code := mg("image", "rm", ref); code == 0 || !strings.Contains(e, "image_in_use") {
		t.Fatalf("rm of an image in use: %d %q", code, e)
	}
	if _, e, code := mg("rm", "onimg"); code != 0 {
		t.Fatalf("rm onimg: %d %q", code, e)
	}
	if _, e, code := mg("image", "rm", ref); code != 0 {
		t.Fatalf("image rm: %d %q", code, e)
	}
	if _, e, code := mg("image", "rm", "local/prepared:v1"); code != 0 {
		t.Fatalf("image rm of the committed image: %d %q", code, e)
	}
	if out, e, code := mg("image", "prune"); code != 0 || !strings.Contains(out, "removed 0 images") {
		t.Fatalf("prune: %d %q %q", code, out, e)
	}
	bad := reg.Host + "/nothere:v1"
	if _, e, code := mg("run", "--image", bad, "--", "true"); code != exitCouldNotRun || !strings.Contains(e, "not_found") || !strings.Contains(e, bad) {
		t.Fatalf("unknown image: %d %q", code, e)
	}
	if _, _, code := mg("image", "frob"); code != exitUsage {
		t.Fatalf("unknown image command: exit %d", code)
	}
}
