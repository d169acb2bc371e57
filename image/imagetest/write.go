package imagetest

import (
	"io"
	"log"
	"net/http"
	"runtime"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

var goarch = runtime.GOARCH

func nullLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// write pushes img over a transport of its own, closed after.
func write(ref name.Reference, img v1.Image) error {
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	return remote.Write(ref, img, remote.WithTransport(tr))
}
