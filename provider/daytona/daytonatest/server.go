// Package daytonatest is an httptest fake of Daytona's control plane and of
// the toolbox (the in-sandbox REST API), faithful enough to run the daytona
// provider, and the conformance suite, against it.
//
// Every sandbox gets a scratch directory of its own under the server's
// root: its home (the processes' working directory and HOME) and its tmp
// (their TMPDIR). Processes are real: /process/execute pipes its command
// into a shell's stdin, as daemon v0.190.0 does (SplitExecute: split it
// the way older daemons do — no shell, spaces split, quotes toggle, no
// escapes — and run it directly); a session command runs under /bin/sh, as
// the daemon's session shell does (Server.Shell changes that), in its own
// process group, with stdout and stderr multiplexed into a server-side
// journal with the 3-byte markers 01 01 01 and 02 02 02, served whole on
// every GET …/logs. Because processes run with TMPDIR inside the scratch
// directory, the provider's shims — whose default base directory is
// "${TMPDIR:-/tmp}/managoat" — land in that sandbox's scratch tmp without
// any path rewriting: the fake interprets no command shapes, it runs them.
//
// The processes are not isolated: they see the host's file system. The file
// endpoints confine themselves to the server's root: a relative path is
// taken from the sandbox's home, and an absolute path outside Root() is
// refused with 403.
//
// Behaviour of Daytona's public release v0.190.0 that the fake reproduces,
// so that an adapter that gets it wrong fails against it:
//
//   - A session command's log is labelled line by line, as the daemon's
//     wrapper does with a shell read loop (apps/daemon
//     pkg/session/execute.go): nothing of a line shows before its newline,
//     a final partial line gains one, NUL bytes are dropped. The markers
//     are kept only for a request with X-Daytona-Split-Output: true
//     (pkg/session/common.go, IsCombinedOutput, for a client without an SDK
//     version header); otherwise they are stripped and stdout and stderr
//     arrive merged.
//   - An async session command's stdin stays open (never EOF) until the
//     command ends, as the wrapper's holder loop keeps it
//     (pkg/session/execute.go); a sync one's is at EOF.
//   - Deleting a session ends its processes; Sessions counts them.
//   - A single file uploads (query path, field file) at POST /files/upload
//     on the public daemon (Generation Daemon0190), where upload-v2 is
//     unknown, and at POST /files/upload-v2 on the current service
//     (Current, the default), whose 0.218 toolbox client has no
//     /files/upload; an unknown toolbox route is a bare text 404.
//   - POST /sandbox and POST …/start hold the request while the sandbox
//     starts (up to Hold, 30 s by default); start, stop and delete answer
//     409 while a state change is in progress; a delete renames the
//     sandbox DESTROYED_<name>_<ms> with desiredState destroyed at once
//     (apps/api sandbox.entity.ts, getSoftDeleteUpdate), and it stays
//     listed, first in its former state (DestroyPending), then
//     "destroying" (DestroyDelay); meanwhile another delete or a start is
//     a 409, and its toolbox is gone (404) at once.
//   - Network settings follow the API's rules (networkBlockAll clears the
//     CIDR list, a CIDR list clears networkBlockAll, "" clears a list, at
//     most 10 domains of the API's shape); Egress reports what the runner
//     applies: block-all wins, and the domain list only with EnforceDomains
//     (the public-source runner ignores it).
//   - Each region (Target) has its own toolbox proxy URL; another region's
//     proxy does not know the sandbox (404). The proxy answers 401 for a
//     sandbox that does not exist, or no longer does (apps/proxy
//     pkg/proxy/auth.go): it checks the bearer's access first.
//   - Names with "www." are refused; GET /sandbox/paginated and
//     /sandbox/for-runner are other endpoints.
//
// What @daytonaio/sdk@0.218.0 sends is served on both generations (the
// sdk/daytona.mjs program, run by TestSDK, is the check): GET
// /process/session/{id}; a command's logs as JSON {output, stdout, stderr}
// when the request accepts application/json (the toolbox client asks with
// Accept: application/json,text/plain), and over a WebSocket with
// ?follow=true (the journal with its markers, in binary messages, closed
// normally once the command has ended); GET and DELETE /files?path=,
// POST /files/folder, GET /files/info, POST /files/move, POST
// /files/permissions (mode only: the fake cannot chown), GET
// /files/search (base names matching a glob), GET /files/find (lines
// containing a fixed string), POST /files/replace (a regular expression),
// multipart POST /files/bulk-upload (files[i].path and files[i].file) and
// POST /files/bulk-download (a multipart answer: a "file" part per path,
// or an "error" part with JSON {message, statusCode, code}); GET
// /sandbox/{id}/ports/{port}/preview-url, whose URL is the fake's preview
// proxy to that port on loopback, wanting the token in
// X-Daytona-Preview-Token; POST …/command/{id}/input (an async command's
// stdin), GET /user-home-dir and /work-dir (the sandbox's home), PUT
// /sandbox/{id}/labels, POST /sandbox/{id}/autostop|autoarchive|autodelete/{n}
// (stored, shown in the record, not acted on). The SDK's socket.io state events (GET
// /api/socket.io/) are refused with 404, so it polls. Code runs, PTYs,
// git, LSP and computer use are not served (a bare 404).
//
// Measured behaviour of a hosted daemon: session command records carry no
// exit code unless RecordExitCodes is set (v0.204.0); a stopped sandbox
// loses its sessions but keeps its disk. Older daemons' /process/execute
// splits its command on spaces without a shell (SplitExecute).
//
// Failures are injected with Inject: a status (429 with Retry-After-*
// headers, 5xx, …), a stall, a truncated body, or a short (prefix) answer.
package daytonatest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultAPIKey is the bearer token a new Server accepts.
const DefaultAPIKey = "daytonatest-key"

