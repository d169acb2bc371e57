// Package daytonadoor is the platform's Daytona front door: Daytona's
// control plane (REST under /sandbox) and its toolbox (the in-sandbox REST
// API the SDK reaches through the record's toolboxProxyUrl, here
// <door>/toolbox/<id>/...) over the platform's records, accounts, policy
// and providers, so that a program written for @daytonaio/sdk@0.218.0
// runs unchanged against `managoat serve` with DAYTONA_API_URL set to the
// door and DAYTONA_API_KEY a managoat API key.
//
// Every call goes through the platform's own /v1 handler, in process: the
// door holds a platform client (package platform/client) per request,
// whose transport is an in-memory pipe to the API handler, so
// authentication, rate limits, quotas, policy and the idle lifecycle are
// those of /v1. A sandbox made through the door is a row of `managoat ls`
// and a sandbox made through /v1 is listed by the door. A sandbox's
// Daytona id and name are both its platform name (create's name when it
// is a valid platform name, else a generated one).
//
// Auth: the managoat key as the bearer (Authorization: Bearer …), on the
// control plane and the toolbox alike; a bad key is Daytona's 401
// {"statusCode":401,"message":...,"error":"Unauthorized"}, an unknown
// sandbox its 404 in the same shape.
//
// Served: POST /sandbox (name, labels, envVars: given to every command),
// GET /sandbox (the labels filter, one page), GET and DELETE
// /sandbox/{id}, POST /sandbox/{id}/stop (the platform's suspend) and
// /start (resume), PUT /sandbox/{id}/labels, GET
// /sandbox/{id}/toolbox-proxy-url; toolbox: POST /process/execute (exit
// code, combined output, cwd relative to the sandbox's working directory,
// envs, timeout in seconds: 408 at its end), GET /user-home-dir and
// /work-dir; files (fs.go): GET and DELETE /files (list one level;
// delete, a directory only with recursive=true), GET /files/info, POST
// /files/folder (mode), POST /files/move, POST /files/upload-v2 and
// /files/upload (query path, multipart field file), GET /files/search
// (find -name's glob), GET /files/find (grep -F's lines), POST
// /files/replace (a Go regular expression, each file read and written
// through /v1's files API, at most 16 MiB), multipart POST
// /files/bulk-upload and POST /files/bulk-download (a multipart answer, an
// "error" part per missing path), relative paths from the sandbox's
// working directory; each a short shell command in the sandbox through
// /v1's exec, or /v1's files API for the bytes.
//
// What the platform does not keep (a sandbox's Daytona labels and
// envVars) the door keeps in memory, under the API key's public id: it is
// lost when serve restarts, and another key of the same account sees the
// sandbox without labels. The platform's /v1 records keep no labels a door
// could put them in.
//
// Not supported, answered 501 in Daytona's error shape: snapshots,
// volumes, images, docker registries, backups, archive, autostop,
// autoarchive and autodelete intervals, network settings, preview links,
// and on the toolbox sessions, setFilePermissions, git, LSP, PTYs, code runs and computer use in this
// version (an unknown toolbox route is the daemon's
// bare text 404). The SDK's socket.io state events are refused with 404,
// so it polls.
//
// Bounds: a request body is at most 1 MiB (413 beyond), an upload 64 MiB;
// a command's output is bounded by the platform's exec limit.
package daytonadoor

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/doors/internal/inproc"
	"github.com/managoat/managoat/sandbox"
)

// maxBody bounds a request body.
const maxBody = 1 << 20

// Options configure a Door.
type Options struct {
	// API is the platform's /v1 handler (an *api.Server).
	API http.Handler
	// Prefix is the path the door is mounted at, e.g. "/daytona".
	Prefix string
}

// Door is the Daytona front door, an http.Handler.
type Door struct {
	prefix string
	api    *inproc.API // the platform's /v1, in process

	mu   sync.Mutex
	meta map[string]*meta // key id + "\x00" + sandbox name
	done chan struct{}
}

// meta is what Daytona knows of a sandbox that the platform does not keep.
type meta struct {
	Labels map[string]string
	Envs   map[string]string
	Home   string // the working directory, once asked
}

