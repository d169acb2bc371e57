package image_test

import (
	"archive/tar"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/managoat/managoat/image"
	"github.com/managoat/managoat/image/imagetest"
)

// Pull an image into a store and read its root and config. The registry
// here is one served in this process.
func ExampleStore_Ensure() {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	layer := imagetest.Layer{{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/motd", Body: "hello from the image\n"}}
	img, _ := mutate.AppendLayers(empty.Image, layer.V1())
	img, _ = mutate.Config(img, v1.Config{Env: []string{"GREETING=hi"}, Cmd: []string{"cat", "/etc/motd"}})
	ref := strings.TrimPrefix(srv.URL, "http://") + "/demo:v1"
	r, _ := name.ParseReference(ref)
	if err := remote.Write(r, img, remote.WithTransport(tr)); err != nil {
		fmt.Println(err)
		return
	}

	dir, _ := os.MkdirTemp("", "images")
	defer os.RemoveAll(dir)
	s, err := image.Open(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	got, err := s.Ensure(context.Background(), ref, image.PullOptions{Transport: tr})
	if err != nil {
		fmt.Println(err)
		return
	}
	motd, _ := os.ReadFile(filepath.Join(got.Root, "etc/motd"))
	fmt.Print(string(motd))
	fmt.Println(got.Config.Env, got.Config.Command(nil))
	// Output:
	// hello from the image
	// [GREETING=hi] [cat /etc/motd]
}