// Server is the fake. Its exported fields may be changed between requests.
type Server struct {
	// URL is the control-plane base, ending in /api (Config.APIURL).
	URL string
	// APIKey is the accepted bearer token.
	APIKey string
	// Shell runs session commands; zero means "sh".
	Shell string
	// RecordExitCodes makes session command records carry exitCode once the
	// command ended (older daemons); by default they carry none, as
	// measured on daemon v0.204.0, and the exit comes from the shim.
	RecordExitCodes bool
	// LegacyLogs serves journals as JSON {"stdout","stderr"} (older daemons).
	LegacyLogs bool
	// ProxyURLInRecord puts toolboxProxyUrl in sandbox records (default
	// true from New); when false the adapter must ask toolbox-proxy-url.
	ProxyURLInRecord bool
	// ConflictStatus answers a create of an existing name; zero means 409.
	ConflictStatus int
	// PageSize caps list pages below the asked limit; zero means no cap.
	PageSize int
	// Hold bounds how long POST /sandbox and POST …/start hold the request
	// while the sandbox is still starting (the API waits up to 30 s for
	// "started", sandbox.controller.ts waitForSandboxStarted, then answers
	// with the record as it is); zero means 30 s.
	Hold time.Duration
	// A deleted sandbox is renamed DESTROYED_<name>_<ms> with desiredState
	// "destroyed" at once (its name is free again, and a GET by name is
	// 404) but stays listed: DestroyPending long in the state it had (the
	// API only marks it pending; the runner has not begun), then
	// DestroyDelay long "destroying". Both are read when a record is
	// served.
	DestroyPending, DestroyDelay time.Duration
	// SplitExecute makes /process/execute split its command on spaces and
	// run it without a shell, as older daemons do; by default the command
	// is piped into the shell's stdin (apps/daemon
	// pkg/toolbox/process/execute.go at v0.190.0).
	SplitExecute bool
	// StartDelay keeps a started sandbox "starting" this long, and
	// StopDelay a stopped one "stopping" (start then answers 409).
	StartDelay, StopDelay time.Duration
	// Snapshots lists the registered snapshots; create with another is 400.
	Snapshots []string
	// Target is the region of sandboxes created without one; zero means
	// "us". Each region has its own toolbox proxy URL.
	Target string
	// EnforceDomains makes the runners enforce a sandbox's domainAllowList,
	// as the hosted service documents; zero models the public-source
	// runner, which stores the list and ignores it (see Egress).
	EnforceDomains bool
	// Generation is the toolbox's single-file upload route: Current
	// (POST /files/upload-v2, the zero value) or Daemon0190 (POST
	// /files/upload). Every other route is served by both.
	Generation Generation

	ts   *httptest.Server
	root string

	mu        sync.Mutex
	sandboxes map[string]*Sandbox // by name
	faults    []*rule
	requests  []string
	wg        sync.WaitGroup
	closed    bool
	shorts    atomic.Int64
}

// Sandbox is the fake's record of one sandbox.
type Sandbox struct {
	ID, Name, State string
	Target          string // the region
	ErrorReason     string
	Snapshot        string
	Labels          map[string]string
	Create          map[string]any   // the create request body, verbatim
	Policy          map[string]any   // the last network-settings body, verbatim
	Policies        []map[string]any // every network-settings body, in order
	// The stored network settings, as the API keeps them.
	NetworkBlockAll                   bool
	NetworkAllowList, DomainAllowList string
	dir                               string
	startedAt                         time.Time
	destroyedAt                       time.Time
	formerState                       string // the state a deleted sandbox had
	stoppedAt                         time.Time
	sessions                          map[string]*session
	sessionOrder                      []string
	procs                             map[*exec.Cmd]bool
	previews                          map[int]string // port → preview token
	intervals                         map[string]int // autoStopInterval, … in minutes
}

type session struct {
	id   string
	cmds []*command
}

type command struct {
	id, line string
	proc     *exec.Cmd
	mu       sync.Mutex
	journal  []byte
	pending  [2][]byte // a line not yet ended, per stream
	out      [2][]byte // the stdout and stderr bytes, for tests
	exit     *int
	done     chan struct{}
	stdin    *os.File // an async command's stdin, until it ends
}

// Fault is one injected failure.
type Fault struct {
	// Status, when set, is answered instead of the real response, with Body
	// (JSON; empty means a Daytona-shaped error) and Header.
	Status int
	Body   string
	Header http.Header
	// Stall delays the answer (the request's context still ends it).
	Stall time.Duration
	// Truncate sends the real answer's headers, claiming its full length,
	// then only half of the body, and drops the connection.
	Truncate bool
	// Short serves only a prefix of the answer, as a complete 200 — a read
	// that raced the writer. The n-th short answer of a server keeps
	// n/(n+1) of the body, so two short reads in a row never look alike.
	Short bool
}

type rule struct {
	method, substr string
	left           int
	f              Fault
}

// New starts a Server; Close stops it, kills its processes and removes its
// scratch root.
func New() (*Server, error) {
	root, err := os.MkdirTemp("", "daytonatest-*")
	if err != nil {
		return nil, err
	}
	root, _ = filepath.EvalSymlinks(root)
	s := &Server{APIKey: DefaultAPIKey, ProxyURLInRecord: true, root: root, sandboxes: map[string]*Sandbox{}}
	s.ts = httptest.NewServer(http.HandlerFunc(s.serve))
	s.URL = s.ts.URL + "/api"
	return s, nil
}

// Root is the scratch root holding every sandbox's directory.
func (s *Server) Root() string { return s.root }

// Client is an HTTP client for the server.
func (s *Server) Client() *http.Client { return s.ts.Client() }

// Close stops the server and every process it started, and removes Root.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, sb := range s.sandboxes {
		s.killLocked(sb)
	}
	s.mu.Unlock()
	s.ts.Close()
	s.wg.Wait()
	_ = os.RemoveAll(s.root)
}

// Inject makes the next times requests whose method is method ("" for any)
// and whose path contains substr fail with f. times < 0 means forever.
func (s *Server) Inject(method, substr string, times int, f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &rule{method: method, substr: substr, left: times, f: f})
}

// ClearFaults removes every injected failure.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// Requests returns "METHOD path" of every request so far.
func (s *Server) Requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

// Lookup returns a copy of the named sandbox's record.
func (s *Server) Lookup(name string) (Sandbox, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[name]
	if !ok {
		return Sandbox{}, false
	}
	c := *sb
	c.Policies = append([]map[string]any(nil), sb.Policies...)
	return c, true
}

// Sandboxes returns a copy of every sandbox's record, deleted ones
// (renamed DESTROYED_…) included, in no order.
func (s *Server) Sandboxes() []Sandbox {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Sandbox, 0, len(s.sandboxes))
	for _, sb := range s.sandboxes {
		c := *sb
		c.Policies = append([]map[string]any(nil), sb.Policies...)
		out = append(out, c)
	}
	return out
}

// Home is the named sandbox's home directory on the host ("" if unknown).
func (s *Server) Home(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[name]; ok {
		return filepath.Join(sb.dir, "home")
	}
	return ""
}

