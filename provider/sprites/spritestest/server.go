// Package spritestest is an in-process fake of the Sprites HTTP and
// WebSocket API, for driving code that talks to Sprites without an account
// or a network: sprites with files, network policies, checkpoints and real
// exec sessions, plus failure injection.
//
//	srv := spritestest.NewServer(spritestest.Options{})
//	defer srv.Close()
//	p, _ := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
//
// Commands run as real processes on this machine (the fake is not a
// sandbox; as root, a sprite under a network policy runs them without a
// network: see EnforcesPolicy): argv is executed directly, with its working directory in the
// sprite's own temporary directory unless the request names an existing
// absolute directory. A session's id is its process's PID, so it is
// listed only once the process has started, which is after the exec
// socket's upgrade (Options.StartDelay widens the gap); session_info
// announces it first on every socket. max_run_after_disconnect bounds how
// long a process runs once its creator's socket is gone (default: TTY
// forever, otherwise Options.MaxRunAfterDisconnect, 10 s); the retired
// detachable parameter is ignored. Output, scrollback, attach replay from byte zero,
// stdin, EOF, TTYs (a real PTY) and exit codes are real streams. One
// built-in command exists: `spritestest-drop WORDS...` prints WORDS and then
// closes every connection of its session without an exit, as a transport
// that dies mid-command does.
//
// The filesystem API is served as @fly/sprites@0.1.0 calls it: PUT
// fs/write, GET fs/read, GET fs/list ({path, entries}: a directory's
// entries, recursive and pattern as asked, or a file's own entry), DELETE
// fs/delete (recursive), POST fs/rename, fs/copy and fs/chmod (JSON
// bodies), errors as {error, code, path} with the errno name (ENOENT,
// ENOTEMPTY, …) the SDK maps to a FilesystemError. Paths are taken from
// workingDir and land under the sprite's directory (an absolute path is
// taken relative to it); File reads them back. Listing honours prefix and
// max_results.
//
// POST /v1/sprites/{name}/exec?cmd=… is the HTTP exec: the body is the
// command's stdin (stdin=true), and the answer streams one HTTP chunk per
// frame (1 stdout, 2 stderr, then 3 and the exit code's byte). The SDK
// takes each read of the body for one frame, so frames are spaced
// (Options.HTTPExecFrameGap) to arrive alone, consecutive output of one
// stream merged into one frame.
//
// Failure injection (Inject) replaces or delays the answer to matching
// requests: status overrides with any body and headers (a Location for a
// redirect, a Retry-After), oversized bodies, stalls, truncated bodies
// (Content-Length larger than what is sent, then the connection closes),
// dropped connections, and, on the exec WebSocket, a close without exit.
// Requests lists every request the server received.
package spritestest

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// DefaultToken is the bearer token a Server accepts when Options.Token is
// empty.
const DefaultToken = "spritestest-token"

// Options configure a Server.
type Options struct {
	// Token is the bearer token the server accepts. Default DefaultToken.
	Token string
	// PageSize is the number of sprites per listing page. Default 50.
	PageSize int
	// MaxRunAfterDisconnect is how long a non-TTY session's process runs
	// after its creator's connection is gone when the request names no
	// max_run_after_disconnect. Default 10 s, as Sprites documents.
	MaxRunAfterDisconnect time.Duration
	// StartDelay is the time between a new exec's WebSocket upgrade and
	// its process's start. A session is listed only once its process
	// exists (its id is the PID), so a client that looks for its session
	// by listing right after the upgrade finds nothing.
	StartDelay time.Duration
	// HTTPExecFrameGap is the least time between two frames of an HTTP
	// exec answer (POST …/exec): @fly/sprites takes each read of the body
	// for one frame, and Node's fetch hands chunks that arrived together
	// over in one read, so frames are spaced to arrive alone. Default
	// 25 ms; negative sends them back to back.
	HTTPExecFrameGap time.Duration
}

// Server is the fake Sprites API. Create it with NewServer and Close it.
type Server struct {
	// URL is the REST base URL, e.g. http://127.0.0.1:41234.
	URL string
	// Token is the bearer token the server accepts.
	Token string

	opts   Options
	hs     *httptest.Server
	root   string
	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // session goroutines

	mu        sync.Mutex
	sprites   map[string]*sprite
	faults    []*Fault
	requests  []Request
	abandoned int
	nextID    int
	nextSess  int
	closed    bool
}

// Request is one request the server received.
type Request struct {
	Method string
	// Path is the path as sent, still percent-encoded.
	Path     string
	RawQuery string
	Body     []byte
	// Authorized reports whether the bearer token matched.
	Authorized bool
	Proto      string
	// AcceptEncoding is the Accept-Encoding header as sent.
	AcceptEncoding string
	// WebSocket reports an upgrade request.
	WebSocket bool
}

