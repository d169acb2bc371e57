// Package spritesdoor is the platform's Sprites front door: Fly's Sprites
// REST and exec WebSocket API over the platform's records, accounts,
// policy and providers, so that a program written for the Sprites SDK
// (@fly/sprites@0.1.0) runs unchanged against `managoat serve` with the
// client's baseURL set to the door and its token a managoat API key.
//
// Every call goes through the platform's own /v1 handler, in process: the
// door holds a platform client (package platform/client) per request,
// whose transport is an in-memory pipe to the API handler (no socket), so
// authentication, the failed-authentication bound (counted by the Sprites
// caller's own address, which the pipe carries), rate limits, quotas,
// policy and the idle lifecycle are those of /v1. A sprite made through
// the door is a row in `managoat ls` (the sprite's name is its name there)
// and a sandbox made through /v1 is a sprite of the door's listing.
//
// Auth: the managoat key is the Sprites bearer token (Authorization:
// Bearer …); a missing, bad or revoked one is 401
// {"error":"unauthorized","message":…}, as Sprites answers.
//
// Served: POST /v1/sprites (create: a name the platform takes; a name in
// use is 409 already_exists), GET /v1/sprites (prefix, max_results,
// continuation_token paging, by name; a sprite's status is running, or
// cold while the platform has it suspended or parked), GET, PUT (url_settings and labels,
// kept by the door) and DELETE /v1/sprites/{name}; the exec WebSocket
// (/v1/sprites/{name}/exec?cmd=…: stdin, env, dir, tty, rows, cols,
// max_run_after_disconnect; binary frames 0 stdin, 1 stdout, 2 stderr, 3
// exit, 4 stdin EOF, a TTY's raw bytes and its text exit message; text
// resize and signal messages), attach by id (/exec/{id}, ?session_id=,
// ?id=: the session's output from byte zero, then its tail), GET exec (the
// sprite's sessions, is_active while they run), POST exec/{id}/kill
// (NDJSON progress: signal, exited or timeout and killed, complete with
// the exit code; no pid, which the platform does not report), POST exec
// (the HTTP exec: one chunk per frame); the filesystem: PUT fs/write, GET
// fs/read, GET fs/list, DELETE fs/delete, POST fs/rename, fs/copy,
// fs/chmod and fs/chown (errors {error, code, path} with the errno name);
// checkpoints (POST checkpoint, GET checkpoints and checkpoints/{id},
// POST checkpoints/{id}/restore) where the provider below has them.
//
// Every exec is a platform session (a detachable spawn), so it is listed
// and can be attached by id as on Sprites; when its creator's socket goes,
// it runs on for max_run_after_disconnect (default 10 s, a TTY forever,
// "0" forever) and is then terminated through /v1. Those timers live in
// the door's memory: Close (or a restart of serve) leaves such sessions
// to the platform's idle lifecycle. A session's id is the platform's
// session id (a string, where Sprites' is a process id); an ended session
// stays listed (is_active false) while the platform keeps it, where
// Sprites forgets it.
//
// A TTY command's exit is a text message {"type":"exit","exit_code":N},
// then a close of the socket: 1000 for 0, 4000+N otherwise (the SDK
// reads only the close code, as 0 for 1000 and 1 for anything else).
//
// A sprite has no URL: the local provider publishes only the ports asked
// for at create, and the door asks for none.
//
// What the platform does not keep (a sprite's url_settings, labels and
// network rules, and its checkpoints' comments and times) the door keeps
// in memory under the API key's public id: it is lost when serve
// restarts.
//
// The network policy (GET and POST policy/network) goes onto the
// platform's allow list: policy.go says which rule lists it can hold.
//
// Not supported, answered 501 {"error":"not_supported","message":…} (the
// Sprites error shape): services, the privileges and resources policies,
// port proxies and port watching, the control connection (cc), fs/watch
// (a WebSocket: the SDK sees a refused upgrade), restart, upgrade, check,
// the NDJSON sprite watch, and checkpoints on a provider without them. An
// unknown sprite is 404 {"error":"not_found","message":"sprite not
// found"}; an unknown session 404 "session not found".
//
// Bounds: a JSON request body is at most 1 MiB (413 otherwise), an HTTP
// exec's stdin 64 MiB, a file upload streams to the sandbox through the
// platform's own file bounds, a listing's output 4 MiB. A malformed body
// is 400 invalid_request. A client that takes nothing of an exec's output
// for a minute is gone: its stream is detached (the session runs on as
// after a disconnect) or, for the HTTP exec, the command stopped.
package spritesdoor

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/doors/internal/inproc"
	"github.com/managoat/managoat/sandbox"
)

