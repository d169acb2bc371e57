// Package e2btest is an in-process fake of E2B's two planes, for tests of
// code that drives E2B (provider/e2b and anything built on it), checked by
// E2B's own SDK: TestSDK runs sdk/e2b.mjs, a program written against the
// public API of e2b@2.51.0 (internal/nodesdk runs it under Node), and
// asserts every call's result.
//
// # Generations
//
// Options.Generation picks the control plane the fake plays. V2 (the
// default) is the current service: create is POST /v2/sandboxes (timeout
// 300 s unless given; the sandbox is secure: the answer carries an
// envdAccessToken that envd then wants in X-Access-Token on every call
// but /health) and connect is POST /v2/sandboxes/{id}/connect (no field
// required, timeout 300 s unless given); the deprecated POST /sandboxes
// and POST /sandboxes/{id}/connect are still served, as E2B serves them.
// V1 is a service from before those routes: POST /sandboxes (timeout 15 s
// unless given, secure only with "secure": true), POST
// /sandboxes/{id}/connect with a required timeout, and 404 on the v2
// create and connect routes. Both serve create's envVars to every process.
//
// # Routes
//
// The control plane (X-API-Key; 401 otherwise) serves create, the v2
// listing (GET /v2/sandboxes) with metadata and state filters, limit and
// nextToken paging (the next token in X-Next-Token), GET /sandboxes/{id},
// kill (DELETE, 404 when unknown), pause (409 when already paused),
// connect, timeout and network. The envd plane (the Basic-auth user when
// one is named, the token of a secure sandbox, routed by the E2b-Sandbox-Id
// header or a 49983-<id>. host) serves
//
//   - /health (204 for a running sandbox, 502 otherwise, as E2B's edge);
//   - process.Process: Start and Connect (server streams of start, data,
//     end and keepalive events; a Start with pty gets a real terminal of
//     that size, its output as pty data), List, SendInput (stdin, or pty
//     input), SendSignal, CloseStdin and Update (a terminal's resize);
//   - filesystem.Filesystem: Stat, MakeDir (already_exists when it is),
//     Move, ListDir (to a depth), Remove and WatchDir (a server stream of
//     the changes inotify sees below the directory, named relative to it,
//     recursive when asked, with the entry when asked);
//   - GET /files?path= (404 for a missing file, 400 for a directory) and
//     POST /files (an octet-stream body, gzip-encoded or not, to path, or
//     multipart "file" parts, each to path or to its part's file name).
//
// Connect is spoken in its JSON form (the SDK's useBinaryFormat: false):
// unary calls are JSON POSTs whose errors are {code, message} with the
// Connect code's HTTP status; streams are envelopes (a flag byte, a 4-byte
// big-endian length, JSON) ended by an end-of-stream envelope that carries
// an error when there is one; a stream honours Keepalive-Ping-Interval and
// Connect-Timeout-Ms (deadline_exceeded ends the stream, not the process).
// The messages are written here from envd's published process.proto and
// filesystem.proto in proto3 JSON (int64 as strings, enums by name, zero
// values omitted). The framing is hand-written rather than served by
// connectrpc.com/connect: without protoc there are no generated message
// types, so the library would need a custom codec over these same
// hand-written structs and would add only the envelope, which is twenty
// lines here; and the fake must answer some paths the library would not let
// it (a raw 502 from the edge, a stream cut mid-way at a pause, a stream
// that never sends its end event) to test clients against them.
// Filesystem.CreateWatcher, GetWatcherEvents and RemoveWatcher and
// Process.StreamInput are not served: the JavaScript SDK does not call
// them.
//
// Commands run as real processes on this machine, each in its own process
// group (a terminal's in its own session), with the sandbox's scratch
// directory as HOME and default working directory. SendSignal signals the
// process alone, as envd does (its children live on).
//
// The sandbox's filesystem is the host's, with two mapped prefixes:
// /home/<user> (and relative paths, and ~) is the scratch home, and the
// journal directory /tmp/fountain is the scratch journal directory — for
// processes through the MANAGOAT_JOURNAL_DIR variable the journaling shim
// honours, and for the filesystem calls by rewriting the path — so
// concurrent sandboxes never share journals. Paths are reported in the
// sandbox's terms (/home/user/...), but a process sees the host's paths
// (pwd prints the scratch directory).
//
// It keeps E2B's behaviours that matter to a client: a sandbox's TTL
// auto-pauses it (or kills it without autoPause) when no heartbeat renews
// it; a pause stops its processes (SIGSTOP) and cuts their streams, a
// connect resumes them (SIGCONT); after a resume, processes started
// before the pause answer 404 to tag selectors while List still shows
// them (the quirk the pid fallback exists for); envd does not replay
// output to a reconnecting client. From E2B's public sources (e2b-dev/infra
// API handlers, envd, E2B's SDK) it also keeps: envd answers a host
// 49983-<id>.<domain> only under its cluster's domain (Options.Domain),
// which create, connect and GET /sandboxes/{id} name with AnnounceDomain;
// a sandbox changing state (Transition) makes timeout, network and the
// envd proxy answer 409 while connect and pause wait (pause answers 409
// to a sandbox being killed or already paused), and the listing and GET
// /sandboxes/{id} show it as E2B's do (Transition says how); a resume
// takes Options.ResumeDelay, and a sandbox resuming is shown paused, joined
// by another connect, refused by envd (502) and, killed meanwhile, resumed
// all the same, as E2B's handlers do (Transition "resuming"); timeout and
// network answer 404 for a paused sandbox; TTLs are capped at the
// maximum instance length (Options.MaxInstanceLength), past which
// /timeout and connect answer 400, and a resume restarts startedAt; an
// unknown template or tag is a 404 on create, a malformed reference a
// 400; an old envd (Options.EnvdVersion) ignores Start's stdin field
// (< 0.3.0) and lacks CloseStdin (< 0.5.2); the metadata filter is decoded
// as the API decodes it. Faults can be injected: any status with any body
// and headers (a 429's Retry-After, 5xx), a delay or a stall before the
// answer, a stream that stalls after its start event, and a stream that
// ends without its end event.
package e2btest

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Options configure a Server. The zero value is ready.
type Options struct {
	// APIKey is the key the control plane accepts; default "e2b-test-key".
	APIKey string
	// User is the envd user; default "user". Requests naming another user
	// are refused with 401.
	User string
	// Second is how long one E2B second (of timeouts and keepalive
	// intervals) lasts in the fake; default one second. Tests shorten it to
	// see TTLs expire quickly.
	Second time.Duration
	// TTLCheck is how often expired sandboxes are paused or killed;
	// default Second/10, at least 5 ms.
	TTLCheck time.Duration
	// MaxPage caps the listing's page size; default 100.
	MaxPage int
	// Dir holds the sandboxes' scratch directories; default a temporary
	// directory removed by Close.
	Dir string
	// Domain is the cluster's sandbox domain, default "e2b.app". envd
	// answers a request addressed by host (49983-<id>.<domain>) only when
	// <domain> is this one: a client that derives the domain from
	// anywhere else reaches no sandbox (502).
	Domain string
	// AnnounceDomain makes create, connect and GET /sandboxes/{id} name
	// Domain in their answers' "domain", as a team on its own cluster
	// sees; without it they answer "domain": null, as the default cluster
	// does, and the client must know the domain (E2B_DOMAIN).
	AnnounceDomain bool
	// MaxInstanceLength is the plan's maximum instance length in E2B
	// seconds (0: none). Every TTL is capped at startedAt plus it, and once
	// it has passed, POST /timeout and a connect of the running sandbox
	// answer 400 "Max instance length exceeded" (KeepAliveFor in e2b-dev/
	// infra packages/api/internal/orchestrator/keep_alive.go); a resume
	// (connect of a paused sandbox) restarts startedAt.
	MaxInstanceLength int
	// ResumeDelay is how long a resume (a connect of a paused sandbox)
	// takes; default none. Meanwhile the sandbox is resuming, as E2B
	// shows it (see Transition).
	ResumeDelay time.Duration
	// EnvdVersion is the envd version every sandbox reports, default
	// "0.6.13". Below 0.3.0 envd ignores Start's stdin field (stdin is
	// always open); below 0.5.2 it has no CloseStdin (Connect
	// unimplemented, HTTP 404).
	EnvdVersion string
	// Templates are the template ids and aliases create accepts, and their
	// tags as "<id>:<tag>"; default "base". Any other is answered as E2B
	// does (see checkTemplate): 404 "template '<id>' not found", 404 "tag
	// '<tag>' does not exist for template '<id>'", or 400 "Invalid template
	// reference" for a malformed one.
	Templates []string
	// Generation is which generation of E2B's sandbox routes the fake
	// plays; default V2, the current service.
	Generation Generation
}

