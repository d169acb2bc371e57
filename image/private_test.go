package image_test

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/internal/testenv"
)

// runAsNobody runs path as uid and gid 65534 with the test binary's
// print-euid switch, and returns its output.
func runAsNobody(path string) (string, error) {
	c := exec.Command(path)
	c.Env = []string{envPrintEUID + "=1"}
	c.Dir = "/"
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := c.Output()
	return strings.TrimSpace(string(out)), err
}

// The attack of issue 30: an image holds a setuid root copy of a program
// that prints its effective uid; it is pulled as the first command on a
// fresh state directory, and another host user (nobody) runs it from the
// unpacked root. The store refuses the walk (EACCES): the state
// directory, the store and its roots are 0700, whatever made them. The
// file itself keeps its owner and set-id bit (a sandbox needs them, and
// runs it on a nosuid mount). A store an older managoat left 0755 is
// made private again when opened.
func TestSetuidRootOfAnImageIsNotRunnableByAnotherUser(t *testing.T) {
	testenv.RequireRoot(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	prog, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "setuid:v1", v1.Config{}, imagetest.Layer{
		{Name: "usr/", Type: tar.TypeDir}, {Name: "usr/bin/", Type: tar.TypeDir},
		{Name: "usr/bin/whoami-euid", Mode: 0o4755, Uid: 0, Gid: 0, Body: string(prog)},
	})
	top := t.TempDir()
	if err := testenv.Traversable(top); err != nil {
		t.Fatal(err)
	}
	// The control: nobody runs a plain copy of the program from a
	// traversable directory, so a refusal below is the store's doing.
	ctl := filepath.Join(top, "control")
	if err := os.WriteFile(ctl, prog, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := runAsNobody(ctl); err != nil || out != "65534" {
		t.Fatalf("control: nobody runs a copy: %q %v", out, err)
	}
	state := filepath.Join(top, "state") // made by the image store: the first command
	s, err := image.Open(filepath.Join(state, "images"))
	if err != nil {
		t.Fatal(err)
	}
	_, opts := newStore(t)
	img, err := s.Pull(context.Background(), ref, opts)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(img.Root, "usr/bin/whoami-euid")
	var st syscall.Stat_t
	if err := syscall.Stat(file, &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != 0 || st.Mode&syscall.S_ISUID == 0 {
		t.Fatalf("the image's file is %d, mode %#o: the test needs it setuid root", st.Uid, st.Mode)
	}
	out, err := runAsNobody(file)
	if err == nil {
		t.Fatalf("nobody ran the image's setuid root program: euid %s", out)
	}
	if !errors.Is(err, syscall.EACCES) {
		t.Fatalf("nobody running the image's program: %v (%q), want EACCES", err, out)
	}
	for _, d := range []string{state, s.Dir(), filepath.Join(s.Dir(), "roots"), filepath.Dir(img.Root)} {
		checkMode(t, d, 0o700)
	}
	for _, sub := range []string{"blobs", "blobs/sha256", "refs", "uses", "tmp", "locks"} {
		checkMode(t, filepath.Join(s.Dir(), sub), 0o700)
	}

	// A store an older managoat left open is made private when opened.
	for _, d := range []string{state, s.Dir(), filepath.Join(s.Dir(), "roots"), filepath.Dir(img.Root)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := runAsNobody(file); err != nil || out != "0" {
		t.Fatalf("with the store open, nobody did not get euid 0 from it: %q %v (the reopen below would prove nothing)", out, err)
	}
	if _, err := image.Open(s.Dir()); err != nil {
		t.Fatal(err)
	}
	if out, err := runAsNobody(file); !errors.Is(err, syscall.EACCES) {
		t.Fatalf("after reopening an open store, nobody ran its program: %q %v", out, err)
	}
	checkMode(t, s.Dir(), 0o700)
	checkMode(t, filepath.Join(s.Dir(), "roots"), 0o700)
}

func checkMode(t *testing.T, p string, want os.FileMode) {
	t.Helper()
	st, err := os.Lstat(p)
	if err != nil {
		t.Error(err)
		return
	}
	if got := st.Mode().Perm(); got != want {
		t.Errorf("%s is mode %#o, want %#o", p, got, want)
	}
}
