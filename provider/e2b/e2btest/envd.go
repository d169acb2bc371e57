package e2btest

import (
	"bytes"
	"compress/gzip"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/creack/pty"
)

// journalDir is the sandbox path of the shim's journals.
const journalDir = "/tmp/fountain"

type sbx struct {
	srv       *Server
	id        string
	template  string
	state     string
	startedAt time.Time
	endAt     time.Time
	autoPause bool
	metadata  map[string]string
	network   *Network
	dir       string
	home      string
	journal   string
	procs     map[uint32]*proc // live processes; guarded by srv.mu

	envdVersion string
	// envVars are create's envVars, every process's environment.
	envVars map[string]string
	// accessToken, when set (a secure sandbox), is the envdAccessToken
	// envd wants in every request's X-Access-Token.
	accessToken string
	// transition, while set, is the state the sandbox is changing through
	// (pausing, snapshotting, killing) until transitionEnd; then
	// it becomes transitionTo ("" means removed).
	transition    string
	transitionTo  string
	transitionEnd time.Time
	// snapshotted is set by the first pause: E2B keeps the sandbox's
	// snapshot record from then on, also while it runs again, and its
	// listing shows a sandbox that is neither running nor pausing (being
	// snapshotted or killed) as paused from that record.
	snapshotted bool
	// resumeTimeout is the TTL (E2B seconds) a resume in progress gives
	// the sandbox when it completes; resumes counts completed resumes.
	resumeTimeout int
	resumes       int
}

func (sb *sbx) snapshot() Sandbox {
	out := Sandbox{ID: sb.id, State: sb.state, Metadata: map[string]string{}, AutoPause: sb.autoPause,
		EndAt: sb.endAt, Processes: len(sb.procs), Dir: sb.dir, Transition: sb.transition, Resumes: sb.resumes}
	for k, v := range sb.metadata {
		out.Metadata[k] = v
	}
	if sb.network != nil {
		n := *sb.network
		out.Network = &n
	}
	return out
}

// pause stops every process and cuts every stream, as a snapshot of the VM
// would; srv.mu is held.
func (sb *sbx) pause() {
	sb.state = "paused"
	sb.snapshotted = true
	for _, p := range sb.procs {
		_ = syscall.Kill(-p.pid(), syscall.SIGSTOP)
		p.tagBlind = true
		p.cutAll()
	}
}

// resume continues every process; srv.mu is held.
func (sb *sbx) resume() {
	sb.state = "running"
	for _, p := range sb.procs {
		_ = syscall.Kill(-p.pid(), syscall.SIGCONT)
	}
}

// killAll kills every process group; srv.mu is held.
func (sb *sbx) killAll() {
	for _, p := range sb.procs {
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		_ = syscall.Kill(-p.pid(), syscall.SIGCONT)
		p.cutAll()
	}
}

// mapPath maps a sandbox path to a host path.
func (sb *sbx) mapPath(p string) string {
	home := "/home/" + sb.srv.opts.User
	switch {
	case p == journalDir || strings.HasPrefix(p, journalDir+"/"):
		return filepath.Join(sb.journal, strings.TrimPrefix(p, journalDir))
	case p == home || strings.HasPrefix(p, home+"/"):
		return filepath.Join(sb.home, strings.TrimPrefix(p, home))
	case p == "~" || strings.HasPrefix(p, "~/"):
		return filepath.Join(sb.home, strings.TrimPrefix(p, "~"))
	case !filepath.IsAbs(p):
		return filepath.Join(sb.home, p)
	}
	return p
}

type procConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args"`
	Envs map[string]string `json:"envs"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type proc struct {
	cmd      *exec.Cmd
	tag      string
	cfg      procConfig
	stdin    io.WriteCloser // nil without stdin; the terminal with a pty
	ptmx     *os.File       // the terminal's master, with a pty
	tagBlind bool           // started before a pause; guarded by srv.mu

	mu   sync.Mutex
	subs map[*sub]bool
	done bool
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// sub is one Start stream's view of a process: a queue that never blocks
// the process's readers.
type sub struct {
	mu    sync.Mutex
	q     [][]byte // JSON messages
	ended bool
	wake  chan struct{}
	cut   chan struct{}
	once  sync.Once
}

func newSub() *sub { return &sub{wake: make(chan struct{}, 1), cut: make(chan struct{})} }

func (s *sub) push(msg []byte, end bool) {
	s.mu.Lock()
	if msg != nil {
		s.q = append(s.q, msg)
	}
	if end {
		s.ended = true
	}
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

func (s *sub) take() ([][]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.q
	s.q = nil
	return q, s.ended
}

func (p *proc) broadcast(msg []byte, end bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if end {
		p.done = true
	}
	for s := range p.subs {
		s.push(msg, end)
	}
}

func (p *proc) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for s := range p.subs {
		s.once.Do(func() { close(s.cut) })
		delete(p.subs, s)
	}
}

func (p *proc) unsubscribe(s *sub) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

func event(kind string, v any) []byte {
	b, _ := json.Marshal(map[string]any{"event": map[string]any{kind: v}})
	return b
}

func envelope(flag byte, payload []byte) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = flag
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

func connectError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

// sandboxFor routes an envd request and checks its user.
func (s *Server) sandboxFor(w http.ResponseWriter, r *http.Request) (*sbx, bool) {
	// Addressed by host (49983-<id>.<domain>), the domain must be the
	// cluster's: a host under any other domain reaches no sandbox. The
	// E2b-Sandbox-Id header routes requests sent to one endpoint
	// (E2B_SANDBOX_URL).
	id := r.Header.Get("E2b-Sandbox-Id")
	hostname, _, _ := strings.Cut(r.Host, ":")
	if first, domain, ok := strings.Cut(hostname, "."); ok {
		if hid, ok := strings.CutPrefix(first, "49983-"); ok {
			if domain != s.opts.Domain {
				writeJSON(w, http.StatusBadGateway, map[string]any{"code": 502, "message": "The sandbox was not found", "sandboxId": hid})
				return nil, false
			}
			id = hid
		}
	}
	if user, _, ok := r.BasicAuth(); ok && user != s.opts.User {
		apiError(w, http.StatusUnauthorized, "invalid user: "+user)
		return nil, false
	}
	s.mu.Lock()
	sb, ok := s.sandboxes[id]
	running := ok && sb.state == "running"
	transitioning := ok && sb.transition != "" && sb.transition != "resuming"
	token := ""
	if ok {
		token = sb.accessToken
	}
	s.mu.Unlock()
	if running && !transitioning && token != "" && r.URL.Path != "/health" &&
		subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(token)) != 1 {
		// A secure sandbox's envd wants its access token on every call
		// but the health check.
		apiError(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token or a valid signature")
		return nil, false
	}
	if transitioning {
		// The client proxy's answer while a sandbox changes state.
		writeJSON(w, http.StatusConflict, map[string]any{"code": 409, "sandboxId": id,
			"message": "The sandbox is still transitioning. Try again in a moment."})
		return nil, false
	}
	if !running {
		// E2B's edge answers 502 for a sandbox it cannot route to: one
		// that is paused, or being resumed (it joins the catalog only once
		// started; the client proxy resumes a paused sandbox itself only
		// under an autoResume policy, which this provider never sets:
		// e2b-dev/infra packages/client-proxy/internal/proxy/proxy.go).
		writeJSON(w, http.StatusBadGateway, map[string]any{"code": 502, "message": "The sandbox was not found", "sandboxId": id})
		return nil, false
	}
	return sb, true
}

func (s *Server) serveEnvd(w http.ResponseWriter, r *http.Request) {
	s.record(Request{Plane: Envd, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery, SandboxID: r.Header.Get("E2b-Sandbox-Id")})
	body := readBody(r)
	r.Body = io.NopCloser(bytes.NewReader(body))
	f := s.takeFault(Envd, r, body)
	if s.applyFault(w, r, f) {
		return
	}
	sb, ok := s.sandboxFor(w, r)
	if !ok {
		return
	}
	switch r.URL.Path {
	case "/health":
		w.WriteHeader(http.StatusNoContent)
	case "/process.Process/Start":
		s.envdStart(w, r, sb, f)
	case "/process.Process/CloseStdin":
		if olderThan(sb.envdVersion, 0, 5, 2) {
			// Before 0.5.2 envd has no such method.
			connectError(w, http.StatusNotFound, "unimplemented", "process.Process/CloseStdin is not implemented")
			return
		}
		s.envdUnary(w, r, sb, "CloseStdin")
	case "/process.Process/List", "/process.Process/SendInput", "/process.Process/SendSignal", "/process.Process/Update":
		s.envdUnary(w, r, sb, strings.TrimPrefix(r.URL.Path, "/process.Process/"))
	case "/process.Process/Connect":
		s.envdConnect(w, r, sb)
	case "/files":
		s.envdFiles(w, r, sb)
	case "/filesystem.Filesystem/ListDir":
		s.envdListDir(w, r, sb)
	case "/filesystem.Filesystem/Stat", "/filesystem.Filesystem/MakeDir", "/filesystem.Filesystem/Move",
		"/filesystem.Filesystem/Remove":
		s.envdFS(w, r, sb, strings.TrimPrefix(r.URL.Path, "/filesystem.Filesystem/"))
	case "/filesystem.Filesystem/WatchDir":
		s.envdWatchDir(w, r, sb)
	default:
		connectError(w, http.StatusNotFound, "unimplemented", "no such method")
	}
}

// ptyJSON is process.PTY.
type ptyJSON struct {
	Size struct {
		Cols uint16 `json:"cols"`
		Rows uint16 `json:"rows"`
	} `json:"size"`
}

// readEnvelope reads a Connect streaming request's one message.
func readEnvelope(w http.ResponseWriter, r *http.Request, v any) bool {
	if ct := r.Header.Get("Content-Type"); ct != "application/connect+json" {
		connectError(w, http.StatusUnsupportedMediaType, "unknown", "unsupported content type "+ct)
		return false
	}
	body := readBody(r)
	if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		connectError(w, http.StatusBadRequest, "invalid_argument", "bad request envelope")
		return false
	}
	if err := json.Unmarshal(body[5:], v); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return false
	}
	return true
}

// streamWriter writes a Connect server stream's envelopes, flushing each.
type streamWriter struct {
	w  http.ResponseWriter
	fl http.Flusher
}

func startStream(w http.ResponseWriter) *streamWriter {
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	return &streamWriter{w: w, fl: fl}
}

func (sw *streamWriter) write(flag byte, payload []byte) bool {
	if _, err := sw.w.Write(envelope(flag, payload)); err != nil {
		return false
	}
	if sw.fl != nil {
		sw.fl.Flush()
	}
	return true
}

// fail ends the stream with a Connect error.
func (sw *streamWriter) fail(code, msg string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	sw.write(2, b)
}

func (s *Server) envdStart(w http.ResponseWriter, r *http.Request, sb *sbx, f *Fault) {
	var req struct {
		Process procConfig `json:"process"`
		Pty     *ptyJSON   `json:"pty"`
		Tag     *string    `json:"tag"`
		Stdin   *bool      `json:"stdin"`
	}
	if !readEnvelope(w, r, &req) {
		return
	}
	sw := startStream(w)
	// envd before 0.3.0 has no stdin field: every process gets a stdin.
	withStdin := req.Stdin == nil || *req.Stdin || olderThan(sb.envdVersion, 0, 3, 0)
	p, sub, err := s.spawn(sb, req.Process, req.Tag, withStdin, req.Pty)
	if err != nil {
		sw.fail("internal", "error starting process: "+err.Error())
		return
	}
	s.streamProc(sw, r, p, sub, f)
}

// envdConnect is process.Process/Connect: a stream of a running process's
// events from now on (envd does not replay what it already sent).
func (s *Server) envdConnect(w http.ResponseWriter, r *http.Request, sb *sbx) {
	var req struct {
		Process selectorJSON `json:"process"`
	}
	if !readEnvelope(w, r, &req) {
		return
	}
	sw := startStream(w)
	s.mu.Lock()
	p := sb.find(req.Process)
	var su *sub
	if p != nil {
		su = p.subscribe()
	}
	s.mu.Unlock()
	if su == nil {
		sw.fail("not_found", "process not found")
		return
	}
	s.streamProc(sw, r, p, su, nil)
}

// streamProc sends the start event and then p's events as sub sees them,
// with keepalives, until the end event, the client leaves, the server
// closes or a pause cuts the stream.
func (s *Server) streamProc(sw *streamWriter, r *http.Request, p *proc, sub *sub, f *Fault) {
	defer p.unsubscribe(sub)
	sw.write(0, event("start", map[string]any{"pid": p.pid()}))
	if f != nil && f.StallStream {
		select {
		case <-r.Context().Done():
		case <-s.closing:
		case <-sub.cut:
			panic(http.ErrAbortHandler)
		}
		return
	}
	ka := s.opts.Second * 50
	if v, err := strconv.Atoi(r.Header.Get("Keepalive-Ping-Interval")); err == nil && v > 0 {
		ka = s.secs(v)
	}
	tick := time.NewTicker(ka)
	defer tick.Stop()
	var deadline <-chan time.Time
	if ms, err := strconv.ParseInt(r.Header.Get("Connect-Timeout-Ms"), 10, 64); err == nil && ms > 0 {
		t := time.NewTimer(time.Duration(ms) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case <-sub.cut:
			panic(http.ErrAbortHandler) // the connection dies with the VM's snapshot
		case <-deadline:
			// The stream's deadline (Connect-Timeout-Ms) ends the stream,
			// not the process.
			sw.fail("deadline_exceeded", "context deadline exceeded")
			return
		case <-tick.C:
			if !sw.write(0, event("keepalive", map[string]any{})) {
				return
			}
		case <-sub.wake:
			msgs, ended := sub.take()
			for _, m := range msgs {
				if f != nil && f.NoEnd && strings.HasPrefix(string(m), `{"event":{"end"`) {
					continue
				}
				if !sw.write(0, m) {
					return
				}
			}
			if ended {
				sw.write(2, []byte("{}"))
				return
			}
		}
	}
}

// subscribe adds a stream's view of p; nil when p has ended.
func (p *proc) subscribe() *sub {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return nil
	}
	su := newSub()
	p.subs[su] = true
	return su
}

// spawn starts a real process for a Start request and subscribes the
// caller to it. With pt the process gets a terminal of that size as its
// controlling terminal (a session of its own), its output comes as pty
// data and its input goes to the terminal.
func (s *Server) spawn(sb *sbx, cfg procConfig, tag *string, withStdin bool, pt *ptyJSON) (*proc, *sub, error) {
	if cfg.Cmd == "" {
		return nil, nil, errors.New("empty cmd")
	}
	cmd := exec.Command(cfg.Cmd, cfg.Args...)
	cmd.Dir = sb.home
	s.mu.Lock()
	isolated := s.EnforcesNetwork() && sb.network != nil && len(sb.network.DenyOut) > 0
	s.mu.Unlock()
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cmd.Dir = sb.mapPath(*cfg.Cwd)
	}
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + sb.home, "USER=" + s.opts.User, "LANG=C.UTF-8",
		"E2B_SANDBOX=true", "E2B_SANDBOX_ID=" + sb.id,
		"MANAGOAT_JOURNAL_DIR=" + sb.journal,
	}
	for k, v := range sb.envVars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range cfg.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	p := &proc{cmd: cmd, cfg: cfg, subs: map[*sub]bool{}}
	if tag != nil {
		p.tag = *tag
	}
	var outs []io.Reader
	var tty *os.File
	if pt != nil {
		ptmx, t, err := pty.Open()
		if err != nil {
			return nil, nil, err
		}
		if err := pty.Setsize(ptmx, &pty.Winsize{Cols: max(pt.Size.Cols, 1), Rows: max(pt.Size.Rows, 1)}); err != nil {
			ptmx.Close()
			t.Close()
			return nil, nil, err
		}
		tty = t
		cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Cloneflags: netFlags(isolated)}
		p.ptmx, p.stdin = ptmx, ptmx
		outs = []io.Reader{ptmx}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Cloneflags: netFlags(isolated)}
		var err error
		if withStdin {
			if p.stdin, err = cmd.StdinPipe(); err != nil {
				return nil, nil, err
			}
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return nil, nil, err
		}
		outs = []io.Reader{stdout, stderr}
	}
	closePty := func() {
		if tty != nil {
			tty.Close()
			p.ptmx.Close()
		}
	}
	s.mu.Lock()
	if s.closed || sb.state != "running" {
		s.mu.Unlock()
		closePty()
		return nil, nil, errors.New("sandbox is not running")
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		closePty()
		return nil, nil, err
	}
	if tty != nil {
		tty.Close() // the child has it; the master sees EIO once it is gone
	}
	sb.procs[uint32(cmd.Process.Pid)] = p
	su := newSub()
	p.subs[su] = true
	s.wg.Add(1)
	s.mu.Unlock()
	go s.reap(sb, p, outs...)
	return p, su, nil
}

func (s *Server) reap(sb *sbx, p *proc, outs ...io.Reader) {
	defer s.wg.Done()
	var wg sync.WaitGroup
	pump := func(r io.Reader, key string) {
		defer wg.Done()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				p.broadcast(event("data", map[string]string{key: base64.StdEncoding.EncodeToString(buf[:n])}), false)
			}
			if err != nil {
				return
			}
		}
	}
	if p.ptmx != nil {
		wg.Add(1)
		go pump(outs[0], "pty")
	} else {
		wg.Add(2)
		go pump(outs[0], "stdout")
		go pump(outs[1], "stderr")
	}
	wg.Wait()
	err := p.cmd.Wait()
	if p.ptmx != nil {
		p.ptmx.Close()
	}
	s.mu.Lock()
	delete(sb.procs, uint32(p.pid()))
	s.mu.Unlock()
	end := map[string]any{"exited": true, "status": "exit status 0"}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		end["exitCode"] = code // proto3 JSON omits a zero exit code
		end["status"] = p.cmd.ProcessState.String()
		if code < 0 {
			end["exited"] = false
		}
	}
	if err != nil && p.cmd.ProcessState == nil {
		end["error"] = err.Error()
	}
	p.broadcast(event("end", end), true)
}

type selectorJSON struct {
	Pid *uint32 `json:"pid"`
	Tag *string `json:"tag"`
}

// find resolves a selector to a live process; srv.mu is held.
func (sb *sbx) find(sel selectorJSON) *proc {
	if sel.Pid != nil {
		return sb.procs[*sel.Pid]
	}
	if sel.Tag != nil {
		for _, p := range sb.procs {
			if p.tag == *sel.Tag && !p.tagBlind {
				return p
			}
		}
	}
	return nil
}

func (s *Server) envdUnary(w http.ResponseWriter, r *http.Request, sb *sbx, method string) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		connectError(w, http.StatusUnsupportedMediaType, "unknown", "unsupported content type")
		return
	}
	var req struct {
		Process selectorJSON `json:"process"`
		Input   struct {
			Stdin *string `json:"stdin"`
			Pty   *string `json:"pty"`
		} `json:"input"`
		Signal any      `json:"signal"`
		Pty    *ptyJSON `json:"pty"`
	}
	if err := json.Unmarshal(readBody(r), &req); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	if method == "List" {
		type info struct {
			Config procConfig `json:"config"`
			Pid    int        `json:"pid"`
			Tag    string     `json:"tag,omitempty"`
		}
		var out []info
		s.mu.Lock()
		for _, p := range sb.procs {
			out = append(out, info{Config: p.cfg, Pid: p.pid(), Tag: p.tag})
		}
		s.mu.Unlock()
		if len(out) == 0 {
			writeJSON(w, http.StatusOK, map[string]any{}) // proto3 JSON omits an empty list
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"processes": out})
		return
	}
	s.mu.Lock()
	p := sb.find(req.Process)
	s.mu.Unlock()
	if p == nil {
		connectError(w, http.StatusNotFound, "not_found", "process not found")
		return
	}
	switch method {
	case "Update":
		if p.ptmx == nil {
			connectError(w, http.StatusBadRequest, "failed_precondition", "tty not assigned to process")
			return
		}
		if req.Pty != nil {
			if err := pty.Setsize(p.ptmx, &pty.Winsize{Cols: max(req.Pty.Size.Cols, 1), Rows: max(req.Pty.Size.Rows, 1)}); err != nil {
				connectError(w, http.StatusInternalServerError, "internal", "error resizing tty: "+err.Error())
				return
			}
		}
	case "SendInput":
		in := req.Input.Stdin
		if req.Input.Pty != nil {
			if p.ptmx == nil {
				connectError(w, http.StatusBadRequest, "failed_precondition", "tty not assigned to process")
				return
			}
			in = req.Input.Pty
		}
		if in == nil {
			in = new(string)
		}
		data, err := base64.StdEncoding.DecodeString(*in)
		if err != nil {
			connectError(w, http.StatusBadRequest, "invalid_argument", "bad stdin bytes")
			return
		}
		if p.stdin == nil {
			connectError(w, http.StatusBadRequest, "failed_precondition", "stdin not enabled")
			return
		}
		if _, err := p.stdin.Write(data); err != nil {
			connectError(w, http.StatusNotFound, "not_found", "process stdin closed")
			return
		}
	case "CloseStdin":
		if p.stdin != nil {
			_ = p.stdin.Close()
		}
	case "SendSignal":
		sig := syscall.SIGTERM
		if v, ok := req.Signal.(string); ok && v == "SIGNAL_SIGKILL" {
			sig = syscall.SIGKILL
		} else if v, ok := req.Signal.(float64); ok && v == 9 {
			sig = syscall.SIGKILL
		}
		// envd signals the process alone, never a group: a command's
		// children outlive a SendSignal to it.
		_ = syscall.Kill(p.pid(), sig)
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

// maxUpload bounds what one POST /files writes in all.
const maxUpload = 64 << 20

// envdFiles is envd's HTTP files API: GET /files?path= reads a file, POST
// /files writes one (an octet-stream body, gzip-encoded or not, to path)
// or several (multipart "file" parts, each to path when given, else to
// its part's file name), creating the directories above; both take the
// user as ?username=.
func (s *Server) envdFiles(w http.ResponseWriter, r *http.Request, sb *sbx) {
	q := r.URL.Query()
	if u := q.Get("username"); u != "" && u != s.opts.User {
		apiError(w, http.StatusUnauthorized, "invalid user: "+u)
		return
	}
	p := q.Get("path")
	switch r.Method {
	case http.MethodGet:
		if p == "" {
			apiError(w, http.StatusBadRequest, "path is required")
			return
		}
		sp := sb.sandboxPath(p)
		host := sb.mapPath(sp)
		if fi, err := os.Stat(host); err == nil && fi.IsDir() {
			apiError(w, http.StatusBadRequest, "path '"+sp+"' is a directory")
			return
		}
		b, err := os.ReadFile(host)
		switch {
		case errors.Is(err, os.ErrNotExist):
			apiError(w, http.StatusNotFound, "path '"+sp+"' does not exist")
		case err != nil:
			apiError(w, http.StatusBadRequest, err.Error())
		default:
			w.Header().Set("Content-Type", "application/octet-stream")
			w.Header().Set("Content-Length", strconv.Itoa(len(b)))
			_, _ = w.Write(b)
		}
	case http.MethodPost:
		type upload struct {
			path string
			data []byte
		}
		var ups []upload
		mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		switch mt {
		case "multipart/form-data":
			mr := multipart.NewReader(r.Body, params["boundary"])
			total := 0
			for {
				part, err := mr.NextPart()
				if err == io.EOF {
					break
				}
				if err != nil {
					apiError(w, http.StatusBadRequest, "bad multipart body: "+err.Error())
					return
				}
				if part.FormName() != "file" {
					continue
				}
				data, err := io.ReadAll(io.LimitReader(part, int64(maxUpload-total+1)))
				if err != nil {
					apiError(w, http.StatusBadRequest, err.Error())
					return
				}
				if total += len(data); total > maxUpload {
					apiError(w, http.StatusRequestEntityTooLarge, "upload too large")
					return
				}
				dst := p
				if dst == "" {
					// The part's file name whole: Part.FileName keeps only
					// its last element, and envd takes it as the path.
					_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
					dst = cd["filename"]
				}
				if dst == "" {
					apiError(w, http.StatusBadRequest, "no path for a file")
					return
				}
				ups = append(ups, upload{dst, data})
			}
			if len(ups) == 0 {
				apiError(w, http.StatusBadRequest, "no file field")
				return
			}
		case "application/octet-stream":
			if p == "" {
				apiError(w, http.StatusBadRequest, "path is required")
				return
			}
			var body io.Reader = bytes.NewReader(readBody(r))
			if r.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(body)
				if err != nil {
					apiError(w, http.StatusBadRequest, "bad gzip body")
					return
				}
				body = zr
			}
			data, err := io.ReadAll(io.LimitReader(body, maxUpload+1))
			if err != nil || len(data) > maxUpload {
				apiError(w, http.StatusBadRequest, "bad or too large body")
				return
			}
			ups = append(ups, upload{p, data})
		default:
			apiError(w, http.StatusBadRequest, "unsupported content type")
			return
		}
		var out []map[string]string
		for _, u := range ups {
			sp := sb.sandboxPath(u.path)
			host := sb.mapPath(sp)
			if fi, err := os.Stat(host); err == nil && fi.IsDir() {
				apiError(w, http.StatusBadRequest, "path '"+sp+"' is a directory")
				return
			}
			if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
				apiError(w, http.StatusBadRequest, err.Error())
				return
			}
			if err := os.WriteFile(host, u.data, 0o644); err != nil {
				apiError(w, http.StatusBadRequest, err.Error())
				return
			}
			out = append(out, map[string]string{"path": sp, "name": filepath.Base(sp), "type": "file"})
		}
		writeJSON(w, http.StatusOK, out)
	default:
		apiError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

// olderThan reports whether version v (x.y.z) is older than maj.min.patch.
func olderThan(v string, maj, min, patch int) bool {
	var a [3]int
	for i, part := range strings.SplitN(v, ".", 3) {
		n, err := strconv.Atoi(part)
		if err != nil {
			return true
		}
		a[i] = n
	}
	for i, b := range [3]int{maj, min, patch} {
		if a[i] != b {
			return a[i] < b
		}
	}
	return false
}

// EnforcesNetwork reports whether the fake enforces a sandbox's network
// configuration on the processes it starts: as root it does, by starting
// them in a network namespace of their own (only a loopback that is down)
// once the sandbox has a denyOut. That is a denyOut of 0.0.0.0/0 exactly,
// and stricter than E2B for an allowOut (those hosts are refused too):
// enough for a test that observes what a configuration refuses, never one
// that needs the allowed hosts. Without root processes share the host's
// network, whatever the configuration.
func (s *Server) EnforcesNetwork() bool { return os.Geteuid() == 0 }

func netFlags(isolated bool) uintptr {
	if isolated {
		return syscall.CLONE_NEWNET
	}
	return 0
}
