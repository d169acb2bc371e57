package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

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

// image pull as the first command on a host (issue 30): the state
// directory it makes, the store, its roots and each root's directory are
// 0700, so no other host user reaches a setuid file of the image.
func TestImagePullFirstKeepsTheStatePrivate(t *testing.T) {
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "first:v1", v1.Config{}, imagetest.Layer{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/su", Mode: 0o4755, Body: "x"}})
	home := filepath.Join(t.TempDir(), "state")
	if out, e, code := runBinary(t, nil, []string{"MANAGOAT_HOME=" + home}, "image", "pull", ref); code != 0 {
		t.Fatalf("pull: %d %q %q", code, out, e)
	}
	roots, err := filepath.Glob(filepath.Join(home, "images", "roots", "*"))
	if err != nil || len(roots) != 1 {
		t.Fatalf("roots: %v %v", roots, err)
	}
	for _, d := range []string{home, filepath.Join(home, "images"), filepath.Join(home, "images", "roots"), roots[0]} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s is mode %#o, want 0700", d, st.Mode().Perm())
		}
	}
}

// image pull's bounds (issue 30): a compression bomb (64 MiB of zeros in
// a layer of a few tens of KiB) is refused under --max-bytes 16M, and a
// layer of 300 entries under --max-entries 100, each with an error naming
// the flag that raises it and nothing of the image left in the store;
// raised, both pull.
func TestImagePullBounds(t *testing.T) {
	reg := imagetest.Serve(t)
	bomb := reg.Push(t, "bomb:v1", v1.Config{}, imagetest.Layer{{Name: "zeros", Body: strings.Repeat("\x00", 64<<20)}})
	var l imagetest.Layer
	for i := range 300 {
		l = append(l, imagetest.Entry{Name: "f" + strconv.Itoa(i)})
	}
	many := reg.Push(t, "many:v1", v1.Config{}, l)
	var home string
	mg := func(args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, nil, []string{"MANAGOAT_HOME=" + home}, args...)
	}
	empty := func() {
		t.Helper()
		for _, sub := range []string{"roots", "refs", "tmp"} {
			if ents, _ := os.ReadDir(filepath.Join(home, "images", sub)); len(ents) != 0 {
				t.Errorf("images/%s holds %d entries after a refusal", sub, len(ents))
			}
		}
	}
	for _, c := range []struct{ ref, flag, low, high string }{
		{bomb, "--max-bytes", "16M", "128M"},
		{many, "--max-entries", "100", "1000"},
	} {
		home = t.TempDir()
		_, e, code := mg("image", "pull", c.flag, c.low, c.ref)
		if code != exitCouldNotRun || !strings.Contains(e, "image_too_large") || !strings.Contains(e, c.flag+" of image pull") {
			t.Errorf("pull %s %s %s: %d %q", c.flag, c.low, c.ref, code, e)
		}
		t.Logf("refused: %s", e)
		empty()
		if out, e, code := mg("image", "pull", c.flag, c.high, c.ref); code != 0 || !strings.HasPrefix(out, c.ref+" sha256:") {
			t.Errorf("pull %s %s %s: %d %q %q", c.flag, c.high, c.ref, code, out, e)
		}
	}
	for _, bad := range [][]string{{"--max-bytes", "lots"}, {"--max-entries", "-3"}} {
		if _, _, code := mg(append([]string{"image", "pull"}, append(bad, many)...)...); code != exitUsage {
			t.Errorf("pull %v: exit %d, want a usage error", bad, code)
		}
	}
}

