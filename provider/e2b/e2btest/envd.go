package e2btest

import (
	"bytes"
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
	stdin    io.WriteCloser // nil without stdin
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
	s.mu.Unlock()
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
	if r.URL.Path == "/health" {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	sb, ok := s.sandboxFor(w, r)
	if !ok {
		return
	}
	switch r.URL.Path {
	case "/process.Process/Start":
		s.envdStart(w, r, sb, f)
	case "/process.Process/CloseStdin":
		if olderThan(sb.envdVersion, 0, 5, 2) {
			// Before 0.5.2 envd has no such method.
			connectError(w, http.StatusNotFound, "unimplemented", "process.Process/CloseStdin is not implemented")
			return
		}
		s.envdUnary(w, r, sb, "CloseStdin")
	case "/process.Process/List", "/process.Process/SendInput", "/process.Process/SendSignal":
		s.envdUnary(w, r, sb, strings.TrimPrefix(r.URL.Path, "/process.Process/"))
	case "/files":
		s.envdFiles(w, r, sb)
	case "/filesystem.Filesystem/ListDir":
		s.envdListDir(w, r, sb)
	default:
		connectError(w, http.StatusNotFound, "unimplemented", "no such method")
	}
}

func (s *Server) envdStart(w http.ResponseWriter, r *http.Request, sb *sbx, f *Fault) {
	if ct := r.Header.Get("Content-Type"); ct != "application/connect+json" {
		connectError(w, http.StatusUnsupportedMediaType, "unknown", "unsupported content type "+ct)
		return
	}
	body := readBody(r)
	if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		connectError(w, http.StatusBadRequest, "invalid_argument", "bad request envelope")
		return
	}
	var req struct {
		Process procConfig `json:"process"`
		Tag     *string    `json:"tag"`
		Stdin   *bool      `json:"stdin"`
	}
	if err := json.Unmarshal(body[5:], &req); err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/connect+json")
	w.WriteHeader(http.StatusOK)
	fl, _ := w.(http.Flusher)
	write := func(flag byte, payload []byte) bool {
		if _, err := w.Write(envelope(flag, payload)); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	// envd before 0.3.0 has no stdin field: every process gets a stdin.
	withStdin := req.Stdin == nil || *req.Stdin || olderThan(sb.envdVersion, 0, 3, 0)
	p, sub, err := s.spawn(sb, req.Process, req.Tag, withStdin)
	if err != nil {
		b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": "internal", "message": "error starting process: " + err.Error()}})
		write(2, b)
		return
	}
	defer p.unsubscribe(sub)
	write(0, event("start", map[string]any{"pid": p.pid()}))
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
	for {
		select {
		case <-r.Context().Done():
			return
		case <-s.closing:
			return
		case <-sub.cut:
			panic(http.ErrAbortHandler) // the connection dies with the VM's snapshot
		case <-tick.C:
			if !write(0, event("keepalive", map[string]any{})) {
				return
			}
		case <-sub.wake:
			msgs, ended := sub.take()
			for _, m := range msgs {
				if f != nil && f.NoEnd && strings.Contains(string(m), `"end"`) && strings.HasPrefix(string(m), `{"event":{"end"`) {
					continue
				}
				if !write(0, m) {
					return
				}
			}
			if ended {
				write(2, []byte("{}"))
				return
			}
		}
	}
}

// spawn starts a real process for a Start request and subscribes the
// caller to it.
func (s *Server) spawn(sb *sbx, cfg procConfig, tag *string, withStdin bool) (*proc, *sub, error) {
	if cfg.Cmd == "" {
		return nil, nil, errors.New("empty cmd")
	}
	cmd := exec.Command(cfg.Cmd, cfg.Args...)
	cmd.Dir = sb.home
	if cfg.Cwd != nil && *cfg.Cwd != "" {
		cmd.Dir = sb.mapPath(*cfg.Cwd)
	}
	cmd.Env = []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + sb.home, "USER=" + s.opts.User, "LANG=C.UTF-8",
		"E2B_SANDBOX=true", "E2B_SANDBOX_ID=" + sb.id,
		"MANAGOAT_JOURNAL_DIR=" + sb.journal,
	}
	for k, v := range cfg.Envs {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p := &proc{cmd: cmd, cfg: cfg, subs: map[*sub]bool{}}
	if tag != nil {
		p.tag = *tag
	}
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
	s.mu.Lock()
	if s.closed || sb.state != "running" {
		s.mu.Unlock()
		return nil, nil, errors.New("sandbox is not running")
	}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return nil, nil, err
	}
	sb.procs[uint32(cmd.Process.Pid)] = p
	su := newSub()
	p.subs[su] = true
	s.wg.Add(1)
	s.mu.Unlock()
	go s.reap(sb, p, stdout, stderr)
	return p, su, nil
}