// Generation names a generation of E2B's control plane.
type Generation string

// The generations.
const (
	// V2 is the current service, as e2b@2.51.0 speaks to it: create is
	// POST /v2/sandboxes (NewSandboxV2: timeout defaults to 300 s and the
	// sandbox is always secure, so envd wants its envdAccessToken in
	// X-Access-Token) and connect is POST /v2/sandboxes/{id}/connect
	// (ConnectSandboxV2: no field required, timeout defaults to 300 s).
	// The deprecated v1 routes are still served, as E2B still serves them.
	V2 Generation = "v2"
	// V1 is a service from before the v2 routes, which a user may still
	// meet (a self-hosted or older cluster): create is POST /sandboxes
	// (timeout defaults to 15 s; secure only when asked), connect is POST
	// /sandboxes/{id}/connect with a required timeout, and the v2 create
	// and connect routes answer 404.
	V1 Generation = "v1"
)

// Plane names one of the two planes, for Fault and Request.
type Plane string

// The planes.
const (
	API  Plane = "api"
	Envd Plane = "envd"
)

// Fault is an injected failure. It matches requests by plane, method and
// path prefix (empty matches any) and applies to the next Times of them
// (0 means 1, negative means every one).
type Fault struct {
	Plane  Plane
	Method string
	Path   string
	Times  int

	// Status answers the request with this status and Body.
	Status int
	Body   string
	// Stall holds the request without an answer until the client gives up.
	Stall bool
	// StallStream (Start only) sends the start event, then nothing at all,
	// not even keepalives.
	StallStream bool
	// NoEnd (Start only) runs the process but ends the stream without its
	// end event (a clean end-of-stream envelope follows the output).
	NoEnd bool
	// Match, when set, limits the fault to requests whose body contains it
	// (e.g. a word of the command a Start runs).
	Match string
	// Header is set on a Status answer (e.g. a 429's Retry-After).
	Header map[string]string
	// Delay holds the request this long (or until the client gives up)
	// before it is answered, by Status or by the server, as a slow pause or
	// resume of a large sandbox is.
	Delay time.Duration
	// Hold, when set, holds the request until it is closed (or the client
	// gives up), then answers it as Delay does; Held counts the requests
	// held meanwhile.
	Hold chan struct{}
}