// maxBody bounds a JSON request body.
const maxBody = 1 << 20

// maxStdin bounds an HTTP exec's stdin (its request body).
const maxStdin = 64 << 20

// Options configure a Door.
type Options struct {
	// API is the platform's /v1 handler (an *api.Server).
	API http.Handler
	// Prefix is the path the door is mounted at, e.g. "/sprites".
	Prefix string
}

// Door is the Sprites front door, an http.Handler.
type Door struct {
	prefix string
	api    *inproc.API // the platform's /v1, in process

	mu       sync.Mutex
	meta     map[string]*meta // key id + "\x00" + sprite name
	graces   map[*grace]struct{}
	sessions map[string]string // key id + "\x00" + sprite + "\x00" + session id: its command line
	done     chan struct{}
	wg       sync.WaitGroup
}

// meta is what Sprites knows of a sprite that the platform does not keep.
type meta struct {
	Auth   string
	Labels []string
	Rules  []rule // the network policy last applied
	// Checkpoints are the comments and times of the checkpoints made
	// through the door, by id.
	Checkpoints map[string]checkpointMeta
}

type checkpointMeta struct {
	Comment string
	At      time.Time
}

// New returns a door over o.API. Close it when done.
func New(o Options) (*Door, error) {
	if o.API == nil {
		return nil, sandbox.Invalid("api", "the platform's API handler is required")
	}
	d := &Door{prefix: strings.TrimRight(o.Prefix, "/"), meta: map[string]*meta{},
		graces: map[*grace]struct{}{}, sessions: map[string]string{}, done: make(chan struct{})}
	d.api = inproc.Start(o.API)
	return d, nil
}

// Close stops the door's timers and streams (the sessions run on under
// the platform) and the pipe to the API.
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
	err := d.api.Close()
	d.wg.Wait() // the door's own goroutines
	return err
}

// closing reports a closed door.
func (d *Door) closing() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// ServeHTTP serves the Sprites API.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := r.URL.EscapedPath()
	if d.prefix != "" {
		rest, ok := strings.CutPrefix(p, d.prefix)
		if !ok || (rest != "" && rest[0] != '/') {
			apiErr(w, http.StatusNotFound, "not_found", "no such route")
			return
		}
		p = rest
	}
	if d.closing() {
		apiErr(w, http.StatusServiceUnavailable, "unavailable", "the door is closing")
		return
	}
	key, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	key = strings.TrimSpace(key)
	if !ok || key == "" {
		apiErr(w, http.StatusUnauthorized, "unauthorized", "missing or invalid token")
		return
	}
	seg := strings.Split(strings.Trim(p, "/"), "/")
	for i, s := range seg {
		if u, err := url.PathUnescape(s); err == nil {
			seg[i] = u
		}
	}
	if len(seg) < 2 || seg[0] != "v1" || seg[1] != "sprites" {
		apiErr(w, http.StatusNotFound, "not_found", "no such route")
		return
	}
	pc, err := d.providerFor(r, key)
	if err != nil {
		apiErr(w, http.StatusUnauthorized, "unauthorized", "missing or invalid token")
		return
	}
	defer pc.Close()
	c := &call{d: d, p: pc, key: key}
	seg = seg[2:]
	if len(seg) == 0 {
		switch r.Method {
		case http.MethodGet:
			if strings.Contains(r.Header.Get("Accept"), "application/x-ndjson") {
				unsupported(w, "watching sprites")
				return
			}
			c.list(w, r)
		case http.MethodPost:
			c.create(w, r)
		default:
			apiErr(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method)
		}
		return
	}
	name := seg[0]
	c.name = name
	c.h = &sandbox.Handle{Provider: client.Name, Name: name}
	if sandbox.ValidateName(name) != nil {
		apiErr(w, http.StatusNotFound, "not_found", "sprite not found")
		return
	}
	route := strings.Join(seg[1:], "/")
	// A new exec (either kind) and the session listing name only their
	// sprite, so the platform's 404 is the sprite's: they go without a
	// lookup first (one call to /v1 less for each exec).
	if len(seg) == 1 || route != "exec" {
		s, err := pc.Lookup(r.Context(), c.h)
		if err != nil {
			fail(w, err, "sprite not found")
			return
		}
		c.sb = s
	}
	if len(seg) == 1 {
		c.spriteRoute(w, r)
		return
	}
	isWS := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	switch {
	case route == "exec" && isWS:
		c.execWS(w, r, "")
	case len(seg) == 3 && seg[1] == "exec" && isWS:
		c.execWS(w, r, seg[2])
	case route == "exec" && r.Method == http.MethodGet:
		c.listSessions(w, r)
	case route == "exec" && r.Method == http.MethodPost:
		c.execHTTP(w, r)
	case len(seg) == 4 && seg[1] == "exec" && seg[3] == "kill" && r.Method == http.MethodPost:
		c.kill(w, r, seg[2])
	case route == "fs/watch":
		unsupported(w, "fs/watch")
	case strings.HasPrefix(route, "fs/"):
		c.filesystem(w, r, strings.TrimPrefix(route, "fs/"))
	case route == "checkpoint" && r.Method == http.MethodPost:
		c.createCheckpoint(w, r)
	case route == "checkpoints" && r.Method == http.MethodGet:
		c.listCheckpoints(w, r, "")
	case len(seg) == 3 && seg[1] == "checkpoints" && r.Method == http.MethodGet:
		c.listCheckpoints(w, r, seg[2])
	case len(seg) == 4 && seg[1] == "checkpoints" && seg[3] == "restore" && r.Method == http.MethodPost:
		c.restoreCheckpoint(w, r, seg[2])
	case route == "policy/network":
		c.policy(w, r)
	case strings.HasPrefix(route, "services"), strings.HasPrefix(route, "policy"), strings.HasPrefix(route, "proxy"),
		route == "restart", route == "upgrade", route == "check", route == "control", strings.HasPrefix(route, "ports"):
		unsupported(w, route)
	default:
		apiErr(w, http.StatusNotFound, "not_found", "no such route")
	}
}