func (s *Server) reap(sb *sbx, p *proc, stdout, stderr io.Reader) {
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
	wg.Add(2)
	go pump(stdout, "stdout")
	go pump(stderr, "stderr")
	wg.Wait()
	err := p.cmd.Wait()
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
			Stdin string `json:"stdin"`
		} `json:"input"`
		Signal any `json:"signal"`
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
	case "SendInput":
		data, err := base64.StdEncoding.DecodeString(req.Input.Stdin)
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

func (s *Server) envdFiles(w http.ResponseWriter, r *http.Request, sb *sbx) {
	path := r.URL.Query().Get("path")
	if path == "" {
		apiError(w, http.StatusBadRequest, "path is required")
		return
	}
	if u := r.URL.Query().Get("username"); u != "" && u != s.opts.User {
		apiError(w, http.StatusUnauthorized, "invalid user: "+u)
		return
	}
	host := sb.mapPath(path)
	switch r.Method {
	case http.MethodGet:
		b, err := os.ReadFile(host)
		switch {
		case errors.Is(err, os.ErrNotExist):
			apiError(w, http.StatusNotFound, "path '"+path+"' does not exist")
		case err != nil:
			apiError(w, http.StatusBadRequest, err.Error())
		default:
			w.Header().Set("Content-Type", "application/octet-stream")
			_, _ = w.Write(b)
		}
	case http.MethodPost:
		var data []byte
		mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		switch mt {
		case "multipart/form-data":
			mr := multipart.NewReader(r.Body, params["boundary"])
			for {
				part, err := mr.NextPart()
				if err != nil {
					apiError(w, http.StatusBadRequest, "no file field")
					return
				}
				if part.FormName() == "file" {
					data, err = io.ReadAll(io.LimitReader(part, 64<<20))
					if err != nil {
						apiError(w, http.StatusBadRequest, err.Error())
						return
					}
					break
				}
			}
		case "application/octet-stream":
			data = readBody(r)
		default:
			apiError(w, http.StatusBadRequest, "unsupported content type")
			return
		}
		if err := os.MkdirAll(filepath.Dir(host), 0o755); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		if err := os.WriteFile(host, data, 0o644); err != nil {
			apiError(w, http.StatusBadRequest, err.Error())
			return
		}
		writeJSON(w, http.StatusOK, []map[string]string{{"path": path, "name": filepath.Base(path), "type": "file"}})
	default:
		apiError(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (s *Server) envdListDir(w http.ResponseWriter, r *http.Request, sb *sbx) {
	var req struct {
		Path string `json:"path"`
	}
	if err := json.Unmarshal(readBody(r), &req); err != nil || req.Path == "" {
		connectError(w, http.StatusBadRequest, "invalid_argument", "path is required")
		return
	}
	des, err := os.ReadDir(sb.mapPath(req.Path))
	if errors.Is(err, os.ErrNotExist) {
		connectError(w, http.StatusNotFound, "not_found", "directory not found")
		return
	} else if err != nil {
		connectError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return
	}
	var entries []map[string]any
	for _, de := range des {
		info, err := de.Info()
		if err != nil {
			continue
		}
		typ := "FILE_TYPE_FILE"
		if de.IsDir() {
			typ = "FILE_TYPE_DIRECTORY"
		}
		entries = append(entries, map[string]any{
			"name": de.Name(), "type": typ, "path": filepath.Join(req.Path, de.Name()),
			"size": strconv.FormatInt(info.Size(), 10), // proto3 JSON renders int64 as a string
			"mode": uint32(info.Mode().Perm()), "modifiedTime": info.ModTime().UTC().Format(time.RFC3339Nano),
		})
	}
	if len(entries) == 0 {
		writeJSON(w, http.StatusOK, map[string]any{})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": entries})
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