// Request is one request the server saw.
type Request struct {
	Plane     Plane
	Method    string
	Path      string
	Query     string
	SandboxID string // envd requests
	Body      string // control-plane requests
}

// Server is the fake. Close it when done.
type Server struct {
	// APIServer and EnvdServer are the two planes.
	APIServer, EnvdServer *httptest.Server

	opts    Options
	rootDir string
	ownDir  bool

	mu        sync.Mutex
	sandboxes map[string]*sbx
	faults    []*Fault
	held      int
	requests  []Request
	closing   chan struct{}
	closed    bool
	wg        sync.WaitGroup
}

// NewServer starts a fake with both planes on loopback.
func NewServer(opts Options) *Server {
	if opts.APIKey == "" {
		opts.APIKey = "e2b-test-key"
	}
	if opts.User == "" {
		opts.User = "user"
	}
	if opts.Second <= 0 {
		opts.Second = time.Second
	}
	if opts.TTLCheck <= 0 {
		opts.TTLCheck = max(opts.Second/10, 5*time.Millisecond)
	}
	if opts.MaxPage <= 0 {
		opts.MaxPage = 100
	}
	if opts.Domain == "" {
		opts.Domain = "e2b.app"
	}
	if opts.EnvdVersion == "" {
		opts.EnvdVersion = "0.6.13"
	}
	if len(opts.Templates) == 0 {
		opts.Templates = []string{"base"}
	}
	if opts.Generation == "" {
		opts.Generation = V2
	}
	s := &Server{opts: opts, sandboxes: map[string]*sbx{}, closing: make(chan struct{})}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "e2btest-")
		if err != nil {
			panic("e2btest: " + err.Error())
		}
		s.rootDir, s.ownDir = d, true
	} else {
		s.rootDir = opts.Dir
	}
	s.APIServer = httptest.NewServer(http.HandlerFunc(s.serveAPI))
	s.EnvdServer = httptest.NewServer(http.HandlerFunc(s.serveEnvd))
	s.wg.Add(1)
	go s.ttlLoop()
	return s
}

// APIKey is the accepted X-API-Key.
func (s *Server) APIKey() string { return s.opts.APIKey }

// APIURL is the control plane's base URL (E2B_API_URL).
func (s *Server) APIURL() string { return s.APIServer.URL }

// SandboxURL is envd's single endpoint, routed by the E2b-Sandbox-Id header
// (E2B_SANDBOX_URL).
func (s *Server) SandboxURL() string { return s.EnvdServer.URL }

// User is the envd user.
func (s *Server) User() string { return s.opts.User }

// Close kills every process, stops both planes and removes the scratch
// directories it made.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	close(s.closing)
	for _, sb := range s.sandboxes {
		sb.killAll()
	}
	s.mu.Unlock()
	s.APIServer.Close()
	s.EnvdServer.Close()
	s.wg.Wait()
	if s.ownDir {
		_ = os.RemoveAll(s.rootDir)
	}
}

// Inject adds a fault.
func (s *Server) Inject(f Fault) {
	if f.Times == 0 {
		f.Times = 1
	}
	s.mu.Lock()
	s.faults = append(s.faults, &f)
	s.mu.Unlock()
}

// ClearFaults removes every pending fault.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	s.faults = nil
	s.mu.Unlock()
}

func (s *Server) takeFault(plane Plane, r *http.Request, body []byte) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if (f.Plane == "" || f.Plane == plane) && (f.Method == "" || f.Method == r.Method) &&
			strings.HasPrefix(r.URL.Path, f.Path) && strings.Contains(string(body), f.Match) {
			if f.Times > 0 {
				f.Times--
				if f.Times == 0 {
					s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
				}
			}
			return f
		}
	}
	return nil
}

// applyFault answers r per f; it reports whether the request is handled.
func (s *Server) applyFault(w http.ResponseWriter, r *http.Request, f *Fault) bool {
	if f != nil && f.Hold != nil {
		s.mu.Lock()
		s.held++
		s.mu.Unlock()
		var gone bool
		select {
		case <-f.Hold:
		case <-r.Context().Done():
			gone = true
		case <-s.closing:
			gone = true
		}
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
		if gone {
			return true
		}
	}
	if f != nil && f.Delay > 0 {
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			return true
		case <-s.closing:
			return true
		}
	}
	switch {
	case f == nil:
		return false
	case f.Stall:
		select {
		case <-r.Context().Done():
		case <-s.closing:
		}
		return true
	case f.Status != 0:
		for k, v := range f.Header {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.Status)
		_, _ = w.Write([]byte(f.Body))
		return true
	}
	return false
}

