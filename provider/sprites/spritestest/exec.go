package spritestest

import (
	"context"
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
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/creack/pty"
)

// DropCommand is the built-in command that prints its arguments and then
// closes its session's connections without an exit frame.
const DropCommand = "spritestest-drop"

const (
	frameStdin  = 0
	frameStdout = 1
	frameStderr = 2
	frameExit   = 3
	frameEOF    = 4
	frameText   = 255 // a JSON text message in the log (port notices)
)

type frame struct {
	stream byte
	data   []byte
}

// session is one exec session: a process and its append-only output log,
// which every connection (the spawner and each attacher) reads from byte
// zero at its own pace.
type session struct {
	id      string
	command string
	workdir string
	created time.Time
	tty     bool
	// grace is max_run_after_disconnect: how long the process may run once
	// its creator's connection is gone; 0 is forever.
	grace time.Duration

	mu      sync.Mutex
	log     []frame
	changed chan struct{}
	ended   bool
	code    int
	dropped bool
	last    time.Time
	viewers int
	stdin   io.WriteCloser
	stdinOK bool
	ptmx    *os.File
	pid     int
	exited  chan struct{}
}

func newSession(id string) *session {
	now := time.Now().UTC()
	return &session{id: id, created: now, last: now, changed: make(chan struct{}), exited: make(chan struct{})}
}

func (ss *session) append(stream byte, p []byte) {
	if len(p) == 0 {
		return
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.ended {
		return
	}
	ss.log = append(ss.log, frame{stream, append([]byte(nil), p...)})
	ss.last = time.Now().UTC()
	close(ss.changed)
	ss.changed = make(chan struct{})
}

func (ss *session) end(code int, dropped bool) {
	ss.mu.Lock()
	if !ss.ended {
		ss.ended, ss.code, ss.dropped = true, code, dropped
		close(ss.changed)
		ss.changed = make(chan struct{})
		select {
		case <-ss.exited:
		default:
			close(ss.exited)
		}
	}
	ss.mu.Unlock()
}

// signal sends sig to the session's process group.
func (ss *session) signal(sig syscall.Signal) {
	ss.mu.Lock()
	pid, ended := ss.pid, ss.ended
	ss.mu.Unlock()
	if pid > 0 && !ended {
		_ = syscall.Kill(-pid, sig)
	}
}

func (ss *session) kill() {
	ss.signal(syscall.SIGKILL)
	ss.mu.Lock()
	if ss.pid == 0 && !ss.ended {
		ss.mu.Unlock()
		ss.end(0, true)
		return
	}
	ss.mu.Unlock()
}

type logWriter struct {
	ss     *session
	stream byte
}

func (w logWriter) Write(p []byte) (int, error) { w.ss.append(w.stream, p); return len(p), nil }

// NotifyPort makes the session announce a listening port, as Sprites does
// with a {"type":"port"} text message; it reaches every connection.
func (s *Server) NotifyPort(name, sessionID string, port int) bool {
	s.mu.Lock()
	sp, ok := s.sprites[name]
	var ss *session
	if ok {
		ss = sp.sessions[sessionID]
	}
	s.mu.Unlock()
	if ss == nil {
		return false
	}
	b, _ := json.Marshal(map[string]any{"type": "port", "port": port})
	ss.append(frameText, b)
	return true
}

// SessionRunning reports whether the session's process is still running.
func (s *Server) SessionRunning(name, sessionID string) bool {
	s.mu.Lock()
	sp, ok := s.sprites[name]
	var ss *session
	if ok {
		ss = sp.sessions[sessionID]
	}
	s.mu.Unlock()
	if ss == nil {
		return false
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return !ss.ended
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return 255
	}
	if st, ok := ps.Sys().(syscall.WaitStatus); ok && st.Signaled() {
		return 128 + int(st.Signal())
	}
	return ps.ExitCode()
}

type startReq struct {
	argv       []string
	dir        string
	env        []string
	stdin      bool
	tty        bool
	rows, cols int
}

// start launches the session's process (or the built-in drop command).
func (s *Server) start(sp *sprite, ss *session, req startReq) {
	dir, err := s.ensureDir(sp)
	if err != nil {
		ss.append(frameStderr, []byte("spritestest: no sprite directory\n"))
		ss.end(127, false)
		return
	}
	if req.dir != "" {
		if filepath.IsAbs(req.dir) {
			dir = req.dir
		} else {
			dir = filepath.Join(dir, req.dir)
		}
	}
	ss.mu.Lock()
	ss.workdir = dir
	ss.mu.Unlock()
	if req.argv[0] == DropCommand {
		ss.append(frameStdout, []byte(strings.Join(req.argv[1:], " ")+"\n"))
		ss.end(0, true)
		return
	}
	cmd := exec.Command(req.argv[0], req.argv[1:]...)
	cmd.Dir = dir
	if s.isolated(sp) {
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET}
	}
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + sp.dir, "USER=sprite", "LANG=C.UTF-8"}, req.env...)
	fail := func(err error) {
		ss.append(frameStderr, []byte("spritestest: cannot start "+req.argv[0]+": "+err.Error()+"\n"))
		ss.end(127, false)
	}
	if req.tty {
		cmd.Env = append(cmd.Env, "TERM=xterm")
		ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: uint16(req.rows), Cols: uint16(req.cols)})
		if err != nil {
			fail(err)
			return
		}
		ss.mu.Lock()
		ss.ptmx, ss.stdin, ss.stdinOK, ss.pid = ptmx, ptmx, req.stdin, cmd.Process.Pid
		ss.mu.Unlock()
		readDone := make(chan struct{})
		s.wg.Add(2)
		go func() {
			defer s.wg.Done()
			defer close(readDone)
			_, _ = io.Copy(logWriter{ss, frameStdout}, ptmx)
		}()
		go func() {
			defer s.wg.Done()
			_ = cmd.Wait()
			select {
			case <-readDone:
			case <-time.After(500 * time.Millisecond):
			}
			_ = ptmx.Close()
			<-readDone
			ss.end(exitCode(cmd.ProcessState), false)
		}()
		return
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	cmd.Stdout = logWriter{ss, frameStdout}
	cmd.Stderr = logWriter{ss, frameStderr}
	cmd.WaitDelay = 500 * time.Millisecond
	var stdin io.WriteCloser
	if req.stdin {
		if stdin, err = cmd.StdinPipe(); err != nil {
			fail(err)
			return
		}
	}
	if err := cmd.Start(); err != nil {
		fail(err)
		return
	}
	ss.mu.Lock()
	ss.stdin, ss.stdinOK, ss.pid = stdin, req.stdin, cmd.Process.Pid
	ss.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = cmd.Wait()
		ss.end(exitCode(cmd.ProcessState), false)
	}()
}