// Query parses RawQuery.
func (r Request) Query() url.Values { v, _ := url.ParseQuery(r.RawQuery); return v }

type sprite struct {
	name, id    string
	status      string
	auth        string
	created     time.Time
	dir         string
	policy      json.RawMessage
	closed      bool // policy is set and is not one allow rule for every domain
	sessions    map[string]*session
	checkpoints []*checkpoint
	nextCP      int
}

type checkpoint struct {
	id, comment string
	at          time.Time
	dir         string
}

// NewServer starts a fake on a loopback port.
func NewServer(opts Options) *Server {
	if opts.Token == "" {
		opts.Token = DefaultToken
	}
	if opts.PageSize <= 0 {
		opts.PageSize = 50
	}
	if opts.MaxRunAfterDisconnect <= 0 {
		opts.MaxRunAfterDisconnect = 10 * time.Second
	}
	if opts.HTTPExecFrameGap == 0 {
		opts.HTTPExecFrameGap = 25 * time.Millisecond
	}
	root, err := os.MkdirTemp("", "spritestest-")
	if err != nil {
		panic("spritestest: " + err.Error())
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Token: opts.Token, opts: opts, root: root, ctx: ctx, cancel: cancel, sprites: map[string]*sprite{}}
	s.hs = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.hs.URL
	return s
}

// Close kills every session's process, closes every connection and removes
// the sprites' directories.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	var all []*session
	for _, sp := range s.sprites {
		for _, ss := range sp.sessions {
			all = append(all, ss)
		}
	}
	s.mu.Unlock()
	s.cancel()
	for _, ss := range all {
		ss.kill()
	}
	s.hs.Close()
	s.wg.Wait()
	_ = os.RemoveAll(s.root)
}

// Requests returns every request received so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ResetRequests forgets the recorded requests.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = nil
}

// Abandoned counts stalled requests whose client went away (closed its
// socket) before the stall ended.
func (s *Server) Abandoned() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.abandoned
}

// Names returns the existing sprites' names, sorted.
func (s *Server) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.sprites))
	for n := range s.sprites {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// AddSprite creates a sprite directly, as if another client had.
func (s *Server) AddSprite(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.sprites[name]; !ok {
		s.sprites[name] = s.newSpriteLocked(name, "public")
	}
}

// SetStatus sets the status a sprite reports.
func (s *Server) SetStatus(name, status string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if ok {
		sp.status = status
	}
	return ok
}

// URLAuth returns the sprite's url_settings.auth ("public" or "sprite").
func (s *Server) URLAuth(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok {
		return "", false
	}
	return sp.auth, true
}

// Policy returns the network policy last applied to the sprite, as sent.
func (s *Server) Policy(name string) (json.RawMessage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp, ok := s.sprites[name]
	if !ok || sp.policy == nil {
		return nil, false
	}
	return append(json.RawMessage(nil), sp.policy...), true
}

// File reads a file written into the sprite (path as given to fs/write).
func (s *Server) File(name, path string) ([]byte, error) {
	s.mu.Lock()
	sp, ok := s.sprites[name]
	s.mu.Unlock()
	if !ok {
		return nil, os.ErrNotExist
	}
	return os.ReadFile(sp.resolve(path, "/"))
}

func (s *Server) newSpriteLocked(name, auth string) *sprite {
	s.nextID++
	return &sprite{name: name, id: fmt.Sprintf("sprite-%08x-%d", time.Now().UnixNano()&0xffffffff, s.nextID),
		status: "running", auth: auth, created: time.Now().UTC(), sessions: map[string]*session{}}
}

// ensureDir creates the sprite's directory on first use.
func (s *Server) ensureDir(sp *sprite) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sp.dir == "" {
		d, err := os.MkdirTemp(s.root, "sprite-")
		if err != nil {
			return "", err
		}
		sp.dir = d
	}
	return sp.dir, nil
}

// resolve maps a sprite path (relative to wd) under the sprite directory.
func (sp *sprite) resolve(p, wd string) string {
	if !strings.HasPrefix(p, "/") {
		p = wd + "/" + p
	}
	return filepath.Join(sp.dir, filepath.Clean("/"+p))
}

func (sp *sprite) json() map[string]any {
	return map[string]any{
		"id": sp.id, "name": sp.name, "organization": "spritestest", "status": sp.status,
		"url":          "https://" + sp.name + ".sprites.test",
		"url_settings": map[string]string{"auth": sp.auth},
		"created_at":   sp.created.Format(time.RFC3339), "updated_at": sp.created.Format(time.RFC3339),
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]any{"error": code, "message": msg})
}