// Held is the number of requests a Fault's Hold is holding now: a client
// that gave one up is no longer counted.
func (s *Server) Held() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// Requests returns the requests seen so far.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Request(nil), s.requests...)
}

// ResetRequests forgets the requests seen so far.
func (s *Server) ResetRequests() {
	s.mu.Lock()
	s.requests = nil
	s.mu.Unlock()
}

func (s *Server) record(r Request) {
	s.mu.Lock()
	s.requests = append(s.requests, r)
	s.mu.Unlock()
}

// Sandbox is the state of one fake sandbox.
type Sandbox struct {
	ID        string
	State     string // "running" or "paused"
	Metadata  map[string]string
	AutoPause bool
	EndAt     time.Time
	// Network is the last applied egress configuration (nil if none).
	Network *Network
	// Processes is the number of live processes.
	Processes int
	// Dir is the sandbox's scratch directory.
	Dir string
	// Transition is the state change under way ("" for none): pausing,
	// snapshotting, killing or resuming.
	Transition string
	// Resumes is the number of resumes the sandbox went through.
	Resumes int
}

// Network is a sandbox's egress configuration.
type Network struct {
	AllowOut []string `json:"allowOut"`
	DenyOut  []string `json:"denyOut"`
}

// Sandboxes lists every sandbox, oldest first.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Sandbox
	for _, sb := range s.sortedLocked() {
		out = append(out, sb.snapshot())
	}
	return out
}

// Lookup returns the sandbox with id.
func (s *Server) Lookup(id string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return Sandbox{}, false
	}
	return sb.snapshot(), true
}

// CreateSandbox makes a running sandbox directly (as another client
// would), with the given metadata and TTL in E2B seconds, and returns its
// id. It lets a test stage duplicates and foreign sandboxes.
func (s *Server) CreateSandbox(metadata map[string]string, timeout int, autoPause bool) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.createLocked("base", metadata, timeout, autoPause).id
}

// Pause pauses a sandbox as its TTL would.
func (s *Server) Pause(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok || sb.state != "running" {
		return false
	}
	sb.pause()
	return true
}

// Resume resumes a paused sandbox as a connect would (its startedAt
// restarts).
func (s *Server) Resume(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok || sb.state != "paused" {
		return false
	}
	sb.resume()
	sb.resumes++
	sb.startedAt = time.Now()
	sb.endAt = s.capEnd(sb, sb.startedAt.Add(s.secs(300)))
	return true
}

// Kill removes a sandbox as if it had been killed elsewhere.
func (s *Server) Kill(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked(id)
}

func (s *Server) killLocked(id string) bool {
	sb, ok := s.sandboxes[id]
	if !ok {
		return false
	}
	sb.killAll()
	delete(s.sandboxes, id)
	return true
}

func (s *Server) sortedLocked() []*sbx {
	all := make([]*sbx, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		all = append(all, sb)
	}
	sort.Slice(all, func(i, j int) bool {
		if !all[i].startedAt.Equal(all[j].startedAt) {
			return all[i].startedAt.Before(all[j].startedAt)
		}
		return all[i].id < all[j].id
	})
	return all
}

func (s *Server) ttlLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.TTLCheck)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case now := <-t.C:
			s.mu.Lock()
			s.endTransitionsLocked(now)
			for id, sb := range s.sandboxes {
				if sb.state != "running" || sb.transition != "" || now.Before(sb.endAt) {
					continue
				}
				if sb.autoPause {
					sb.pause()
				} else {
					s.killLocked(id)
				}
			}
			s.mu.Unlock()
		}
	}
}

func (s *Server) secs(n int) time.Duration { return time.Duration(n) * s.opts.Second }

func newID() string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return "i" + hex.EncodeToString(b[:])
}

// createLocked makes a sandbox; s.mu is held.
func (s *Server) createLocked(template string, metadata map[string]string, timeout int, autoPause bool) *sbx {
	id := newID()
	dir := filepath.Join(s.rootDir, id)
	home := filepath.Join(dir, "home")
	journal := filepath.Join(dir, "journal")
	_ = os.MkdirAll(home, 0o755)
	_ = os.MkdirAll(journal, 0o755)
	md := map[string]string{}
	for k, v := range metadata {
		md[k] = v
	}
	now := time.Now()
	sb := &sbx{srv: s, id: id, template: template, state: "running", startedAt: now, envdVersion: s.opts.EnvdVersion,
		endAt: now.Add(s.secs(timeout)), autoPause: autoPause, metadata: md,
		dir: dir, home: home, journal: journal, procs: map[uint32]*proc{}}
	sb.endAt = s.capEnd(sb, sb.endAt)
	s.sandboxes[id] = sb
	return sb
}