func (s *Server) listSessions(w http.ResponseWriter, sp *sprite) {
	s.mu.Lock()
	list := make([]*session, 0, len(sp.sessions))
	for _, ss := range sp.sessions {
		list = append(list, ss)
	}
	s.mu.Unlock()
	out := []map[string]any{}
	for _, ss := range list {
		ss.mu.Lock()
		out = append(out, map[string]any{"id": ss.id, "command": ss.command, "workdir": ss.workdir,
			"created": ss.created.Format(time.RFC3339Nano), "bytes_per_second": 0, "is_active": ss.viewers > 0,
			"last_activity": ss.last.Format(time.RFC3339Nano), "tty": ss.tty})
		ss.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

// execWS serves the exec WebSocket: a new command, or an attach by
// /exec/{id}, ?session_id= or ?id=.
//
// A new command's session is Sprites': its id is its process's PID, so it
// exists (is listed, can be attached or killed) only once the process has
// started, which is after the upgrade; its first message is session_info
// with that id. Options.StartDelay widens the gap between the upgrade and
// the process. max_run_after_disconnect (a duration; 0 is forever) bounds
// how long the process runs once its creator's connection is gone; a TTY
// session runs forever by default, any other for
// Options.MaxRunAfterDisconnect (10 s). The retired detachable parameter is
// ignored.
func (s *Server) execWS(w http.ResponseWriter, r *http.Request, sp *sprite, pathID string) {
	q := r.URL.Query()
	id := pathID
	if id == "" {
		id = q.Get("session_id")
	}
	if id == "" {
		id = q.Get("id")
	}
	stdin := q.Get("stdin") == "true"
	var ss *session
	var req startReq
	creator := false
	if id != "" {
		s.mu.Lock()
		ss = sp.sessions[id]
		s.mu.Unlock()
		if ss == nil {
			apiError(w, http.StatusNotFound, "not_found", "session not found")
			return
		}
	} else {
		argv := q["cmd"]
		if len(argv) == 0 && q.Get("path") != "" {
			argv = []string{q.Get("path")}
		}
		if len(argv) == 0 || argv[0] == "" {
			apiError(w, http.StatusBadRequest, "invalid_request", "cmd is required")
			return
		}
		rows, _ := strconv.Atoi(q.Get("rows"))
		cols, _ := strconv.Atoi(q.Get("cols"))
		if rows <= 0 {
			rows = 24
		}
		if cols <= 0 {
			cols = 80
		}
		req = startReq{argv: argv, dir: q.Get("dir"), env: q["env"], stdin: stdin, tty: q.Get("tty") == "true",
			rows: rows, cols: cols}
		grace := s.opts.MaxRunAfterDisconnect
		if req.tty {
			grace = 0
		}
		if v := q.Get("max_run_after_disconnect"); v != "" {
			d, err := parseGrace(v)
			if err != nil {
				apiError(w, http.StatusBadRequest, "invalid_request", "bad max_run_after_disconnect")
				return
			}
			grace = d
		}
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			apiError(w, http.StatusServiceUnavailable, "unavailable", "shutting down")
			return
		}
		ss = newSession("")
		ss.command = strings.Join(req.argv, " ")
		ss.tty, ss.grace = req.tty, grace
		ss.viewers++ // counted before the process can end, so the session stays listed
		creator = true
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if creator {
		if err != nil {
			return // never started
		}
		if d := s.opts.StartDelay; d > 0 {
			select {
			case <-time.After(d):
			case <-s.ctx.Done():
			}
		}
		s.start(sp, ss, req)
		ss.mu.Lock()
		pid := ss.pid
		ss.mu.Unlock()
		s.mu.Lock()
		if pid > 0 {
			ss.id = strconv.Itoa(pid)
		} else {
			// The built-in drop command, or a command that could not
			// start: no process, an id no PID takes.
			s.nextSess++
			ss.id = strconv.Itoa(noPID + s.nextSess)
		}
		sp.sessions[ss.id] = ss
		s.mu.Unlock()
	} else {
		ss.mu.Lock()
		ss.viewers++
		ss.mu.Unlock()
	}
	defer s.leave(sp, ss, creator)
	if err != nil {
		return
	}
	conn.SetReadLimit(8 << 20)
	ctx, cancel := context.WithCancel(s.ctx)
	defer cancel()
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel()
		s.readClient(ctx, conn, ss, stdin)
	}()
	s.view(ctx, conn, ss, creator)
	cancel()
	_ = conn.CloseNow()
	<-readDone
}

// noPID is above Linux's largest pid_max: ids from here on are never a
// process's.
const noPID = 1 << 22

// parseGrace parses max_run_after_disconnect: a Go duration, or a bare
// number of seconds ("0" is forever).
func parseGrace(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, errors.New("bad duration")
	}
	return d, nil
}

