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
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