// capEnd bounds a TTL's end by the maximum instance length, as E2B does
// (the TTL is silently shortened).
func (s *Server) capEnd(sb *sbx, end time.Time) time.Time {
	if s.opts.MaxInstanceLength <= 0 {
		return end
	}
	if limit := sb.startedAt.Add(s.secs(s.opts.MaxInstanceLength)); end.After(limit) {
		return limit
	}
	return end
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

const stampLayout = "2006-01-02T15:04:05.000000000Z07:00"

// domainJSON is the "domain" of create, connect and detail answers.
func (s *Server) domainJSON() any {
	if s.opts.AnnounceDomain {
		return s.opts.Domain
	}
	return nil
}

// Domain is the cluster's sandbox domain (Options.Domain).
func (s *Server) Domain() string { return s.opts.Domain }

// detailJSON is GET /sandboxes/{id}, as E2B's handler answers it: a live
// sandbox (in its store: running, pausing, snapshotting) with its
// cluster's domain, a pausing one shown paused, a snapshotting one running;
// one being killed is not found; a paused one comes from its snapshot and
// names no domain. ok is false for "not found".
func (sb *sbx) detailJSON() (m map[string]any, ok bool) {
	if sb.transition == "killing" {
		return nil, false
	}
	state := sb.state
	if sb.transition == "pausing" {
		state = "paused"
	}
	m = sb.listedJSON(state)
	if sb.accessToken != "" {
		m["envdAccessToken"] = sb.accessToken
	}
	m["domain"] = nil
	if sb.state == "running" {
		m["domain"] = sb.srv.domainJSON()
	}
	return m, true
}

// listedState is how the v2 listing shows sb, as E2B's does: it lists the
// live sandboxes that are running or pausing (a pausing one as paused, "for
// the user it behaves like a paused sandbox") and the paused ones from their
// snapshot records. A sandbox being snapshotted or killed is in neither
// set: it is listed paused from the snapshot an earlier pause left, or not
// at all (e2b-dev/infra packages/api/internal/handlers/sandboxes_list.go).
func (sb *sbx) listedState() (string, bool) {
	switch {
	case sb.transition == "":
		return sb.state, true
	case sb.transition == "pausing":
		return "paused", true
	case sb.snapshotted:
		return "paused", true
	}
	return "", false
}

// listedJSON is one element of the v2 listing, which has no domain, in
// the given state.
func (sb *sbx) listedJSON(state string) map[string]any {
	return map[string]any{
		"templateID":  sb.template,
		"sandboxID":   sb.id,
		"clientID":    "fake",
		"startedAt":   sb.startedAt.UTC().Format(stampLayout),
		"endAt":       sb.endAt.UTC().Format(stampLayout),
		"cpuCount":    2,
		"memoryMB":    512,
		"diskSizeMB":  1024,
		"metadata":    sb.metadata,
		"state":       state,
		"envdVersion": sb.envdVersion,
	}
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	body := readBody(r)
	s.record(Request{Plane: API, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, Body: string(body)})
	if s.applyFault(w, r, s.takeFault(API, r, body)) {
		return
	}
	if r.Header.Get("X-API-Key") != s.opts.APIKey {
		apiError(w, http.StatusUnauthorized, "Invalid API key")
		return
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/sandboxes":
		s.apiCreate(w, body, V1)
	case r.Method == http.MethodPost && r.URL.Path == "/v2/sandboxes" && s.opts.Generation == V2:
		s.apiCreate(w, body, V2)
	case r.Method == http.MethodGet && r.URL.Path == "/v2/sandboxes":
		s.apiList(w, r)
	case len(parts) == 4 && parts[0] == "v2" && parts[1] == "sandboxes" && parts[3] == "connect" &&
		r.Method == http.MethodPost && s.opts.Generation == V2:
		// ConnectSandboxV2 requires no field: a missing timeout is 300 s.
		var t map[string]any
		if len(bytes.TrimSpace(body)) == 0 {
			t = map[string]any{}
		} else if err := json.Unmarshal(body, &t); err != nil || t == nil {
			apiError(w, http.StatusBadRequest, "invalid request body")
			return
		}
		if t["timeout"] == nil {
			t["timeout"] = 300
		}
		body, _ = json.Marshal(t)
		s.apiSandbox(w, r, parts[2], "connect", body)
	case len(parts) == 2 && parts[0] == "sandboxes":
		s.apiSandbox(w, r, parts[1], "", body)
	case len(parts) == 3 && parts[0] == "sandboxes":
		s.apiSandbox(w, r, parts[1], parts[2], body)
	default:
		apiError(w, http.StatusNotFound, "no such route")
	}
}

func readBody(r *http.Request) []byte {
	if r.Body == nil {
		return nil
	}
	var b []byte
	buf := make([]byte, 32<<10)
	for len(b) < 64<<20 {
		n, err := r.Body.Read(buf)
		b = append(b, buf[:n]...)
		if err != nil {
			break
		}
	}
	return b
}

func (s *Server) apiCreate(w http.ResponseWriter, body []byte, gen Generation) {
	var req struct {
		TemplateID string            `json:"templateID"`
		Timeout    *int              `json:"timeout"`
		AutoPause  bool              `json:"autoPause"`
		Metadata   map[string]string `json:"metadata"`
		EnvVars    map[string]string `json:"envVars"`
		Secure     bool              `json:"secure"`
	}
	if err := json.Unmarshal(body, &req); err != nil || req.TemplateID == "" {
		apiError(w, http.StatusBadRequest, "templateID is required")
		return
	}
	if status, msg := s.checkTemplate(req.TemplateID); status != 0 {
		apiError(w, status, msg)
		return
	}
	timeout := 15
	if gen == V2 {
		timeout = 300
	}
	if req.Timeout != nil {
		timeout = *req.Timeout
	}
	if timeout < 1 && gen == V2 {
		apiError(w, http.StatusBadRequest, "timeout must be at least 1")
		return
	}
	s.mu.Lock()
	sb := s.createLocked(req.TemplateID, req.Metadata, timeout, req.AutoPause)
	sb.envVars = req.EnvVars
	if gen == V2 || req.Secure {
		sb.accessToken = newID()
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusCreated, sb.startedJSON())
}

// startedJSON is the answer of create and connect (E2B's Sandbox schema).
func (sb *sbx) startedJSON() map[string]any {
	m := map[string]any{
		"templateID": sb.template, "sandboxID": sb.id, "clientID": "fake", "envdVersion": sb.envdVersion,
		"domain": sb.srv.domainJSON(), "trafficAccessToken": nil,
	}
	if sb.accessToken != "" {
		m["envdAccessToken"] = sb.accessToken
	}
	return m
}

var (
	templateIDRegexp  = regexp.MustCompile(`^[a-z0-9-_]+$`)
	templateTagRegexp = regexp.MustCompile(`^[a-z0-9-_.]+$`)
)

// checkTemplate answers a create's template reference (<template>[:<tag>])
// as E2B does (ParseName in e2b-dev/infra packages/shared/pkg/id and the
// template cache's errors): a malformed reference is 400 "Invalid template
// reference", an unknown template 404 "template '<id>' not found", an
// unknown tag of a known one 404 "tag '<tag>' does not exist for template
// '<id>'"; the tag "default" (any case) is the template itself. It
// returns status 0 for a template it knows.
func (s *Server) checkTemplate(ref string) (int, string) {
	name, tag, hasTag := strings.Cut(strings.TrimSpace(ref), ":")
	name = strings.ToLower(strings.TrimSpace(name))
	if !templateIDRegexp.MatchString(name) {
		return http.StatusBadRequest, "Invalid template reference: invalid template ID: " + name
	}
	if hasTag {
		tag = strings.ToLower(strings.TrimSpace(tag))
		if !templateTagRegexp.MatchString(tag) {
			return http.StatusBadRequest, "Invalid template reference: invalid tag: " + tag
		}
	}
	if !slices.Contains(s.opts.Templates, name) {
		return http.StatusNotFound, "template '" + name + "' not found"
	}
	if hasTag && tag != "default" && !slices.Contains(s.opts.Templates, name+":"+tag) {
		return http.StatusNotFound, "tag '" + tag + "' does not exist for template '" + name + "'"
	}
	return 0, ""
}

func (s *Server) apiList(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	states := map[string]bool{"running": true, "paused": true}
	if st := q.Get("state"); st != "" {
		states = map[string]bool{}
		for _, x := range strings.Split(st, ",") {
			states[x] = true
		}
	}
	var want map[string][]string
	if q.Has("metadata") {
		parsed, err := parseFilters(q.Get("metadata"))
		if err != nil {
			apiError(w, http.StatusBadRequest, "error parsing metadata: "+err.Error())
			return
		}
		want = parsed
	}
	limit := s.opts.MaxPage
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			apiError(w, http.StatusBadRequest, "limit must be 1..100")
			return
		}
		limit = min(n, limit)
	}
	offset := 0
	if t := q.Get("nextToken"); t != "" {
		b, err := base64.RawURLEncoding.DecodeString(t)
		n, err2 := strconv.Atoi(string(b))
		if err != nil || err2 != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "bad nextToken")
			return
		}
		offset = n
	}
	s.mu.Lock()
	all := s.sortedLocked()
	var match []map[string]any
	// Newest first, as E2B lists by default.
	for i := len(all) - 1; i >= 0; i-- {
		sb := all[i]
		state, listed := sb.listedState()
		if !listed || !states[state] || !sb.matches(want) {
			continue
		}
		match = append(match, sb.listedJSON(state))
	}
	s.mu.Unlock()
	if offset > len(match) {
		offset = len(match)
	}
	page := match[offset:]
	if len(page) > limit {
		page = page[:limit]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.Itoa(offset+limit))))
	}
	if page == nil {
		page = []map[string]any{}
	}
	writeJSON(w, http.StatusOK, page)
}