// leave drops a connection. When the creator's connection goes, a session
// with a grace (max_run_after_disconnect) is killed once the grace has
// passed, and forgotten once it ended; a session without one runs on and
// stays listed.
func (s *Server) leave(sp *sprite, ss *session, creator bool) {
	ss.mu.Lock()
	ss.viewers--
	ended, grace := ss.ended, ss.grace
	ss.mu.Unlock()
	if !creator || grace == 0 {
		return
	}
	forget := func() {
		s.mu.Lock()
		if sp.sessions[ss.id] == ss {
			delete(sp.sessions, ss.id)
		}
		s.mu.Unlock()
	}
	if ended {
		forget()
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-ss.exited:
		case <-t.C:
			ss.kill()
			select {
			case <-ss.exited:
			case <-time.After(5 * time.Second):
			}
		case <-s.ctx.Done():
			return
		}
		forget()
	}()
}

// view sends session_info, then the log from byte zero, then tails it;
// at the end it sends the exit (or, for a dropped session, only closes).
func (s *Server) view(ctx context.Context, conn *websocket.Conn, ss *session, owner bool) {
	// session_id is the process's PID, a JSON number, as Sprites sends it.
	var sid any = ss.id
	if n, err := strconv.Atoi(ss.id); err == nil {
		sid = n
	}
	info, _ := json.Marshal(map[string]any{"type": "session_info", "session_id": sid, "command": ss.command,
		"created": ss.created.Unix(), "is_owner": owner, "tty": ss.tty})
	if conn.Write(ctx, websocket.MessageText, info) != nil {
		return
	}
	idx := 0
	for {
		ss.mu.Lock()
		frames := ss.log[idx:]
		ended, code, dropped, changed := ss.ended, ss.code, ss.dropped, ss.changed
		ss.mu.Unlock()
		for _, f := range frames {
			var err error
			switch {
			case f.stream == frameText:
				err = conn.Write(ctx, websocket.MessageText, f.data)
			case ss.tty:
				err = conn.Write(ctx, websocket.MessageBinary, f.data)
			default:
				err = conn.Write(ctx, websocket.MessageBinary, append([]byte{f.stream}, f.data...))
			}
			if err != nil {
				return
			}
		}
		idx += len(frames)
		if ended {
			if !dropped {
				var err error
				if ss.tty {
					b, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": code})
					err = conn.Write(ctx, websocket.MessageText, b)
				} else {
					err = conn.Write(ctx, websocket.MessageBinary, []byte{frameExit, byte(code)})
				}
				if err != nil {
					return
				}
			}
			_ = conn.Close(websocket.StatusNormalClosure, "")
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return
		}
	}
}

