package daytonatest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The toolbox: commands, sessions and their logs, uploads and downloads.

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