// SetState forces the named sandbox's state (and error reason), e.g.
// "error", "archived", "stopping". It reports whether the sandbox exists.
func (s *Server) SetState(name, state, errorReason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[name]
	if ok {
		sb.State, sb.ErrorReason = state, errorReason
	}
	return ok
}

// Journal returns the raw journal of a session's last command.
func (s *Server) Journal(name, sessionID string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.sandboxes[name]
	if sb == nil || sb.sessions[sessionID] == nil || len(sb.sessions[sessionID].cmds) == 0 {
		return nil
	}
	c := sb.sessions[sessionID].cmds[len(sb.sessions[sessionID].cmds)-1]
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.journal...)
}

// Processes counts the processes the server is running.
func (s *Server) Processes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sb := range s.sandboxes {
		n += len(sb.procs)
	}
	return n
}

// ---- HTTP plumbing ----

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func apiError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"statusCode": status, "message": msg, "error": http.StatusText(status)})
}

// faultWriter applies Truncate and Short to the real answer.
type faultWriter struct {
	http.ResponseWriter
	f      Fault
	shorts int64
	status int
	buf    bytes.Buffer
}

func (fw *faultWriter) WriteHeader(code int)        { fw.status = code }
func (fw *faultWriter) Write(b []byte) (int, error) { return fw.buf.Write(b) }

func (fw *faultWriter) flush() {
	body := fw.buf.Bytes()
	h := fw.ResponseWriter.Header()
	if fw.status == 0 {
		fw.status = http.StatusOK
	}
	switch {
	case fw.f.Truncate:
		h.Set("Content-Length", strconv.Itoa(len(body)))
		fw.ResponseWriter.WriteHeader(fw.status)
		_, _ = fw.ResponseWriter.Write(body[:len(body)/2])
		if f, ok := fw.ResponseWriter.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler)
	case fw.f.Short:
		n := int(fw.shorts)
		body = body[:len(body)*n/(n+1)]
		h.Set("Content-Length", strconv.Itoa(len(body)))
		fw.ResponseWriter.WriteHeader(fw.status)
		_, _ = fw.ResponseWriter.Write(body)
	default:
		fw.ResponseWriter.WriteHeader(fw.status)
		_, _ = fw.ResponseWriter.Write(body)
	}
}

func (s *Server) fault(r *http.Request) (Fault, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, r.Method+" "+r.URL.Path)
	for i, ru := range s.faults {
		if (ru.method == "" || ru.method == r.Method) && strings.Contains(r.URL.Path, ru.substr) {
			if ru.left > 0 {
				ru.left--
				if ru.left == 0 {
					s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
				}
			}
			return ru.f, true
		}
	}
	return Fault{}, false
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/api/socket.io") {
		// The SDK tries the API's socket.io state events first and polls
		// when they are refused; the fake has none.
		s.mu.Lock()
		s.requests = append(s.requests, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "Cannot GET "+r.URL.Path)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/preview/") {
		s.preview(w, r)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+s.APIKey {
		apiError(w, http.StatusUnauthorized, "Unauthorized")
		return
	}
	f, faulty := s.fault(r)
	if faulty {
		if f.Stall > 0 {
			t := time.NewTimer(f.Stall)
			select {
			case <-r.Context().Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		if f.Status != 0 {
			for k, v := range f.Header {
				w.Header()[k] = v
			}
			if f.Body != "" {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(f.Status)
				_, _ = io.WriteString(w, f.Body)
				return
			}
			apiError(w, f.Status, "injected failure")
			return
		}
		if f.Truncate || f.Short {
			fw := &faultWriter{ResponseWriter: w, f: f, shorts: s.shorts.Add(1)}
			s.route(fw, r)
			fw.flush()
			return
		}
	}
	s.route(w, r)
}

func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/api/sandbox"):
		s.controlPlane(w, r, strings.Trim(strings.TrimPrefix(p, "/api/sandbox"), "/"))
	case strings.HasPrefix(p, "/toolbox/"):
		rest := strings.TrimPrefix(p, "/toolbox/")
		id, sub, _ := strings.Cut(rest, "/")
		s.toolbox(w, r, defaultTarget, id, "/"+sub)
	case strings.Contains(p, "/toolbox/"):
		region, rest, _ := strings.Cut(strings.TrimPrefix(p, "/"), "/toolbox/")
		id, sub, _ := strings.Cut(rest, "/")
		s.toolbox(w, r, region, id, "/"+sub)
	default:
		apiError(w, http.StatusNotFound, "no route "+p)
	}
}

// defaultTarget is the region of sandboxes created while Target is zero;
// its toolbox proxy is <URL>/toolbox/, another region's <URL>/<region>/toolbox/.
const defaultTarget = "us"

// proxyURL is a region's toolbox proxy URL (the API's is per region:
// sandbox.service.ts, resolveToolboxProxyUrl).
func (s *Server) proxyURL(region string) string {
	if region == defaultTarget || region == "" {
		return s.ts.URL + "/toolbox/"
	}
	return s.ts.URL + "/" + region + "/toolbox/"
}

// ---- control plane ----

