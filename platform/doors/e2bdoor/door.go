// Package e2bdoor is the platform's E2B front door: E2B's own control
// plane (REST) and envd (Connect in its JSON form, and /files) over the
// platform's records, accounts, policy and providers, so that a program
// written for E2B's SDK (e2b@2.51.0) runs unchanged against `managoat
// serve` with E2B_API_URL and E2B_SANDBOX_URL both set to the door and
// E2B_API_KEY a managoat API key.
//
// Every call goes through the platform's own /v1 handler, in process: the
// door holds a platform client (package platform/client) per request,
// whose transport is an in-memory pipe to the API handler (no socket), so
// authentication, the failed-authentication bound (counted by the E2B
// caller's own address, which the pipe carries), rate limits, quotas,
// policy and the idle lifecycle are those of /v1. A sandbox made through
// the door is a row in `managoat ls` (its E2B sandboxID is its name there)
// and a sandbox made through /v1 is listed by the door.
//
// Auth: the control plane takes the managoat key in X-API-Key (401
// {"code":401,"message":...} as E2B answers otherwise). envd calls carry
// no API key in E2B's protocol, only the sandbox's envdAccessToken
// (X-Access-Token), which the door issues at create, connect and GET
// /sandboxes/{id}: the caller's key and the sandbox's id sealed with
// AES-GCM under the door's secret (Options.Secret). Nothing of it is
// stored; a token names one sandbox of one account, is refused (401) for
// any other, and dies with its key (the key is checked by /v1 on each
// call). Without Options.Secret a random one is made, and tokens die with
// the process (Sandbox.connect gives a new one).
//
// Served (control plane): POST /v2/sandboxes and /sandboxes (template
// "base" or none: the platform's default image; metadata and envVars kept
// by the door, envVars given to every command), GET /v2/sandboxes (the
// metadata and state filters, limit and nextToken paging, newest first),
// GET and DELETE /sandboxes/{id}, POST /sandboxes/{id}/timeout (the
// sandbox's end: create's timeout, 300 s by default, then each
// setTimeout's; at its end the door destroys the sandbox through /v1 as
// the key that set it, a pause stops the count and connect starts it
// again, as E2B's timeout does), PUT /sandboxes/{id}/network and create's
// network and allow_internet_access (onto the platform's allow list:
// network.go says which forms it can hold), POST /sandboxes/{id}/pause (suspend), POST
// /v2/sandboxes/{id}/connect and /sandboxes/{id}/connect (resume a paused
// one). envd: process.Process Start (a server stream of start, data and
// end events; exit codes as envd reports them), Connect, List, SendInput,
// CloseStdin, SendSignal, Update (a terminal's resize); filesystem.Filesystem Stat, MakeDir, Move,
// Remove and ListDir (to a depth; its output bounded at 4 MiB) (each a short shell command in the sandbox through /v1's exec,
// fs.go), WatchDir (the SDK's watchDir: snapshots of the directory polled
// every 200 ms in the sandbox, their differences sent as create, write,
// chmod, rename and remove events; watch.go says what polling cannot see);
// GET and POST /files (octet-stream, gzip or not, and multipart);
// /health.
//
// A sandbox's E2B metadata is kept on its platform record, as labels
// e2b.metadata/KEY (so it outlives serve and every key of the account sees
// it; an entry the labels cannot hold, past 32 or with a key outside
// [A-Za-z0-9._/-], stays in the door's memory only). What the platform does
// not keep (its template, envVars and endAt, and the timer of its end) the
// door keeps in memory, under the API key's public id: it is lost when
// serve restarts (the sandbox then lives on under the platform's idle
// lifecycle only).
//
// Not supported, answered with E2B's error shape (501 {"code":501,...} on
// the control plane, Connect's unimplemented on envd): template builds
// (/templates), snapshots, volumes, secrets, metrics and logs, network
// rules and egress proxies, StreamInput, and filesystem.Filesystem's non-streaming
// watchers (CreateWatcher, GetWatcherEvents, RemoveWatcher) in this
// version.
//
// Bounds: a control-plane body is at most 1 MiB, a Connect message 1 MiB,
// an upload streams to the sandbox through the platform's own file
// bounds. A malformed body is 400 in E2B's shape.
package e2bdoor

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/doors/internal/inproc"
	"github.com/managoat/managoat/sandbox"
)

// EnvdVersion is the envd version the door reports: the SDK gates
// features on it (stdin from 0.3.0, CloseStdin from 0.5.2, octet-stream
// uploads from 0.5.7).
const EnvdVersion = "0.5.7"

// maxBody bounds a control-plane request body and a Connect message.
const maxBody = 1 << 20

// Options configure a Door.
type Options struct {
	// API is the platform's /v1 handler (an *api.Server).
	API http.Handler
	// Secret keys the envd access tokens (an AES-GCM key derived from it
	// by HMAC-SHA256); at least 16 bytes. Empty: random, and tokens die
	// with the process.
	Secret []byte
	// Prefix is the path the door is mounted at, e.g. "/e2b".
	Prefix string
}