func (sb *sbx) matches(want map[string][]string) bool {
	for k, vs := range want {
		for _, v := range vs {
			if sb.metadata[k] != v {
				return false
			}
		}
	}
	return true
}

// changingStateMsg is E2B's 409 message for a sandbox changing state.
func changingStateMsg(id, state string) string {
	switch state {
	case "killing":
		return "Sandbox \"" + id + "\" is being killed"
	case "pausing":
		return "Sandbox \"" + id + "\" is being paused"
	case "snapshotting":
		return "Sandbox \"" + id + "\" is being snapshotted"
	}
	return "Sandbox \"" + id + "\" is in " + state + " state"
}

// Transition puts a sandbox into a state change (pausing, snapshotting,
// killing, resuming) for d, after which it is in state to ("paused",
// "running", or "" for removed).
//
// A paused sandbox "resuming" (to "running", as a connect from elsewhere
// resumes it) is, as E2B shows it: not yet in the store of live sandboxes,
// so the listing and GET /sandboxes/{id} show it paused from its snapshot
// record; a connect joins the resume under way (the start reservation,
// Reserve in e2b-dev/infra packages/api/internal/orchestrator/
// create_instance.go) and answers 201 when it completes, without a second
// resume; pause answers 409 "already paused" (it finds the snapshot);
// timeout and network 404; envd 502 (not in the proxy's catalog yet); and
// a kill finds no live sandbox, deletes the snapshot record and answers
// 204 while the resume goes on to a running sandbox (sandbox_kill.go).
// When it completes, startedAt restarts.
//
// For the other changes, as E2B does: timeout and network answer 409;
// pause answers 409 to a sandbox being killed and otherwise waits for the
// change to end (joining a pause in progress, pausing after a snapshot);
// connect answers 409 to a sandbox being killed and otherwise waits;
// envd's proxy answers 409; the listing shows a pausing sandbox paused,
// and one being snapshotted or killed paused if it was ever paused (from
// its snapshot record), else not at all; GET /sandboxes/{id} shows a
// pausing one paused, a snapshotting one running, and one being killed
// not found.
func (s *Server) Transition(id, state, to string, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	if !ok {
		return false
	}
	if state == "resuming" && (sb.state != "paused" || sb.transition != "" || to != "running") {
		return false
	}
	if state == "resuming" {
		sb.resumeTimeout = 300
	}
	sb.transition, sb.transitionTo, sb.transitionEnd = state, to, time.Now().Add(d)
	if to == "paused" {
		for _, p := range sb.procs {
			_ = syscall.Kill(-p.pid(), syscall.SIGSTOP)
		}
	}
	return true
}