func (s *Server) controlPlane(w http.ResponseWriter, r *http.Request, rest string) {
	parts := []string{}
	if rest != "" {
		parts = strings.Split(rest, "/")
	}
	switch {
	case len(parts) == 0 && r.Method == http.MethodPost:
		s.create(w, r)
	case len(parts) == 0 && r.Method == http.MethodGet:
		s.list(w, r)
	case len(parts) == 1 && r.Method == http.MethodGet && strings.EqualFold(parts[0], "paginated"):
		// The deprecated paginated list owns this path: a sandbox named
		// "paginated" cannot be read by name.
		writeJSON(w, http.StatusOK, map[string]any{"items": []any{}, "total": 0, "page": 1, "totalPages": 0})
	case len(parts) == 1 && r.Method == http.MethodGet && strings.EqualFold(parts[0], "for-runner"):
		apiError(w, http.StatusForbidden, "runner authentication required")
	case len(parts) == 1 && r.Method == http.MethodGet:
		s.mu.Lock()
		sb := s.find(parts[0])
		var rec map[string]any
		if sb != nil && s.state(sb) == "destroyed" {
			sb = nil
		}
		if sb != nil {
			rec = s.record(sb)
		}
		s.mu.Unlock()
		if sb == nil {
			apiError(w, http.StatusNotFound, "Sandbox with ID or name "+parts[0]+" not found")
			return
		}
		writeJSON(w, http.StatusOK, rec)
	case len(parts) == 1 && r.Method == http.MethodDelete:
		// A soft delete (sandbox.service.ts destroy, Sandbox
		// getSoftDeleteUpdate): refused with 409 while a state change is
		// in progress; otherwise the sandbox is renamed
		// DESTROYED_<name>_<ms> with desiredState destroyed, and is
		// "destroying" for DestroyDelay.
		s.mu.Lock()
		sb := s.find(parts[0])
		switch {
		case sb == nil || s.state(sb) == "destroyed":
			s.mu.Unlock()
			apiError(w, http.StatusNotFound, "Sandbox with ID or name "+parts[0]+" not found")
			return
		case sb.State == "destroyed" || s.pending(sb):
			s.mu.Unlock()
			apiError(w, http.StatusConflict, "Sandbox state change in progress")
			return
		}
		s.killLocked(sb)
		_ = os.RemoveAll(sb.dir)
		delete(s.sandboxes, sb.Name)
		sb.Name = fmt.Sprintf("DESTROYED_%s_%d", sb.Name, time.Now().UnixMilli())
		sb.formerState = s.state(sb)
		sb.State, sb.destroyedAt = "destroyed", time.Now()
		sb.sessions, sb.sessionOrder = map[string]*session{}, nil
		s.sandboxes[sb.Name] = sb
		rec := s.record(sb)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, rec)
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "start":
		s.start(w, r, parts[0])
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "stop":
		s.stop(w, parts[0])
	case len(parts) == 2 && r.Method == http.MethodPut && parts[1] == "labels":
		s.replaceLabels(w, r, parts[0])
	case len(parts) == 3 && r.Method == http.MethodPost && (parts[1] == "autostop" || parts[1] == "autoarchive" || parts[1] == "autodelete"):
		s.setInterval(w, parts[0], parts[1], parts[2])
	case len(parts) == 2 && r.Method == http.MethodPost && parts[1] == "network-settings":
		s.network(w, r, parts[0])
	case len(parts) == 4 && r.Method == http.MethodGet && parts[1] == "ports" && parts[3] == "preview-url":
		s.previewURL(w, parts[0], parts[2])
	case len(parts) == 2 && r.Method == http.MethodGet && parts[1] == "toolbox-proxy-url":
		s.mu.Lock()
		sb := s.find(parts[0])
		s.mu.Unlock()
		if sb == nil {
			apiError(w, http.StatusNotFound, "sandbox not found")
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"url": s.proxyURL(sb.Target)})
	default:
		apiError(w, http.StatusNotFound, "no route")
	}
}

// find looks a sandbox up by name or id; s.mu held.
func (s *Server) find(key string) *Sandbox {
	if sb, ok := s.sandboxes[key]; ok {
		return sb
	}
	for _, sb := range s.sandboxes {
		if sb.ID == key {
			return sb
		}
	}
	return nil
}

// state is the reported state, with StartDelay applied; s.mu held.
func (s *Server) state(sb *Sandbox) string {
	if sb.State == "started" && time.Since(sb.startedAt) < s.StartDelay {
		return "starting"
	}
	if sb.State == "stopped" && time.Since(sb.stoppedAt) < s.StopDelay {
		return "stopping"
	}
	if sb.State == "destroyed" {
		switch since := time.Since(sb.destroyedAt); {
		case since < s.DestroyPending:
			return sb.formerState
		case since < s.DestroyPending+s.DestroyDelay:
			return "destroying"
		}
	}
	return sb.State
}

// desired is the record's desiredState; s.mu held.
func desired(sb *Sandbox) string {
	switch sb.State {
	case "destroyed":
		return "destroyed"
	case "stopped", "stopping":
		return "stopped"
	case "archived", "archiving":
		return "archived"
	}
	return "started"
}

// pending reports a state change in progress, during which the API
// refuses start, stop and delete with 409 (sandbox.service.ts,
// StateChangeInProgressError); s.mu held.
func (s *Server) pending(sb *Sandbox) bool {
	switch s.state(sb) {
	case "starting", "stopping", "archiving", "destroying", "creating":
		return true
	}
	return false
}