// segments splits the escaped path and unescapes each segment, so an
// encoded '/' stays inside its segment.
func segments(r *http.Request) []string {
	parts := strings.Split(strings.Trim(r.URL.EscapedPath(), "/"), "/")
	for i, p := range parts {
		if u, err := url.PathUnescape(p); err == nil {
			parts[i] = u
		}
	}
	return parts
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	r.Body = io.NopCloser(bytes.NewReader(body))
	isWS := strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
	authorized := r.Header.Get("Authorization") == "Bearer "+s.Token
	s.mu.Lock()
	s.requests = append(s.requests, Request{Method: r.Method, Path: r.URL.EscapedPath(), RawQuery: r.URL.RawQuery,
		Body: body, Authorized: authorized, Proto: r.Proto, AcceptEncoding: r.Header.Get("Accept-Encoding"), WebSocket: isWS})
	f := s.matchFaultLocked(r)
	s.mu.Unlock()
	if f != nil && s.applyFault(w, r, f, isWS) {
		return
	}
	if !authorized {
		apiError(w, http.StatusUnauthorized, "unauthorized", "missing or invalid token")
		return
	}
	seg := segments(r)
	if len(seg) < 2 || seg[0] != "v1" || seg[1] != "sprites" {
		apiError(w, http.StatusNotFound, "not_found", "no such route")
		return
	}
	seg = seg[2:]
	if len(seg) == 0 {
		switch r.Method {
		case http.MethodGet:
			s.list(w, r)
		case http.MethodPost:
			s.create(w, body)
		default:
			apiError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method)
		}
		return
	}
	s.mu.Lock()
	sp, ok := s.sprites[seg[0]]
	s.mu.Unlock()
	if len(seg) == 1 {
		s.spriteRoute(w, r, seg[0], sp, body)
		return
	}
	if !ok {
		apiError(w, http.StatusNotFound, "not_found", "sprite not found")
		return
	}
	route := strings.Join(seg[1:], "/")
	switch {
	case route == "fs/write" && r.Method == http.MethodPut:
		s.writeFile(w, r, sp, body)
	case route == "policy/network" && r.Method == http.MethodPost:
		s.setPolicy(w, sp, body)
	case route == "policy/network" && r.Method == http.MethodGet:
		s.mu.Lock()
		pol := sp.policy
		s.mu.Unlock()
		if pol == nil {
			pol = json.RawMessage(`{"rules":[]}`)
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(pol)
	case route == "exec" && isWS:
		s.execWS(w, r, sp, "")
	case route == "exec" && r.Method == http.MethodGet:
		s.listSessions(w, sp)
	case route == "exec" && r.Method == http.MethodPost:
		s.execHTTP(w, r, sp, body)
	case strings.HasPrefix(route, "fs/") && s.filesystem(w, r, sp, route, body):
	case len(seg) == 3 && seg[1] == "exec" && isWS:
		s.execWS(w, r, sp, seg[2])
	case len(seg) == 4 && seg[1] == "exec" && seg[3] == "kill" && r.Method == http.MethodPost:
		s.kill(w, r, sp, seg[2])
	case route == "checkpoint" && r.Method == http.MethodPost:
		s.createCheckpoint(w, sp, body)
	case route == "checkpoints" && r.Method == http.MethodGet:
		s.listCheckpoints(w, sp)
	case len(seg) == 4 && seg[1] == "checkpoints" && seg[3] == "restore" && r.Method == http.MethodPost:
		s.restoreCheckpoint(w, sp, seg[2])
	default:
		apiError(w, http.StatusNotFound, "not_found", "no such route")
	}
}