// readClient applies the client's frames: stdin, stdin EOF, resize.
func (s *Server) readClient(ctx context.Context, conn *websocket.Conn, ss *session, stdinOn bool) {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		ss.mu.Lock()
		in, ok, ptmx, tty := ss.stdin, ss.stdinOK && stdinOn, ss.ptmx, ss.tty
		ss.mu.Unlock()
		if typ == websocket.MessageText {
			var m struct {
				Type       string `json:"type"`
				Rows, Cols uint16
			}
			if json.Unmarshal(data, &m) == nil && m.Type == "resize" && ptmx != nil {
				_ = pty.Setsize(ptmx, &pty.Winsize{Rows: m.Rows, Cols: m.Cols})
			}
			continue
		}
		if !ok || in == nil {
			continue
		}
		if tty {
			_, _ = in.Write(data)
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case frameStdin:
			_, _ = in.Write(data[1:])
		case frameEOF:
			_ = in.Close()
		}
	}
}

// kill serves POST …/exec/{id}/kill?signal=&timeout= with NDJSON events.
func (s *Server) kill(w http.ResponseWriter, r *http.Request, sp *sprite, id string) {
	s.mu.Lock()
	ss := sp.sessions[id]
	s.mu.Unlock()
	if ss == nil {
		apiError(w, http.StatusNotFound, "not_found", "session not found")
		return
	}
	sig := syscall.SIGTERM
	name := r.URL.Query().Get("signal")
	switch name {
	case "", "SIGTERM", "TERM":
		name = "SIGTERM"
	case "SIGKILL", "KILL":
		sig, name = syscall.SIGKILL, "SIGKILL"
	case "SIGINT", "INT":
		sig, name = syscall.SIGINT, "SIGINT"
	default:
		apiError(w, http.StatusBadRequest, "invalid_request", "unknown signal")
		return
	}
	timeout := 10 * time.Second
	if t := r.URL.Query().Get("timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d < 0 {
			apiError(w, http.StatusBadRequest, "invalid_request", "bad timeout")
			return
		}
		timeout = min(d, 30*time.Second)
	}
	ss.mu.Lock()
	pid, ended, dropped := ss.pid, ss.ended, ss.dropped
	ss.mu.Unlock()
	if dropped || pid == 0 {
		apiError(w, http.StatusNotFound, "not_found", "session not found")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	if !ended {
		_ = enc.Encode(map[string]any{"type": "signal", "signal": name, "pid": pid})
		flush()
		ss.signal(sig)
		t := time.NewTimer(timeout)
		select {
		case <-ss.exited:
			_ = enc.Encode(map[string]any{"type": "exited", "pid": pid})
		case <-t.C:
			_ = enc.Encode(map[string]any{"type": "timeout"})
			flush()
			ss.signal(syscall.SIGKILL)
			select {
			case <-ss.exited:
				_ = enc.Encode(map[string]any{"type": "killed", "pid": pid})
			case <-time.After(5 * time.Second):
				_ = enc.Encode(map[string]any{"type": "error", "error": "process did not die"})
				return
			}
		}
		t.Stop()
	} else {
		_ = enc.Encode(map[string]any{"type": "exited", "pid": pid})
	}
	ss.mu.Lock()
	code := ss.code
	ss.mu.Unlock()
	_ = enc.Encode(map[string]any{"type": "complete", "exit_code": code})
	// The session stays: an attach still replays its output and its exit.
}

var errNoDir = errors.New("no sprite directory")

func (s *Server) spriteDir(sp *sprite) (string, error) {
	d, err := s.ensureDir(sp)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNoDir, err)
	}
	return d, nil
}

// EnforcesPolicy reports whether the fake enforces a sprite's network
// policy on the commands it runs: as root it does, by running them in a
// network namespace of their own that holds only a loopback that is down,
// so nothing outside is reached. That is deny-all exactly, and stricter
// than Sprites for an allow list (the listed domains are refused too):
// enough for a test that observes what a policy refuses, never one that
// needs the allowed hosts. Without root the commands share the host's
// network, whatever the policy.
func (s *Server) EnforcesPolicy() bool { return os.Geteuid() == 0 }

// isolated reports whether sp's commands get no network: a policy has
// been applied that is not one allow rule for every domain.
func (s *Server) isolated(sp *sprite) bool {
	if !s.EnforcesPolicy() {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return sp.closed
}