// hold keeps a create or start request open while sb is starting, up to
// Hold (30 s), as the API does.
func (s *Server) hold(ctx context.Context, sb *Sandbox) {
	max := s.Hold
	if max <= 0 {
		max = 30 * time.Second
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		s.mu.Lock()
		st := s.state(sb)
		s.mu.Unlock()
		if st != "starting" {
			return
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

func (s *Server) record(sb *Sandbox) map[string]any {
	m := map[string]any{"id": sb.ID, "name": sb.Name, "target": sb.Target, "state": s.state(sb), "desiredState": desired(sb), "labels": sb.Labels,
		"snapshot": sb.Snapshot, "user": "daytona", "organizationId": "org-daytonatest"}
	if sb.ErrorReason != "" {
		m["errorReason"] = sb.ErrorReason
	}
	if s.ProxyURLInRecord {
		m["toolboxProxyUrl"] = s.proxyURL(sb.Target)
	}
	for k, v := range sb.intervals {
		m[k] = v
	}
	m["networkBlockAll"] = sb.NetworkBlockAll
	if sb.NetworkAllowList != "" {
		m["networkAllowList"] = sb.NetworkAllowList
	}
	if sb.DomainAllowList != "" {
		m["domainAllowList"] = sb.DomainAllowList
	}
	return m
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid JSON body")
		return
	}
	name, _ := body["name"].(string)
	id := newID()
	if name == "" {
		name = id
	}
	snap, _ := body["snapshot"].(string)
	if snap != "" && !contains(s.Snapshots, snap) {
		apiError(w, http.StatusBadRequest, fmt.Sprintf("Snapshot %s not found. Did you add it through the Daytona Dashboard?", snap))
		return
	}
	labels := map[string]string{}
	if lm, ok := body["labels"].(map[string]any); ok {
		for k, v := range lm {
			labels[k] = fmt.Sprint(v)
		}
	}
	// The API's IsSafeDisplayString refuses URL-like names ("www." anywhere,
	// any case) and control bytes (common/validators/is-safe-string.validator.ts).
	if strings.Contains(strings.ToLower(name), "www.") || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f }) {
		apiError(w, http.StatusBadRequest, "name must not contain HTML tags, URLs, or control characters")
		return
	}
	s.mu.Lock()
	if _, exists := s.sandboxes[name]; exists {
		s.mu.Unlock()
		st := s.ConflictStatus
		if st == 0 {
			st = http.StatusConflict
		}
		apiError(w, st, fmt.Sprintf("Sandbox with name %s already exists", name))
		return
	}
	dir := filepath.Join(s.root, id)
	for _, d := range []string{"home", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			s.mu.Unlock()
			apiError(w, http.StatusInternalServerError, err.Error())
			return
		}
	}
	target := s.Target
	if t, ok := body["target"].(string); ok && t != "" {
		target = t
	}
	if target == "" {
		target = defaultTarget
	}
	sb := &Sandbox{ID: id, Name: name, State: "started", Snapshot: snap, Labels: labels, Create: body, Target: target,
		dir: dir, startedAt: time.Now(), sessions: map[string]*session{}, procs: map[*exec.Cmd]bool{}}
	s.sandboxes[name] = sb
	s.mu.Unlock()
	s.hold(r.Context(), sb)
	s.mu.Lock()
	rec := s.record(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, rec)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := map[string]string{}
	if l := q.Get("labels"); l != "" {
		if err := json.Unmarshal([]byte(l), &want); err != nil {
			apiError(w, http.StatusBadRequest, "labels must be a JSON object")
			return
		}
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			apiError(w, http.StatusBadRequest, "bad limit")
			return
		}
		limit = n
	}
	if s.PageSize > 0 && s.PageSize < limit {
		limit = s.PageSize
	}
	start := 0
	if c := q.Get("cursor"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 0 {
			apiError(w, http.StatusBadRequest, "bad cursor")
			return
		}
		start = n
	}
	s.mu.Lock()
	var all []*Sandbox
	for _, sb := range s.sandboxes {
		// The search leaves out destroyed sandboxes, not destroying ones
		// (adapters/sandbox-typeorm-search.adapter.ts).
		ok := s.state(sb) != "destroyed"
		for k, v := range want {
			if sb.Labels[k] != v {
				ok = false
			}
		}
		if ok {
			all = append(all, sb)
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Name < all[j].Name })
	items := []map[string]any{}
	for i := start; i < len(all) && i < start+limit; i++ {
		items = append(items, s.record(all[i]))
	}
	s.mu.Unlock()
	resp := map[string]any{"items": items, "nextCursor": nil}
	if start+limit < len(all) {
		resp["nextCursor"] = strconv.Itoa(start + limit)
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Server) start(w http.ResponseWriter, r *http.Request, key string) {
	s.mu.Lock()
	sb := s.find(key)
	st := ""
	if sb != nil {
		st = s.state(sb)
	}
	switch {
	case sb == nil || st == "destroyed":
		s.mu.Unlock()
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	case sb.State == "destroyed" || s.pending(sb):
		// A deleted sandbox's desiredState is destroyed: start refuses it
		// as a state change in progress (sandbox.service.ts start).
		s.mu.Unlock()
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	case sb.State == "error" || sb.State == "build_failed":
		s.mu.Unlock()
		apiError(w, http.StatusBadRequest, "Sandbox is in an errored state")
		return
	case sb.State != "started":
		sb.State, sb.startedAt = "started", time.Now()
	}
	s.mu.Unlock()
	s.hold(r.Context(), sb)
	s.mu.Lock()
	rec := s.record(sb)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, rec)
}

func (s *Server) stop(w http.ResponseWriter, key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	switch {
	case sb == nil || s.state(sb) == "destroyed":
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	case s.pending(sb):
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	case sb.State == "started":
		// The machine stops: its processes die and the daemon forgets its
		// sessions; the disk stays.
		s.killLocked(sb)
		sb.sessions, sb.sessionOrder = map[string]*session{}, nil
		sb.State, sb.stoppedAt = "stopped", time.Now()
	case sb.State != "stopped" && sb.State != "archived":
		apiError(w, http.StatusConflict, "Sandbox state change in progress")
		return
	}
	writeJSON(w, http.StatusOK, s.record(sb))
}

// domainRE is the API's domain check (apps/api network-validation.util.ts,
// validateDomainAllowList): host labels, optionally behind one "*.".
var domainRE = regexp.MustCompile(`^(\*\.)?([a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?\.)+[a-zA-Z]{2,}$`)