// endTransitionsLocked completes the state changes whose time is up.
func (s *Server) endTransitionsLocked(now time.Time) {
	for id, sb := range s.sandboxes {
		if sb.transition == "" || now.Before(sb.transitionEnd) {
			continue
		}
		was := sb.transition
		sb.transition = ""
		switch sb.transitionTo {
		case "":
			s.killLocked(id)
		case "paused":
			sb.pause()
		case "running":
			sb.resume()
			if was == "resuming" {
				// A resume starts a new instance: startedAt (and the clock
				// of the maximum instance length) restarts.
				sb.resumes++
				sb.startedAt = now
				sb.endAt = s.capEnd(sb, now.Add(s.secs(sb.resumeTimeout)))
			}
		}
	}
}

func (s *Server) apiSandbox(w http.ResponseWriter, r *http.Request, id, action string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[id]
	joined := false // a pause that waited out a pause in progress
	if ok && sb.transition == "resuming" {
		switch {
		case action == "pause":
			apiError(w, http.StatusConflict, "Error pausing sandbox - sandbox '"+id+"' is already paused")
			return
		case action == "timeout" || action == "network":
			apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
			return
		case action == "" && r.Method == http.MethodDelete:
			// No live sandbox to kill: the snapshot record goes, the
			// resume under way goes on.
			if !sb.snapshotted {
				apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
				return
			}
			sb.snapshotted = false
			w.WriteHeader(http.StatusNoContent)
			return
		case action == "" && r.Method == http.MethodGet && !sb.snapshotted:
			apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
			return
		case action == "connect" && r.Method == http.MethodPost && !sb.snapshotted:
			apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
			return
		}
	}
	if ok && sb.transition != "" && sb.transition != "killing" && r.Method == http.MethodPost &&
		(action == "connect" || action == "pause") {
		// Connect and pause wait for the change to end, as E2B's handlers
		// do (a pause joins a pause in progress; one that meets a snapshot
		// pauses after it).
		joined = action == "pause" && sb.transition == "pausing" ||
			action == "connect" && sb.transition == "resuming"
		if sb, ok = s.awaitTransition(r, id); r.Context().Err() != nil || s.closed {
			return
		}
	}
	if !ok {
		apiError(w, http.StatusNotFound, "sandbox \""+id+"\" not found")
		return
	}
	if sb.transition != "" {
		switch action {
		case "pause":
			apiError(w, http.StatusConflict, "Sandbox '"+id+"' cannot be paused while in '"+sb.transition+"' state")
			return
		case "timeout", "network", "connect":
			apiError(w, http.StatusConflict, changingStateMsg(id, sb.transition))
			return
		}
	}
	if sb.state == "paused" && (action == "timeout" || action == "network") {
		// A paused sandbox is no longer in E2B's store of live ones: these
		// answer as for an unknown sandbox.
		apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
		return
	}
	if joined && action == "pause" && sb.state == "paused" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if joined && action == "connect" && sb.state == "running" {
		// A connect that joined a resume answers as the resume does.
		writeJSON(w, http.StatusCreated, sb.startedJSON())
		return
	}
	var t struct {
		Timeout *int `json:"timeout"`
	}
	switch {
	case action == "" && r.Method == http.MethodGet:
		m, ok := sb.detailJSON()
		if !ok {
			apiError(w, http.StatusNotFound, "Sandbox \""+id+"\" doesn't exist or you don't have access to it")
			return
		}
		writeJSON(w, http.StatusOK, m)
	case action == "" && r.Method == http.MethodDelete:
		s.killLocked(id)
		w.WriteHeader(http.StatusNoContent)
	case action == "pause" && r.Method == http.MethodPost:
		if sb.state == "paused" {
			apiError(w, http.StatusConflict, "Error pausing sandbox - sandbox '"+id+"' is already paused")
			return
		}
		sb.pause()
		w.WriteHeader(http.StatusNoContent)
	case action == "connect" && r.Method == http.MethodPost:
		if json.Unmarshal(body, &t) != nil || t.Timeout == nil {
			apiError(w, http.StatusBadRequest, "timeout is required")
			return
		}
		now := time.Now()
		status := http.StatusOK
		if sb.state == "paused" && s.opts.ResumeDelay > 0 {
			// The resume takes a while; connects meanwhile join it.
			sb.resumeTimeout = *t.Timeout
			sb.transition, sb.transitionTo, sb.transitionEnd = "resuming", "running", now.Add(s.opts.ResumeDelay)
			if sb, ok = s.awaitTransition(r, id); r.Context().Err() != nil || s.closed {
				return // the resume goes on without its caller
			}
			if !ok || sb.state != "running" {
				apiError(w, http.StatusInternalServerError, "Error resuming sandbox")
				return
			}
			writeJSON(w, http.StatusCreated, sb.startedJSON())
			return
		}
		if sb.state == "paused" {
			// A resume starts a new instance: startedAt (and the clock of
			// the maximum instance length) restarts.
			sb.resume()
			sb.resumes++
			sb.startedAt = now
			sb.endAt = s.capEnd(sb, now.Add(s.secs(*t.Timeout)))
			status = http.StatusCreated
		} else if s.opts.MaxInstanceLength > 0 && now.Sub(sb.startedAt) > s.secs(s.opts.MaxInstanceLength) {
			// Connect keeps a running sandbox alive as /timeout does, and
			// refuses past the maximum instance length the same way.
			apiError(w, http.StatusBadRequest, "Max instance length exceeded")
			return
		} else if end := s.capEnd(sb, now.Add(s.secs(*t.Timeout))); end.After(sb.endAt) {
			sb.endAt = end
		}
		writeJSON(w, status, sb.startedJSON())
	case action == "timeout" && r.Method == http.MethodPost:
		if json.Unmarshal(body, &t) != nil || t.Timeout == nil {
			apiError(w, http.StatusBadRequest, "timeout is required")
			return
		}
		now := time.Now()
		if s.opts.MaxInstanceLength > 0 && now.Sub(sb.startedAt) > s.secs(s.opts.MaxInstanceLength) {
			apiError(w, http.StatusBadRequest, "Max instance length exceeded")
			return
		}
		sb.endAt = s.capEnd(sb, now.Add(s.secs(*t.Timeout)))
		w.WriteHeader(http.StatusNoContent)
	case action == "network" && r.Method == http.MethodPut:
		var n Network
		if json.Unmarshal(body, &n) != nil {
			apiError(w, http.StatusBadRequest, "bad network config")
			return
		}
		sb.network = &n
		w.WriteHeader(http.StatusNoContent)
	default:
		apiError(w, http.StatusNotFound, "no such route")
	}
}