// call is one authenticated request: the platform as its key sees it,
// and the sprite it names.
type call struct {
	d    *Door
	p    *client.Client
	key  string
	name string
	h    *sandbox.Handle
	sb   api.Sandbox
}

// providerFor is the platform as the caller with key sees it, its
// requests coming from r's peer address.
func (d *Door) providerFor(r *http.Request, key string) (*client.Client, error) {
	return d.api.ClientFor(r, key)
}

// metaKey is what the door keeps of sprite name under: the key's public
// id (never its secret), and the sprite.
func metaKey(key, name string) string { return api.KeyID(key) + "\x00" + name }

// readBody reads a JSON request body, at most maxBody; false (and the
// answer written) when it is too large.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	var b strings.Builder
	buf := make([]byte, 32<<10)
	rd := http.MaxBytesReader(w, r.Body, maxBody)
	for {
		n, err := rd.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			var mb *http.MaxBytesError
			if errors.As(err, &mb) {
				apiErr(w, http.StatusRequestEntityTooLarge, "request_too_large", "request body too large")
				return nil, false
			}
			return []byte(b.String()), true
		}
	}
}

// apiErr writes Sprites' error shape.
func apiErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": code, "message": msg})
}

func unsupported(w http.ResponseWriter, what string) {
	apiErr(w, http.StatusNotImplemented, "not_supported", what+" is not supported by managoat's Sprites front door")
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// fail writes err in Sprites' shape; notFound is the message of a 404.
func fail(w http.ResponseWriter, err error, notFound string) {
	st, code, msg := statusOf(err)
	if st == http.StatusNotFound && notFound != "" {
		msg = notFound
	}
	apiErr(w, st, code, msg)
}

// statusOf maps the platform's error taxonomy onto Sprites' statuses and
// error codes.
func statusOf(err error) (int, string, string) {
	var rl *sandbox.RateLimitedError
	var iv *sandbox.InvalidError
	var dn *sandbox.DeniedError
	switch {
	case isUnauthorized(err):
		return http.StatusUnauthorized, "unauthorized", "missing or invalid token"
	case errors.Is(err, sandbox.ErrNotFound):
		return http.StatusNotFound, "not_found", "not found"
	case errors.Is(err, sandbox.ErrAlreadyExists):
		return http.StatusConflict, "already_exists", "a sprite with this name already exists"
	case errors.As(err, &rl):
		return http.StatusTooManyRequests, "rate_limited", err.Error()
	case errors.As(err, &iv):
		return http.StatusBadRequest, "invalid_request", err.Error()
	case errors.As(err, &dn):
		return http.StatusForbidden, "forbidden", err.Error()
	case errors.Is(err, sandbox.ErrNotSupported):
		return http.StatusNotImplemented, "not_supported", err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timeout", err.Error()
	}
	return http.StatusBadGateway, "upstream_error", err.Error()
}

// isUnauthorized reports the platform's 401 (a bad or revoked key).
func isUnauthorized(err error) bool {
	var dn *sandbox.DeniedError
	return errors.As(err, &dn) && strings.HasPrefix(dn.Reason, "unauthorized")
}