// network applies POST /sandbox/{id}/network-settings as the API does
// (sandbox.service.ts, updateNetworkSettings): each field present updates
// the stored value; networkBlockAll true clears the CIDR list, a non-empty
// networkAllowList clears networkBlockAll, and an empty string clears a
// list. The stored values then go to the runner, whose effect Egress
// reports.
func (s *Server) network(w http.ResponseWriter, r *http.Request, key string) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiError(w, http.StatusBadRequest, "invalid JSON body")
		return
	}
	str := func(k string) (string, bool, bool) {
		v, ok := body[k]
		if !ok || v == nil {
			return "", false, true
		}
		x, isStr := v.(string)
		return x, true, isStr
	}
	dom, hasDom, ok := str("domainAllowList")
	if !ok {
		apiError(w, http.StatusBadRequest, "domainAllowList must be a string")
		return
	}
	cidr, hasCIDR, ok := str("networkAllowList")
	if !ok {
		apiError(w, http.StatusBadRequest, "networkAllowList must be a string")
		return
	}
	var blockAll, hasBlock bool
	if v, ok := body["networkBlockAll"]; ok && v != nil {
		b, isBool := v.(bool)
		if !isBool {
			apiError(w, http.StatusBadRequest, "networkBlockAll must be a boolean value")
			return
		}
		blockAll, hasBlock = b, true
	}
	if !hasDom && !hasCIDR && !hasBlock {
		apiError(w, http.StatusBadRequest, "At least one of networkBlockAll, networkAllowList or domainAllowList must be provided")
		return
	}
	if hasDom && strings.TrimSpace(dom) != "" {
		ds := strings.Split(dom, ",")
		for _, d := range ds {
			if d = strings.TrimSpace(d); d != "" && !domainRE.MatchString(d) {
				apiError(w, http.StatusBadRequest, fmt.Sprintf("Invalid domain: %q. Must be a valid domain name", d))
				return
			}
		}
		if len(ds) > 10 {
			apiError(w, http.StatusBadRequest, "Domain allow list cannot contain more than 10 domains")
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	sb := s.find(key)
	if sb == nil {
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	}
	sb.Policy = body
	sb.Policies = append(sb.Policies, body)
	if hasDom {
		sb.DomainAllowList = strings.TrimSpace(dom)
		if sb.DomainAllowList != "" {
			sb.DomainAllowList = dom
		}
	}
	if hasBlock {
		sb.NetworkBlockAll = blockAll
		if blockAll {
			sb.NetworkAllowList = ""
		}
	}
	switch {
	case hasCIDR && strings.TrimSpace(cidr) != "":
		sb.NetworkAllowList, sb.NetworkBlockAll = cidr, false
	case hasCIDR:
		sb.NetworkAllowList = ""
	case hasBlock && !blockAll:
		sb.NetworkAllowList = ""
	}
	writeJSON(w, http.StatusOK, s.record(sb))
}

// Egress is the named sandbox's effective outbound policy as the runner
// applies it: "blocked" (networkBlockAll wins over every list), "cidr:<list>",
// "domains:<list>" — only where EnforceDomains is set; the public-source
// runner (apps/runner pkg/docker/network.go) never reads domainAllowList —,
// or "open". "" for an unknown sandbox.
func (s *Server) Egress(name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.sandboxes[name]
	switch {
	case !ok:
		return ""
	case sb.NetworkBlockAll:
		return "blocked"
	case sb.NetworkAllowList != "":
		return "cidr:" + sb.NetworkAllowList
	case s.EnforceDomains && sb.DomainAllowList != "":
		return "domains:" + sb.DomainAllowList
	}
	return "open"
}

// EnforcesEgress reports whether the fake enforces a sandbox's egress on
// the commands it runs: as root it does, by running them in a network
// namespace of their own (only a loopback that is down) whenever Egress
// is not "open". That is networkBlockAll exactly, and stricter than
// Daytona for a CIDR or domain list (those hosts are refused too): enough
// for a test that observes what a policy refuses, never one that needs
// the allowed hosts. Without root commands share the host's network,
// whatever the policy.
func (s *Server) EnforcesEgress() bool { return os.Geteuid() == 0 }

// netFlags is the clone flags of a command of sb: a network namespace of
// its own where EnforcesEgress and sb's egress is not open.
func (s *Server) netFlags(sb *Sandbox) uintptr {
	if !s.EnforcesEgress() {
		return 0
	}
	s.mu.Lock()
	closed := sb.NetworkBlockAll || sb.NetworkAllowList != "" || (s.EnforceDomains && sb.DomainAllowList != "")
	s.mu.Unlock()
	if closed {
		return syscall.CLONE_NEWNET
	}
	return 0
}

// killLocked kills every process group of sb; s.mu held.
func (s *Server) killLocked(sb *Sandbox) {
	for c := range sb.procs {
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	}
}

// ---- toolbox ----

func (s *Server) toolbox(w http.ResponseWriter, r *http.Request, region, id, sub string) {
	s.mu.Lock()
	sb := s.find(id)
	st, deleted, elsewhere := "", false, false
	if sb != nil {
		st, deleted, elsewhere = s.state(sb), sb.State == "destroyed", sb.Target != region
	}
	s.mu.Unlock()
	switch {
	case sb == nil || deleted:
		// The proxy first asks the API whether the bearer may reach the
		// sandbox (apps/proxy pkg/proxy/auth.go, Authenticate;
		// auth_callback.go, hasSandboxAccess): for one that does not exist
		// — a deleted one included — the answer is 401, not 404.
		apiError(w, http.StatusUnauthorized, "authentication failed: Bearer token is invalid")
		return
	case elsewhere:
		// Another region's proxy does not reach the sandbox's runner.
		apiError(w, http.StatusNotFound, "sandbox not found")
		return
	}
	if st != "started" {
		apiError(w, http.StatusBadRequest, "failed to reach the toolbox. Is the Sandbox started?")
		return
	}
	switch {
	case sub == "/process/execute" && r.Method == http.MethodPost:
		s.execute(w, r, sb)
	case sub == "/process/session" && r.Method == http.MethodPost:
		s.createSession(w, r, sb)
	case sub == "/process/session" && r.Method == http.MethodGet:
		s.listSessions(w, sb)
	case strings.HasPrefix(sub, "/process/session/"):
		s.sessionOp(w, r, sb, strings.Split(strings.TrimPrefix(sub, "/process/session/"), "/"))
	case sub == "/files/download" && r.Method == http.MethodGet:
		s.download(w, r, sb)
	case (sub == "/user-home-dir" || sub == "/work-dir") && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]string{"dir": filepath.Join(sb.dir, "home")})
	case s.files(w, r, sb, sub):
	default:
		// The daemon's router (gin) answers an unknown route with a bare
		// text 404 — the same status as a missing sandbox.
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, "404 page not found")
	}
}