func validName(n string) bool {
	if n == "" || len(n) > 63 {
		return false
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func (s *Server) create(w http.ResponseWriter, body []byte) {
	var req struct {
		Name            string `json:"name"`
		WaitForCapacity *bool  `json:"wait_for_capacity"`
		URLSettings     *struct {
			Auth string `json:"auth"`
		} `json:"url_settings"`
	}
	if err := json.Unmarshal(body, &req); err != nil || !validName(req.Name) {
		apiError(w, http.StatusBadRequest, "invalid_request", "a valid name is required")
		return
	}
	auth := "sprite"
	if req.URLSettings != nil {
		if req.URLSettings.Auth != "public" && req.URLSettings.Auth != "sprite" {
			apiError(w, http.StatusBadRequest, "invalid_request", "url_settings.auth must be public or sprite")
			return
		}
		auth = req.URLSettings.Auth
	}
	s.mu.Lock()
	if _, ok := s.sprites[req.Name]; ok {
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "already_exists", "a sprite with this name already exists")
		return
	}
	sp := s.newSpriteLocked(req.Name, auth)
	s.sprites[req.Name] = sp
	out := sp.json()
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) spriteRoute(w http.ResponseWriter, r *http.Request, name string, sp *sprite, body []byte) {
	if sp == nil {
		apiError(w, http.StatusNotFound, "not_found", "sprite not found")
		return
	}
	switch r.Method {
	case http.MethodGet:
		s.mu.Lock()
		out := sp.json()
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
	case http.MethodPut:
		var req struct {
			URLSettings *struct {
				Auth string `json:"auth"`
			} `json:"url_settings"`
		}
		if json.Unmarshal(body, &req) != nil {
			apiError(w, http.StatusBadRequest, "invalid_request", "bad JSON")
			return
		}
		s.mu.Lock()
		if req.URLSettings != nil && req.URLSettings.Auth != "" {
			sp.auth = req.URLSettings.Auth
		}
		out := sp.json()
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, out)
	case http.MethodDelete:
		s.mu.Lock()
		delete(s.sprites, name)
		var all []*session
		for _, ss := range sp.sessions {
			all = append(all, ss)
		}
		s.mu.Unlock()
		for _, ss := range all {
			ss.kill()
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		apiError(w, http.StatusMethodNotAllowed, "method_not_allowed", r.Method)
	}
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	names := s.Names()
	if prefix := r.URL.Query().Get("prefix"); prefix != "" {
		var kept []string
		for _, n := range names {
			if strings.HasPrefix(n, prefix) {
				kept = append(kept, n)
			}
		}
		names = kept
	}
	pageSize := s.opts.PageSize
	if v := r.URL.Query().Get("max_results"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "invalid_request", "bad max_results")
			return
		}
		pageSize = min(pageSize, n)
	}
	start := 0
	if tok := r.URL.Query().Get("continuation_token"); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			apiError(w, http.StatusBadRequest, "invalid_request", "bad continuation token")
			return
		}
		start = sort.SearchStrings(names, string(b))
		if start < len(names) && names[start] == string(b) {
			start++
		}
	}
	end := min(start+pageSize, len(names))
	page := []map[string]any{}
	s.mu.Lock()
	for _, n := range names[start:end] {
		if sp, ok := s.sprites[n]; ok {
			page = append(page, sp.json())
		}
	}
	s.mu.Unlock()
	out := map[string]any{"sprites": page, "has_more": end < len(names)}
	if end < len(names) && end > start {
		out["next_continuation_token"] = base64.RawURLEncoding.EncodeToString([]byte(names[end-1]))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, sp *sprite, body []byte) {
	q := r.URL.Query()
	p := q.Get("path")
	if p == "" {
		apiError(w, http.StatusBadRequest, "invalid_request", "path is required")
		return
	}
	mode := os.FileMode(0o644)
	if m := q.Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			apiError(w, http.StatusBadRequest, "invalid_request", "mode must be octal")
			return
		}
		mode = os.FileMode(v).Perm()
	}
	if _, err := s.ensureDir(sp); err != nil {
		apiError(w, http.StatusInternalServerError, "internal", "no directory")
		return
	}
	wd := q.Get("workingDir")
	if wd == "" {
		wd = "/"
	}
	full := sp.resolve(p, wd)
	if q.Get("mkdirParents") == "true" {
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			apiError(w, http.StatusInternalServerError, "internal", "mkdir failed")
			return
		}
	}
	if err := os.WriteFile(full, body, mode); err != nil {
		apiError(w, http.StatusBadRequest, "write_failed", "cannot write the file")
		return
	}
	_ = os.Chmod(full, mode)
	writeJSON(w, http.StatusOK, map[string]any{"path": p, "size": len(body), "mode": fmt.Sprintf("%o", mode)})
}

func (s *Server) setPolicy(w http.ResponseWriter, sp *sprite, body []byte) {
	var req struct {
		Rules *[]struct {
			Domain  string `json:"domain"`
			Action  string `json:"action"`
			Include string `json:"include"`
		} `json:"rules"`
	}
	if json.Unmarshal(body, &req) != nil || req.Rules == nil {
		apiError(w, http.StatusBadRequest, "invalid_policy", "rules are required")
		return
	}
	for _, rule := range *req.Rules {
		if rule.Include == "" && (rule.Domain == "" || (rule.Action != "allow" && rule.Action != "deny")) {
			apiError(w, http.StatusBadRequest, "invalid_policy", "each rule needs a domain and an action")
			return
		}
	}
	open := len(*req.Rules) == 1 && (*req.Rules)[0].Domain == "*" && (*req.Rules)[0].Action == "allow"
	s.mu.Lock()
	sp.policy = append(json.RawMessage(nil), body...)
	sp.closed = !open
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