// New returns a door over o.API. Close it when done.
func New(o Options) (*Door, error) {
	if o.API == nil {
		return nil, sandbox.Invalid("api", "the door needs the platform's API handler")
	}
	d := &Door{prefix: strings.TrimRight(o.Prefix, "/"), meta: map[string]*meta{}, done: make(chan struct{})}
	d.api = inproc.Start(o.API)
	return d, nil
}

// Close stops the pipe to the API.
func (d *Door) Close() error {
	d.mu.Lock()
	select {
	case <-d.done:
		d.mu.Unlock()
		return nil
	default:
	}
	close(d.done)
	d.mu.Unlock()
	return d.api.Close()
}

// ServeHTTP routes a control-plane or a toolbox call.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if d.prefix != "" {
		rest, ok := strings.CutPrefix(path, d.prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			apiErr(w, http.StatusNotFound, "Cannot "+r.Method+" "+path)
			return
		}
		path = rest
	}
	path = "/" + strings.TrimLeft(path, "/")
	if strings.HasPrefix(path, "/api/socket.io") || strings.HasPrefix(path, "/socket.io") {
		apiErr(w, http.StatusNotFound, "Cannot "+r.Method+" "+path)
		return
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		apiErr(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	limit := int64(maxBody)
	if strings.HasPrefix(path, "/toolbox/") && strings.Contains(path, "/files/") {
		limit = maxUpload // an upload's bytes
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	p, err := d.providerFor(r, key)
	if err != nil {
		apiErr(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	defer p.Close()
	switch {
	case path == "/sandbox" || strings.HasPrefix(path, "/sandbox/"):
		d.controlPlane(w, r, p, key, strings.Trim(strings.TrimPrefix(path, "/sandbox"), "/"))
	case strings.HasPrefix(path, "/toolbox/"):
		id, sub, _ := strings.Cut(strings.TrimPrefix(path, "/toolbox/"), "/")
		d.toolbox(w, r, p, key, id, "/"+sub)
	default:
		first, _, _ := strings.Cut(strings.TrimPrefix(path, "/"), "/")
		switch first {
		case "snapshots", "volumes", "docker-registry", "object-storage", "images", "backups":
			notSupported(w, first)
		default:
			apiErr(w, http.StatusNotFound, "Cannot "+r.Method+" "+path)
		}
	}
}

// providerFor is the platform as the caller with key sees it, its
// requests coming from r's peer address.
func (d *Door) providerFor(r *http.Request, key string) (*client.Client, error) {
	return d.api.ClientFor(r, key)
}

// metaKey is what the door keeps of sandbox name under: the key's public
// id (never its secret), and the sandbox.
func metaKey(key, name string) string { return api.KeyID(key) + "\x00" + name }

// apiErr writes Daytona's error shape.
func apiErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"statusCode": status, "message": msg, "error": http.StatusText(status)})
}

// notSupported is Daytona's error shape for what managoat cannot do.
func notSupported(w http.ResponseWriter, what string) {
	apiErr(w, http.StatusNotImplemented, what+" is not supported by managoat's Daytona front door")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// fail writes err, the platform's error taxonomy, as Daytona's status.
func fail(w http.ResponseWriter, err error, notFound string) {
	var rl *sandbox.RateLimitedError
	var iv *sandbox.InvalidError
	var dn *sandbox.DeniedError
	var mb *http.MaxBytesError
	switch {
	case errors.As(err, &mb):
		apiErr(w, http.StatusRequestEntityTooLarge, "request body too large")
	case errors.As(err, &dn) && strings.HasPrefix(dn.Reason, "unauthorized"):
		apiErr(w, http.StatusUnauthorized, "Unauthorized")
	case errors.Is(err, sandbox.ErrNotFound):
		apiErr(w, http.StatusNotFound, notFound)
	case errors.Is(err, sandbox.ErrAlreadyExists):
		apiErr(w, http.StatusConflict, err.Error())
	case errors.As(err, &rl):
		apiErr(w, http.StatusTooManyRequests, "rate limited")
	case errors.As(err, &iv):
		apiErr(w, http.StatusBadRequest, err.Error())
	case errors.As(err, &dn):
		apiErr(w, http.StatusForbidden, err.Error())
	case errors.Is(err, sandbox.ErrNotSupported):
		apiErr(w, http.StatusNotImplemented, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		apiErr(w, http.StatusGatewayTimeout, err.Error())
	default:
		apiErr(w, http.StatusBadGateway, err.Error())
	}
}