// environ is the processes' environment: the host's PATH, and HOME and
// TMPDIR inside the sandbox's scratch directory.
func (sb *Sandbox) environ(extra map[string]string) []string {
	env := []string{"PATH=" + os.Getenv("PATH"), "HOME=" + filepath.Join(sb.dir, "home"),
		"TMPDIR=" + filepath.Join(sb.dir, "tmp"), "USER=daytona", "LANG=C.UTF-8"}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// parseCommand splits a command the way older Daytona daemons do for
// /process/execute: spaces separate words, ' or " toggles quoting (the
// other quote is literal inside), there are no escapes, and it works on
// runes (invalid UTF-8 has already become U+FFFD in JSON).
func parseCommand(command string) []string {
	var args []string
	var cur strings.Builder
	var quote rune
	for _, r := range command {
		switch {
		case r == '"' || r == '\'':
			switch quote {
			case 0:
				quote = r
			case r:
				quote = 0
			default:
				cur.WriteRune(r)
			}
		case r == ' ' && quote == 0:
			if cur.Len() > 0 {
				args = append(args, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return args
}

// track registers a started process; it refuses when the server closes.
func (s *Server) track(sb *Sandbox, c *exec.Cmd) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		return false
	}
	sb.procs[c] = true
	s.wg.Add(1)
	return true
}

func (s *Server) untrack(sb *Sandbox, c *exec.Cmd) {
	s.mu.Lock()
	delete(sb.procs, c)
	s.mu.Unlock()
	s.wg.Done()
}

func (s *Server) execute(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	var req struct {
		Command string            `json:"command"`
		Timeout *uint32           `json:"timeout"`
		Cwd     *string           `json:"cwd"`
		Env     map[string]string `json:"envs"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		apiError(w, http.StatusBadRequest, "command cannot be empty or whitespace-only")
		return
	}
	var c *exec.Cmd
	if s.SplitExecute {
		argv := parseCommand(req.Command)
		if len(argv) == 0 {
			apiError(w, http.StatusBadRequest, "empty command")
			return
		}
		c = exec.Command(argv[0], argv[1:]...)
	} else {
		// v0.190.0 pipes the command into the shell's stdin (no ARG_MAX
		// limit), so the command's processes share that stdin.
		shell := s.Shell
		if shell == "" {
			shell = "sh"
		}
		c = exec.Command(shell)
		c.Stdin = strings.NewReader(req.Command)
	}
	c.Dir = filepath.Join(sb.dir, "home")
	if req.Cwd != nil && *req.Cwd != "" {
		// A relative cwd is taken from the sandbox's home, the daemon's
		// working directory.
		c.Dir = *req.Cwd
		if !filepath.IsAbs(c.Dir) {
			c.Dir = filepath.Join(sb.dir, "home", c.Dir)
		}
	}
	c.Env = sb.environ(req.Env)
	var out bytes.Buffer
	c.Stdout, c.Stderr = &out, &out
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: s.netFlags(sb)}
	c.WaitDelay = 2 * time.Second
	if err := c.Start(); err != nil {
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": -1, "result": err.Error()})
		return
	}
	if !s.track(sb, c) {
		_ = c.Wait()
		apiError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	defer s.untrack(sb, c)
	done := make(chan error, 1)
	go func() { done <- c.Wait() }()
	var timeout <-chan time.Time
	if req.Timeout != nil && *req.Timeout > 0 {
		t := time.NewTimer(time.Duration(*req.Timeout) * time.Second)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
		_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		<-done
		apiError(w, http.StatusRequestTimeout, fmt.Sprintf("Command execution timed out after %d seconds", *req.Timeout))
	case <-done:
		writeJSON(w, http.StatusOK, map[string]any{"exitCode": c.ProcessState.ExitCode(), "result": out.String()})
	}
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	var req struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.SessionID == "" {
		apiError(w, http.StatusBadRequest, "sessionId is required")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := sb.sessions[req.SessionID]; ok {
		apiError(w, http.StatusConflict, "session already exists")
		return
	}
	sb.sessions[req.SessionID] = &session{id: req.SessionID}
	sb.sessionOrder = append(sb.sessionOrder, req.SessionID)
	w.WriteHeader(http.StatusCreated)
}

func (c *command) record(withExit bool) map[string]any {
	m := map[string]any{"id": c.id, "command": c.line}
	c.mu.Lock()
	if withExit && c.exit != nil {
		m["exitCode"] = *c.exit
	}
	c.mu.Unlock()
	return m
}

func (s *Server) listSessions(w http.ResponseWriter, sb *Sandbox) {
	s.mu.Lock()
	out := []map[string]any{}
	for _, id := range sb.sessionOrder {
		se := sb.sessions[id]
		cmds := []map[string]any{}
		for _, c := range se.cmds {
			cmds = append(cmds, c.record(s.RecordExitCodes))
		}
		out = append(out, map[string]any{"sessionId": id, "commands": cmds})
	}
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) sessionOp(w http.ResponseWriter, r *http.Request, sb *Sandbox, parts []string) {
	s.mu.Lock()
	se := sb.sessions[parts[0]]
	var cmd *command
	if se != nil && len(parts) >= 3 && parts[1] == "command" {
		for _, c := range se.cmds {
			if c.id == parts[2] {
				cmd = c
			}
		}
	}
	s.mu.Unlock()
	if se == nil {
		apiError(w, http.StatusNotFound, "session not found")
		return
	}
	switch {
	case len(parts) == 1 && r.Method == http.MethodDelete:
		// The daemon ends the session's shell and its process group
		// (pkg/session/delete.go) and removes its logs.
		s.mu.Lock()
		for _, c := range se.cmds {
			if c.proc != nil && c.proc.Process != nil && sb.procs[c.proc] {
				_ = syscall.Kill(-c.proc.Process.Pid, syscall.SIGKILL)
			}
		}
		delete(sb.sessions, se.id)
		for i, id := range sb.sessionOrder {
			if id == se.id {
				sb.sessionOrder = append(sb.sessionOrder[:i:i], sb.sessionOrder[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	case len(parts) == 1 && r.Method == http.MethodGet:
		s.getSession(w, se)
	case len(parts) == 2 && parts[1] == "exec" && r.Method == http.MethodPost:
		s.sessionExec(w, r, sb, se)
	case len(parts) == 3 && cmd != nil && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, cmd.record(s.RecordExitCodes))
	case len(parts) == 4 && parts[3] == "input" && cmd != nil && r.Method == http.MethodPost:
		s.sendInput(w, r, cmd)
	case len(parts) == 4 && parts[3] == "logs" && cmd != nil && r.Method == http.MethodGet && r.URL.Query().Get("follow") == "true":
		s.followLogs(w, r, cmd)
	case len(parts) == 4 && parts[3] == "logs" && cmd != nil && r.Method == http.MethodGet:
		cmd.mu.Lock()
		j := append([]byte(nil), cmd.journal...)
		out, errs := string(cmd.out[0]), string(cmd.out[1])
		cmd.mu.Unlock()
		if s.LegacyLogs {
			writeJSON(w, http.StatusOK, map[string]string{"stdout": out, "stderr": errs})
			return
		}
		// The 0.218 toolbox client asks with Accept: application/json,text/plain
		// and reads {output, stdout, stderr} (SessionCommandLogsResponse);
		// output is both streams merged, as the journal has them.
		if strings.Contains(r.Header.Get("Accept"), "application/json") {
			merged := bytes.ReplaceAll(bytes.ReplaceAll(j, []byte{1, 1, 1}, nil), []byte{2, 2, 2}, nil)
			writeJSON(w, http.StatusOK, map[string]string{"output": string(merged), "stdout": out, "stderr": errs})
			return
		}
		// For a client without an SDK version header the daemon keeps the
		// channel markers only when it asks for split output
		// (pkg/session/common.go, IsCombinedOutput); otherwise stdout and
		// stderr arrive merged, markers stripped. (SDK clients get answers
		// by SDK version, which the fake does not model.)
		if r.Header.Get("X-Daytona-Split-Output") != "true" {
			j = bytes.ReplaceAll(bytes.ReplaceAll(j, []byte{1, 1, 1}, nil), []byte{2, 2, 2}, nil)
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", strconv.Itoa(len(j)))
		_, _ = w.Write(j)
	default:
		apiError(w, http.StatusNotFound, "command not found")
	}
}

// journalWriter appends one stream to the command's journal the way the
// daemon's command wrapper does (apps/daemon pkg/session/execute.go,
// cmdWrapperFormat): a shell loop `while IFS= read -r line || [ -n "$line" ];
// do printf '<marker>%s\n' "$line"; done` per stream. So output reaches the
// journal only line by line — a partial line (a prompt) appears when its
// newline comes or the stream ends —, every line carries its own marker, a
// final line without a newline gets one, and NUL bytes are dropped (the
// shell's read drops them).
type journalWriter struct {
	c  *command
	ch int
}

func (jw journalWriter) Write(b []byte) (int, error) {
	jw.c.mu.Lock()
	defer jw.c.mu.Unlock()
	jw.c.out[jw.ch] = append(jw.c.out[jw.ch], b...)
	p := append(jw.c.pending[jw.ch], bytes.ReplaceAll(b, []byte{0}, nil)...)
	for {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			break
		}
		jw.c.appendLine(jw.ch, p[:i])
		p = p[i+1:]
	}
	jw.c.pending[jw.ch] = append([]byte(nil), p...)
	return len(b), nil
}

// appendLine adds one labelled line; c.mu held.
func (c *command) appendLine(ch int, line []byte) {
	m := byte(1 + ch)
	c.journal = append(c.journal, m, m, m)
	c.journal = append(c.journal, line...)
	c.journal = append(c.journal, '\n')
}

// flushPartial ends the streams: an unterminated last line is written
// with a newline added, as the read loop's `|| [ -n "$line" ]` does.
func (c *command) flushPartial() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ch := range c.pending {
		if len(c.pending[ch]) > 0 {
			c.appendLine(ch, c.pending[ch])
			c.pending[ch] = nil
		}
	}
}

// Sessions counts the named sandbox's toolbox sessions; each holds a
// shell in the real daemon.
func (s *Server) Sessions(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sb, ok := s.sandboxes[name]; ok {
		return len(sb.sessions)
	}
	return 0
}

func (s *Server) sessionExec(w http.ResponseWriter, r *http.Request, sb *Sandbox, se *session) {
	var req struct {
		Command  string `json:"command"`
		RunAsync bool   `json:"runAsync"`
		Async    bool   `json:"async"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || strings.TrimSpace(req.Command) == "" {
		apiError(w, http.StatusBadRequest, "command cannot be empty")
		return
	}
	shell := s.Shell
	if shell == "" {
		shell = "sh"
	}
	cmd := &command{id: newID(), line: req.Command, done: make(chan struct{})}
	c := exec.Command(shell, "-c", req.Command)
	cmd.proc = c
	c.Dir = filepath.Join(sb.dir, "home")
	c.Env = sb.environ(nil)
	c.Stdout, c.Stderr = journalWriter{cmd, 0}, journalWriter{cmd, 1}
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: s.netFlags(sb)}
	c.WaitDelay = 2 * time.Second
	// The wrapper's stdin: a sync command sees EOF at once; an async one a
	// FIFO held open by a loop of sleeps until the command ends
	// (pkg/session/execute.go, inputPipeCommand), so a command that reads
	// the session's stdin waits rather than see EOF.
	var hold *os.File
	async := req.RunAsync || req.Async
	if async {
		pr, pw, err := os.Pipe()
		if err != nil {
			apiError(w, http.StatusInternalServerError, err.Error())
			return
		}
		c.Stdin, hold = pr, pw
		cmd.stdin = pw
		defer pr.Close()
	}
	if err := c.Start(); err != nil {
		if hold != nil {
			hold.Close()
		}
		apiError(w, http.StatusBadRequest, "failed to start command: "+err.Error())
		return
	}
	if !s.track(sb, c) {
		_ = c.Wait()
		if hold != nil {
			hold.Close()
		}
		apiError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	s.mu.Lock()
	se.cmds = append(se.cmds, cmd)
	s.mu.Unlock()
	go func() {
		defer s.untrack(sb, c)
		_ = c.Wait()
		if hold != nil {
			hold.Close() // the wrapper kills its stdin holder
		}
		// A command killed by a signal takes the recording shell with it
		// (the daemon's wrapper shares its process group): no exit code,
		// and the labellers die with their partial lines.
		if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && !ws.Signaled() {
			cmd.flushPartial()
			code := ws.ExitStatus()
			cmd.mu.Lock()
			cmd.exit = &code
			cmd.mu.Unlock()
		}
		close(cmd.done)
	}()
	if async {
		writeJSON(w, http.StatusAccepted, map[string]any{"cmdId": cmd.id})
		return
	}
	select {
	case <-cmd.done:
	case <-r.Context().Done():
		return
	}
	cmd.mu.Lock()
	resp := map[string]any{"cmdId": cmd.id, "output": string(cmd.out[0]) + string(cmd.out[1]),
		"stdout": string(cmd.out[0]), "stderr": string(cmd.out[1])}
	if cmd.exit != nil {
		resp["exitCode"] = *cmd.exit
	}
	cmd.mu.Unlock()
	writeJSON(w, http.StatusOK, resp)
}

// hostPath maps a toolbox path: relative to the sandbox's home; absolute
// only inside the server's root.
func (s *Server) hostPath(sb *Sandbox, p string) (string, error) {
	if p == "" || strings.ContainsRune(p, 0) {
		return "", errors.New("path is required")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(sb.dir, "home", p)
	}
	p = filepath.Clean(p)
	if p != s.root && !strings.HasPrefix(p, s.root+"/") {
		return "", fmt.Errorf("permission denied: %s is outside the daytonatest root %s", p, s.root)
	}
	return p, nil
}

func (s *Server) upload(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxUpload)
	dst, err := s.hostPath(sb, r.URL.Query().Get("path"))
	if err != nil {
		apiError(w, http.StatusForbidden, err.Error())
		return
	}
	f, _, err := r.FormFile("file")
	if err != nil {
		apiError(w, http.StatusBadRequest, "multipart field file is required")
		return
	}
	defer f.Close()
	data, err := io.ReadAll(f)
	if err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	if err := os.WriteFile(dst, data, 0o644); err != nil {
		apiError(w, http.StatusBadRequest, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) download(w http.ResponseWriter, r *http.Request, sb *Sandbox) {
	src, err := s.hostPath(sb, r.URL.Query().Get("path"))
	if err != nil {
		apiError(w, http.StatusForbidden, err.Error())
		return
	}
	data, err := os.ReadFile(src)
	if err != nil {
		apiError(w, http.StatusNotFound, "file not found")
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	_, _ = w.Write(data)
}

// Wait blocks until every process the server started has ended or ctx ends.
func (s *Server) Wait(ctx context.Context) error {
	for {
		if s.Processes() == 0 {
			return nil
		}
		t := time.NewTimer(20 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