// Door is the E2B front door, an http.Handler.
type Door struct {
	prefix string
	aead   cipher.AEAD
	api    *inproc.API // the platform's /v1, in process
	envd   http.Handler

	mu    sync.Mutex
	meta  map[string]*meta // account key id + "\x00" + sandbox id
	procs map[string]*procTable
	// timers kill each sandbox at its E2B end (armLocked).
	timers map[string]*time.Timer
	done   chan struct{}
	wg     sync.WaitGroup
}

// meta is what E2B knows of a sandbox that the platform does not keep.
type meta struct {
	Template  string
	Metadata  map[string]string
	Envs      map[string]string
	StartedAt time.Time
	EndAt     time.Time
}

// New returns a door over o.API. Close it when done.
func New(o Options) (*Door, error) {
	secret := o.Secret
	if len(secret) == 0 {
		secret = make([]byte, 32)
		_, _ = rand.Read(secret)
	}
	if len(secret) < 16 {
		return nil, sandbox.Invalid("secret", "the door's secret must be 16 bytes or more")
	}
	// The token key is derived, so a secret shared with other uses (serve's
	// signs preview links) is never itself the cipher's key.
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("managoat e2bdoor envd token v1"))
	blk, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(blk)
	if err != nil {
		return nil, err
	}
	d := &Door{prefix: strings.TrimRight(o.Prefix, "/"), aead: aead,
		meta: map[string]*meta{}, procs: map[string]*procTable{}, timers: map[string]*time.Timer{}, done: make(chan struct{})}
	d.api = inproc.Start(o.API)
	d.envd = d.envdMux()
	return d, nil
}

// Close stops every command the door follows (detaching it) and the pipe
// to the API.
func (d *Door) Close() error {
	d.mu.Lock()
	select {
	case <-d.done:
		d.mu.Unlock()
		return nil
	default:
	}
	close(d.done)
	for _, tm := range d.timers {
		tm.Stop()
	}
	d.timers = map[string]*time.Timer{}
	tables := d.procs
	d.procs = map[string]*procTable{}
	d.mu.Unlock()
	for _, t := range tables {
		t.stopAll()
	}
	err := d.api.Close()
	d.wg.Wait() // the door's own goroutines
	return err
}

// ServeHTTP routes an envd call (it names its sandbox in E2b-Sandbox-Id)
// or a control-plane call.
func (d *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if d.prefix != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, d.prefix)
		if !ok {
			apiErr(w, http.StatusNotFound, "no such route")
			return
		}
		r2 := r.Clone(r.Context())
		r2.URL.Path = "/" + strings.TrimLeft(rest, "/")
		r2.URL.RawPath = ""
		r = r2
	}
	if r.Header.Get("E2b-Sandbox-Id") != "" {
		d.serveEnvd(w, r)
		return
	}
	d.serveAPI(w, r)
}

// providerFor is the platform as the caller with key sees it, its
// requests coming from r's peer address.
func (d *Door) providerFor(r *http.Request, key string) (*client.Client, error) {
	return d.api.ClientFor(r, key)
}

// token seals key and the sandbox id.
func (d *Door) token(key, id string) string {
	nonce := make([]byte, d.aead.NonceSize())
	_, _ = rand.Read(nonce)
	b, _ := json.Marshal([2]string{key, id})
	return base64.RawURLEncoding.EncodeToString(d.aead.Seal(nonce, nonce, b, []byte("e2bdoor envd")))
}

// open returns the key a token seals for id.
func (d *Door) open(tok, id string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	ns := d.aead.NonceSize()
	if err != nil || len(b) < ns {
		return "", false
	}
	plain, err := d.aead.Open(nil, b[:ns], b[ns:], []byte("e2bdoor envd"))
	if err != nil {
		return "", false
	}
	var v [2]string
	if json.Unmarshal(plain, &v) != nil || v[1] != id || v[0] == "" {
		return "", false
	}
	return v[0], true
}

// metaKey is what the door keeps of sandbox id under: the key's public
// id (never its secret), and the sandbox.
func metaKey(key, id string) string {
	return api.KeyID(key) + "\x00" + id
}

// apiErr writes E2B's control-plane error shape.
func apiErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// statusOf maps the platform's error taxonomy onto E2B's statuses.
func statusOf(err error) (int, string) {
	var rl *sandbox.RateLimitedError
	var iv *sandbox.InvalidError
	var dn *sandbox.DeniedError
	switch {
	case err == nil:
		return http.StatusOK, ""
	case isUnauthorized(err):
		return http.StatusUnauthorized, "Invalid API key"
	case errors.Is(err, sandbox.ErrNotFound):
		return http.StatusNotFound, "not found"
	case errors.As(err, &rl):
		return http.StatusTooManyRequests, "rate limited"
	case errors.As(err, &iv):
		return http.StatusBadRequest, err.Error()
	case errors.As(err, &dn):
		return http.StatusForbidden, err.Error()
	case errors.Is(err, sandbox.ErrNotSupported):
		return http.StatusNotImplemented, err.Error()
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, err.Error()
	}
	return http.StatusBadGateway, err.Error()
}

// isUnauthorized reports the platform's 401 (a bad or revoked key).
func isUnauthorized(err error) bool {
	var dn *sandbox.DeniedError
	return errors.As(err, &dn) && strings.HasPrefix(dn.Reason, "unauthorized")
}

func itoa(n int) string { return strconv.Itoa(n) }