// Images offline (issue 33): an image pulled on one host is saved (an OCI
// layout tar to a file, a docker save tarball to stdout), the registry
// goes away, and on a fresh state directory each archive loads (from a
// file, from stdin) and runs a sandbox; a sandbox on the loaded image is
// committed, and the commit saved and loaded on a third state directory
// runs with its home.
func TestImageSaveLoadRunsOffline(t *testing.T) {
	testenv.RequireRoot(t)
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "offline:v1", v1.Config{Cmd: []string{"cat", "/etc/marker"}},
		append(imagetest.Conformance(t), imagetest.Layer{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/marker", Body: "from the image\n"}})...)
	dir := t.TempDir()
	in := func(home string) func(stdin io.Reader, args ...string) (string, string, int) {
		return func(stdin io.Reader, args ...string) (string, string, int) {
			t.Helper()
			return runBinary(t, stdin, []string{"MANAGOAT_HOME=" + home}, args...)
		}
	}
	one, two, three := in(filepath.Join(dir, "one")), in(filepath.Join(dir, "two")), in(filepath.Join(dir, "three"))
	if _, e, code := one(nil, "image", "pull", ref); code != 0 {
		t.Fatalf("pull: %d %q", code, e)
	}
	ociTar := filepath.Join(dir, "offline.tar")
	if _, e, code := one(nil, "image", "save", "-o", ociTar, ref); code != 0 {
		t.Fatalf("save -o: %d %q", code, e)
	}
	docker, e, code := one(nil, "image", "save", "--format", "docker", ref)
	if code != 0 || len(docker) < 1024 {
		t.Fatalf("save --format docker to stdout: %d, %d bytes, %q", code, len(docker), e)
	}
	reg.Server.Close() // offline from here on

	if out, e, code := two(nil, "image", "load", "-i", ociTar); code != 0 || !strings.HasPrefix(out, ref+" sha256:") {
		t.Fatalf("load -i: %d %q %q", code, out, e)
	}
	if out, e, code := two(nil, "run", "--image", ref); code != 0 || out != "from the image\n" {
		t.Fatalf("run on the loaded image: %d %q %q", code, out, e)
	}
	if _, e, code := two(nil, "create", "--image", ref, "box"); code != 0 {
		t.Fatalf("create: %d %q", code, e)
	}
	if _, e, code := two(nil, "exec", "box", "--", "sh", "-c", "echo prepared > $HOME/state"); code != 0 {
		t.Fatalf("prepare: %d %q", code, e)
	}
	if _, e, code := two(nil, "commit", "box", "local/prepared:v1"); code != 0 {
		t.Fatalf("commit on the loaded image: %d %q", code, e)
	}
	committed, e, code := two(nil, "image", "save", "local/prepared:v1")
	if code != 0 {
		t.Fatalf("save the commit: %d %q", code, e)
	}
	if _, e, code := two(nil, "rm", "box"); code != 0 {
		t.Fatalf("rm: %d %q", code, e)
	}

	if out, e, code := three(strings.NewReader(docker), "image", "load"); code != 0 || !strings.HasPrefix(out, ref+" sha256:") {
		t.Fatalf("load a docker save from stdin: %d %q %q", code, out, e)
	}
	if out, e, code := three(nil, "run", "--image", ref); code != 0 || out != "from the image\n" {
		t.Fatalf("run on the image loaded from a docker save: %d %q %q", code, out, e)
	}
	if out, e, code := three(strings.NewReader(committed), "image", "load"); code != 0 || !strings.HasPrefix(out, "index.docker.io/local/prepared:v1 sha256:") {
		t.Fatalf("load the commit: %d %q %q", code, out, e)
	}
	if out, e, code := three(nil, "run", "--image", "local/prepared:v1", "--", "sh", "-c", "cat $HOME/state /etc/marker"); code != 0 || out != "prepared\nfrom the image\n" {
		t.Fatalf("run on the loaded commit: %d %q %q", code, out, e)
	}
}

// image load of a docker save tarball made in the test (from stdin and
// from a file, named by its RepoTags or by --tag), its bounds (a layer of
// 300 entries under --max-entries 100), what it refuses (not an archive,
// an archive naming no image), save's refusals, and a plain-HTTP
// registry on loopback named localhost:PORT.
func TestImageLoadAndLocalhostRegistry(t *testing.T) {
	img := imagetest.Image(t, v1.Config{Cmd: []string{"sh"}}, imagetest.Layer{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/marker", Body: "loaded\n"}})
	var tagged, untagged bytes.Buffer
	if err := tarball.Write(name.MustParseReference("example.test/app:v1"), img, &tagged); err != nil {
		t.Fatal(err)
	}
	if err := tarball.Write(name.MustParseReference("example.test/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"), img, &untagged); err != nil {
		t.Fatal(err)
	}
	home := t.TempDir()
	mg := func(stdin io.Reader, args ...string) (string, string, int) {
		t.Helper()
		return runBinary(t, stdin, []string{"MANAGOAT_HOME=" + home}, args...)
	}
	if out, e, code := mg(bytes.NewReader(tagged.Bytes()), "image", "load"); code != 0 || !strings.HasPrefix(out, "example.test/app:v1 sha256:") {
		t.Fatalf("load: %d %q %q", code, out, e)
	}
	if out, e, code := mg(nil, "image", "ls"); code != 0 || !strings.Contains(out, "example.test/app:v1") {
		t.Fatalf("ls: %d %q %q", code, out, e)
	}
	if _, e, code := mg(bytes.NewReader(untagged.Bytes()), "image", "load"); code != exitCouldNotRun || !strings.Contains(e, "--tag") {
		t.Fatalf("load of an archive naming no image: %d %q", code, e)
	}
	p := filepath.Join(t.TempDir(), "untagged.tar")
	os.WriteFile(p, untagged.Bytes(), 0o600)
	if out, e, code := mg(nil, "image", "load", "-i", p, "--tag", "example.test/named:v1"); code != 0 || !strings.HasPrefix(out, "example.test/named:v1 sha256:") {
		t.Fatalf("load -i --tag: %d %q %q", code, out, e)
	}
	if _, e, code := mg(strings.NewReader("not an archive"), "image", "load"); code != exitCouldNotRun || !strings.Contains(e, "image_archive") {
		t.Fatalf("load of garbage: %d %q", code, e)
	}
	var l imagetest.Layer
	for i := range 300 {
		l = append(l, imagetest.Entry{Name: "f" + strconv.Itoa(i)})
	}
	var many bytes.Buffer
	tarball.Write(name.MustParseReference("example.test/many:v1"), imagetest.Image(t, v1.Config{}, l), &many)
	if _, e, code := mg(bytes.NewReader(many.Bytes()), "image", "load", "--max-entries", "100"); code != exitCouldNotRun || !strings.Contains(e, "--max-entries of image pull and image load") {
		t.Fatalf("load past --max-entries: %d %q", code, e)
	}
	if out, _, _ := mg(nil, "image", "ls"); strings.Contains(out, "many") {
		t.Fatalf("a refused load is listed: %q", out)
	}
	out := filepath.Join(t.TempDir(), "app.tar")
	if _, e, code := mg(nil, "image", "save", "example.test/app:v1", "-o", out); code != 0 {
		t.Fatalf("save REF -o: %d %q", code, e)
	}
	if st, err := os.Stat(out); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("the saved archive: %v %v", st, err)
	}
	if _, e, code := mg(nil, "image", "save", "-o", filepath.Join(t.TempDir(), "x.tar"), "example.test/nothere:v1"); code == 0 || !strings.Contains(e, "not_found") {
		t.Fatalf("save of an unknown image: %d %q", code, e)
	}
	if _, _, code := mg(nil, "image", "save", "--format", "zip", "example.test/app:v1"); code != exitUsage {
		t.Fatalf("save --format zip: exit %d", code)
	}

	reg := imagetest.Serve(t)
	_, port, _ := strings.Cut(reg.Host, ":")
	reg.Push(t, "lh:v1", v1.Config{}, imagetest.Layer{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/lh", Body: "x"}})
	lh := "localhost:" + port + "/lh:v1"
	if out, e, code := mg(nil, "image", "pull", lh); code != 0 || !strings.HasPrefix(out, lh+" sha256:") {
		t.Fatalf("pull from a plain-HTTP registry on localhost: %d %q %q", code, out, e)
	}
}
