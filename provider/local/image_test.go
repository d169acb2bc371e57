package local

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/managoat/managoat/image/imagetest"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/sandbox"
)

// A local sandbox on an image: Create pulls it (once), the commands run
// on its root with its Env, WorkingDir and User; Destroy releases the
// image, which image rm may then remove.
func TestCreateOnImage(t *testing.T) {
	p := newJail(t)
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "local:v1", v1.Config{Env: []string{"FROM_IMAGE=yes", "LANG=C"}, WorkingDir: "/work", User: "app"},
		append(imagetest.Conformance(t), imagetest.Layer{{Name: "work/", Type: tar.TypeDir, Mode: 0o777}, {Name: "etc/marker", Body: "image\n"}})...)
	ctx := context.Background()
	h, err := p.Create(ctx, "onimg", sandbox.CreateOptions{Image: ref, Env: []string{"LANG=C.UTF-8"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Destroy(ctx, h)
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "cat /etc/marker; echo $FROM_IMAGE $LANG; pwd; id -u"}}, sandbox.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := string(res.Output); got != "image\nyes C.UTF-8\n/work\n1234\n" {
		t.Fatalf("inside: %q (exit %d)", got, res.ExitCode)
	}
	s, err := p.Images()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, ref); sandbox.Kind(err) != "invalid" {
		t.Fatalf("image rm of an image in use: %v", err)
	}
	if err := p.Destroy(ctx, h); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, ref); err != nil {
		t.Fatalf("image rm after destroy: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(s.Dir(), "roots"))
	if len(ents) != 0 {
		t.Fatalf("roots left: %v", ents)
	}
}

// An unknown image is not_found naming it and leaves nothing; a mechanism
// without a root of its own refuses images.
func TestCreateOnBadImage(t *testing.T) {
	p := newJail(t)
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	reg := imagetest.Serve(t)
	ref := reg.Host + "/nothere:v1"
	_, err := p.Create(context.Background(), "bad", sandbox.CreateOptions{Image: ref})
	if !errors.Is(err, sandbox.ErrNotFound) || !strings.Contains(err.Error(), ref) {
		t.Fatalf("unknown image: %v", err)
	}
	if names, _ := p.ListAllNames(context.Background()); len(names) != 0 {
		t.Fatalf("left %v", names)
	}
	tp := newTrusted(t)
	if _, err := tp.Create(context.Background(), "tr", sandbox.CreateOptions{Image: ref}); sandbox.Kind(err) != "invalid" || !strings.Contains(err.Error(), "trusted") {
		t.Fatalf("trusted with an image: %v", err)
	}
}

// Commit saves a sandbox's home over its image; a sandbox made from the
// committed image starts with that home, and one made without an image
// cannot be committed.
func TestCommitStartsTheNextSandbox(t *testing.T) {
	p := newJail(t)
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	reg := imagetest.Serve(t)
	ref := reg.Push(t, "base:v1", v1.Config{Env: []string{"FROM_IMAGE=yes"}}, imagetest.Conformance(t)...)
	ctx := context.Background()
	h, err := p.Create(ctx, "prep", sandbox.CreateOptions{Image: ref})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "mkdir -p $HOME/.local/bin && printf '#!/bin/sh\\necho prepared tool\\n' > $HOME/.local/bin/tool && chmod +x $HOME/.local/bin/tool"}}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
		t.Fatalf("prepare: %v %q", err, res.Output)
	}
	img, err := p.Commit(ctx, h, "local/prepared:v1")
	if err != nil {
		t.Fatal(err)
	}
	if img.Ref != "index.docker.io/local/prepared:v1" || len(img.Layers) != len(imagetest.Conformance(t))+1 {
		t.Fatalf("committed %+v", img)
	}
	// The image holds the ids the sandbox saw, not the host range the
	// jail mapped it to.
	saw, err := p.Exec(ctx, h, sandbox.Cmd{Name: "stat", Args: []string{"-c", "%u", mechanism.Home + "/.local/bin/tool"}}, sandbox.ExecOptions{})
	if err != nil || saw.ExitCode != 0 {
		t.Fatalf("stat in the sandbox: %v %q", err, saw.Output)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(filepath.Join(img.Root, "home/sprite/.local/bin/tool"), &st); err != nil || fmt.Sprint(st.Uid) != strings.TrimSpace(string(saw.Output)) {
		t.Fatalf("the committed tool: uid %d, %v; the sandbox saw %q", st.Uid, err, saw.Output)
	}
	h2, err := p.Create(ctx, "next", sandbox.CreateOptions{Image: "local/prepared:v1"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(ctx, h2, sandbox.Cmd{Name: "sh", Args: []string{"-c", "tool; echo $FROM_IMAGE"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "prepared tool\nyes\n" {
		t.Fatalf("the next sandbox: %v %q", err, res.Output)
	}
	plain, err := p.Create(ctx, "plain", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Commit(ctx, plain, "local/x:v1"); sandbox.Kind(err) != "invalid" {
		t.Fatalf("commit of a sandbox without an image: %v", err)
	}
}