// parseFilters decodes a metadata filter as E2B's API does (parseFilters in
// e2b-dev/infra packages/api/internal/utils): the parameter's value (already
// decoded once as a query parameter) is unescaped whole, split on '&' and
// '=', and each key and value is unescaped again.
func parseFilters(query string) (map[string][]string, error) {
	query, err := url.QueryUnescape(query)
	if err != nil {
		return nil, errors.New("error when unescaping query")
	}
	out := map[string][]string{}
	for _, pair := range strings.Split(query, "&") {
		parts := strings.Split(pair, "=")
		if len(parts) != 2 {
			return nil, errors.New("invalid key value pair in query")
		}
		k, err1 := url.QueryUnescape(parts[0])
		v, err2 := url.QueryUnescape(parts[1])
		if err1 != nil || err2 != nil {
			return nil, errors.New("error when unescaping key or value")
		}
		out[k] = []string{v}
	}
	return out, nil
}

// awaitTransition waits, with s.mu held (released while it waits), until
// sandbox id is in no transition, is gone, the request ends or the server
// closes; it returns the sandbox as it then is.
func (s *Server) awaitTransition(r *http.Request, id string) (*sbx, bool) {
	sb, ok := s.sandboxes[id]
	for ok && sb.transition != "" {
		s.mu.Unlock()
		select {
		case <-r.Context().Done():
		case <-s.closing:
		case <-time.After(s.opts.TTLCheck):
		}
		s.mu.Lock()
		if r.Context().Err() != nil || s.closed {
			return sb, ok
		}
		sb, ok = s.sandboxes[id]
	}
	return sb, ok
}
