// Package imagetest serves OCI images from a registry inside the test
// process (go-containerregistry's pkg/registry on a loopback listener),
// built by the tests themselves from tar entries written in Go, so no
// test of an image pulls anything from outside the machine.
//
//	reg := imagetest.Serve(t)
//	ref := reg.Push(t, "demo:v1", v1.Config{Cmd: []string{"sh"}}, imagetest.Busybox(t))
package imagetest

import (
	"archive/tar"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/managoat/managoat/internal/testenv"
)

// Entry is one tar entry of a layer.
type Entry struct {
	Name     string
	Type     byte // tar.TypeReg when zero
	Mode     int64
	Body     string
	Linkname string
	Uid, Gid int
	Major    int64
}

// Layer is a layer's entries, in order.
type Layer []Entry

// Tar writes the layer's entries as an uncompressed tar stream, as
// written: names with "..", absolute links and devices included.
func (l Layer) Tar() []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range l {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Linkname, Uid: e.Uid, Gid: e.Gid,
			Devmajor: e.Major, ModTime: time.Unix(1700000000, 0), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(h); err != nil {
			panic(err)
		}
		if h.Typeflag == tar.TypeReg {
			io.WriteString(tw, e.Body)
		}
	}
	tw.Close()
	return b.Bytes()
}

// V1 is the layer as a go-containerregistry layer (gzip).
func (l Layer) V1() v1.Layer {
	b := l.Tar()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		panic(err)
	}
	return layer
}

// Busybox is a layer with Debian's static busybox at /bin/busybox and a
// link per applet a test needs, plus /etc/passwd and /etc/group with root
// and an "app" user (uid 1234). The test skips without busybox-static
// (fails under CI=true).
func Busybox(t testing.TB) Layer {
	t.Helper()
	b, err := os.ReadFile("/bin/busybox")
	testenv.Require(t, err == nil, "needs /bin/busybox (Debian package busybox-static)")
	l := Layer{
		{Name: "bin/", Type: tar.TypeDir}, {Name: "etc/", Type: tar.TypeDir}, {Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777},
		{Name: "bin/busybox", Mode: 0o755, Body: string(b)},
		{Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\n"},
		{Name: "etc/group", Body: "root:x:0:\napp:x:1234:\n"},
	}
	for _, a := range []string{"sh", "echo", "cat", "id", "ls", "pwd", "env", "touch", "mkdir", "rm", "sleep", "true", "false", "test", "stat", "readlink", "mount", "kill", "ps", "wc", "head", "dd", "chmod", "hostname", "ip", "grep", "sed", "printf",
		"tr", "setsid", "timeout", "tail", "sort", "cut", "xargs", "find", "awk", "basename", "dirname", "whoami", "cp", "mv", "ln", "tee", "seq", "expr", "uname", "which", "du", "df"} {
		l = append(l, Entry{Name: "bin/" + a, Type: tar.TypeLink, Linkname: "bin/busybox"})
	}
	return l
}

// Registry is a registry served in the test process.
type Registry struct {
	Server *httptest.Server
	// Host is host:port, to prefix repositories with.
	Host string

	mu      sync.Mutex
	blobGET map[string]int
	// Tamper, when set, may rewrite a response body of a blob GET
	// (digest, body) -> body.
	Tamper func(digest string, body []byte) []byte
	// Status, when set, answers every request with it instead.
	Status int
	// Cut, when set, aborts each blob GET after this many bytes.
	Cut int
	// BasicAuth, when set ("user:password"), is the only credential the
	// registry takes: any request without it is 401 with a Basic
	// challenge, as a private registry answers.
	BasicAuth string
}

// Serve starts a registry for the test (closed at its end).
func Serve(t testing.TB) *Registry {
	r := &Registry{blobGET: map[string]int{}}
	inner := registry.New(registry.Logger(nullLogger()))
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		status, tamper, cut, auth := r.Status, r.Tamper, r.Cut, r.BasicAuth
		r.mu.Unlock()
		if auth != "" {
			u, p, ok := req.BasicAuth()
			if !ok || u+":"+p != auth {
				status = http.StatusUnauthorized
			}
		}
		if status != 0 {
			if status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Basic realm="imagetest"`)
			}
			w.WriteHeader(status)
			io.WriteString(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
		i := strings.Index(req.URL.Path, "/blobs/sha256:")
		if req.Method == http.MethodGet && i >= 0 {
			digest := req.URL.Path[i+len("/blobs/"):]
			r.mu.Lock()
			r.blobGET[digest]++
			r.mu.Unlock()
			if tamper != nil || cut > 0 {
				rec := httptest.NewRecorder()
				inner.ServeHTTP(rec, req)
				body := rec.Body.Bytes()
				if tamper != nil {
					body = tamper(digest, body)
				}
				for k, v := range rec.Header() {
					w.Header()[k] = v
				}
				w.Header().Del("Content-Length")
				if cut > 0 && cut < len(body) {
					w.WriteHeader(rec.Code)
					w.Write(body[:cut])
					panic(http.ErrAbortHandler) // the connection drops mid-blob
				}
				w.WriteHeader(rec.Code)
				w.Write(body)
				return
			}
		}
		inner.ServeHTTP(w, req)
	}))
	r.Server.Config.ErrorLog = nullLogger()
	t.Cleanup(r.Server.Close)
	r.Host = strings.TrimPrefix(r.Server.URL, "http://")
	return r
}

// BlobGETs is how many times the blob was asked for.
func (r *Registry) BlobGETs(digest string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.blobGET[digest]
}

// Set changes the registry's behaviour under its lock.
func (r *Registry) Set(f func(r *Registry)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r)
}

// Image builds an image of the layers (first is lowest) with cfg.
func Image(t testing.TB, cfg v1.Config, layers ...Layer) v1.Image {
	t.Helper()
	img := empty.Image
	for _, l := range layers {
		var err error
		if img, err = mutate.AppendLayers(img, l.V1()); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

// Push builds an image of the layers and pushes it as repo:tag ("demo:v1");
// it returns the full reference.
func (r *Registry) Push(t testing.TB, repoTag string, cfg v1.Config, layers ...Layer) string {
	t.Helper()
	return r.PushImage(t, repoTag, Image(t, cfg, layers...))
}

// PushImage pushes img as repo:tag and returns the full reference.
func (r *Registry) PushImage(t testing.TB, repoTag string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(r.Host + "/" + repoTag)
	if err != nil {
		t.Fatal(err)
	}
	if err := write(ref, img); err != nil {
		t.Fatal(err)
	}
	return ref.Name()
}
