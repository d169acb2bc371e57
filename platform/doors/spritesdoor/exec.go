package spritesdoor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/sandbox"
)

// The exec protocol's binary stream ids.
const (
	frameStdin  = 0
	frameStdout = 1
	frameStderr = 2
	frameExit   = 3
	frameEOF    = 4
)

// defaultGrace is how long a non-TTY session runs once its creator's
// socket is gone, when the request names no max_run_after_disconnect.
const defaultGrace = 10 * time.Second

// httpFrameGap spaces the frames of an HTTP exec answer: the SDK takes
// each read of the body for one frame, and Node's fetch hands chunks that
// arrived together over in one read.
const httpFrameGap = 25 * time.Millisecond

// writeTimeout bounds one message's write to the client: a client that
// takes nothing for as long is gone (its stream detached, the session
// runs on as after a disconnect).
const writeTimeout = time.Minute

// write sends one message within writeTimeout.
func write(ctx context.Context, conn *websocket.Conn, typ websocket.MessageType, b []byte) error {
	ctx, cancel := context.WithTimeout(ctx, writeTimeout)
	defer cancel()
	return conn.Write(ctx, typ, b)
}

// grace is a session's run-on after its creator left.
type grace struct{ stop chan struct{} }

// exitByte is the exit frame's code: Sprites sends one byte.
func exitByte(code int) byte {
	if code < 0 || code > 255 {
		return 255
	}
	return byte(code)
}

// parseGrace parses max_run_after_disconnect: a Go duration, or a bare
// number of seconds; 0 is forever.
func parseGrace(v string) (time.Duration, error) {
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second, nil
	}
	g, err := time.ParseDuration(v)
	if err != nil || g < 0 {
		return 0, errors.New("bad duration")
	}
	return g, nil
}

var signals = map[string]syscall.Signal{
	"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP,
	"QUIT": syscall.SIGQUIT, "USR1": syscall.SIGUSR1, "USR2": syscall.SIGUSR2, "STOP": syscall.SIGSTOP, "CONT": syscall.SIGCONT,
}

// signalOf is a signal by its name, with or without SIG.
func signalOf(name string) (syscall.Signal, string, bool) {
	n := strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(name)), "SIG")
	if n == "" {
		n = "TERM"
	}
	s, ok := signals[n]
	return s, "SIG" + n, ok
}

// execWS serves the exec WebSocket: a new command, or an attach to the
// session pathID (or ?session_id=, ?id=).
func (c *call) execWS(w http.ResponseWriter, r *http.Request, pathID string) {
	q := r.URL.Query()
	id := pathID
	if id == "" {
		id = q.Get("session_id")
	}
	if id == "" {
		id = q.Get("id")
	}
	if q.Get("cc") == "true" {
		unsupported(w, "the control connection")
		return
	}
	stdin := q.Get("stdin") == "true"
	var (
		cmd     *sandbox.Command
		tty     bool
		command string
		created = time.Now()
		owner   bool
		g       time.Duration
	)
	if id != "" {
		ss, err := c.p.ListSessions(r.Context(), c.h)
		if err != nil {
			fail(w, err, "sprite not found")
			return
		}
		var found *sandbox.Session
		for i := range ss {
			if ss[i].ID == id {
				found = &ss[i]
			}
		}
		if found == nil {
			apiErr(w, http.StatusNotFound, "not_found", "session not found")
			return
		}
		tty, command = found.TTY, found.Command
		if !found.CreatedAt.IsZero() {
			created = found.CreatedAt
		}
		cmd, err = c.p.Attach(r.Context(), c.h, id, sandbox.AttachOptions{Stdin: stdin || tty})
		if err != nil {
			fail(w, err, "session not found")
			return
		}
	} else {
		argv := q["cmd"]
		if len(argv) == 0 && q.Get("path") != "" {
			argv = []string{q.Get("path")}
		}
		if len(argv) == 0 || argv[0] == "" {
			apiErr(w, http.StatusBadRequest, "invalid_request", "cmd is required")
			return
		}
		tty = q.Get("tty") == "true"
		rows, _ := strconv.Atoi(q.Get("rows"))
		cols, _ := strconv.Atoi(q.Get("cols"))
		g = defaultGrace
		if tty {
			g = 0
		}
		if v := q.Get("max_run_after_disconnect"); v != "" {
			var err error
			if g, err = parseGrace(v); err != nil {
				apiErr(w, http.StatusBadRequest, "invalid_request", "bad max_run_after_disconnect")
				return
			}
		}
		o := sandbox.SpawnOptions{Env: q["env"], Dir: q.Get("dir"), Stdin: stdin || tty, TTY: tty, Detachable: true}
		if tty {
			o.TTYRows, o.TTYCols = max(rows, 0), max(cols, 0)
		}
		var err error
		cmd, err = c.p.Spawn(r.Context(), c.h, sandbox.Cmd{Name: argv[0], Args: argv[1:]}, o)
		if err != nil {
			fail(w, err, "sprite not found")
			return
		}
		id, command, owner = cmd.SessionID, strings.Join(argv, " "), true
	}
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		_ = cmd.Stop()
		if owner {
			c.runOn(id, g)
		}
		return
	}
	conn.SetReadLimit(8 << 20)
	ended := c.stream(conn, cmd, id, command, created, tty, owner, stdin || tty)
	if owner && !ended {
		c.runOn(id, g)
	}
}

// stream carries cmd over conn until it ends, the client goes or the door
// closes; it reports whether the command's end was seen.
func (c *call) stream(conn *websocket.Conn, cmd *sandbox.Command, id, command string, created time.Time, tty, owner, stdin bool) bool {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	defer func() { _ = conn.CloseNow() }()
	go func() {
		select {
		case <-c.d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	var sid any = id
	if n, err := strconv.Atoi(id); err == nil {
		sid = n
	}
	info, _ := json.Marshal(map[string]any{"type": "session_info", "session_id": sid, "command": command,
		"created": created.Unix(), "is_owner": owner, "tty": tty})
	if write(ctx, conn, websocket.MessageText, info) != nil {
		_ = cmd.Stop()
		return false
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		defer cancel()
		c.readClient(ctx, conn, cmd, tty, stdin)
	}()
	defer func() { cancel(); <-readDone }()
	evs := cmd.Events()
	for {
		select {
		case ev, ok := <-evs:
			if !ok {
				return true
			}
			var err error
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
				switch {
				case tty:
					err = write(ctx, conn, websocket.MessageBinary, ev.Data)
				case ev.Kind == sandbox.Stdout:
					err = write(ctx, conn, websocket.MessageBinary, append([]byte{frameStdout}, ev.Data...))
				default:
					err = write(ctx, conn, websocket.MessageBinary, append([]byte{frameStderr}, ev.Data...))
				}
			case sandbox.Exit:
				if tty {
					b, _ := json.Marshal(map[string]any{"type": "exit", "exit_code": ev.Code})
					err = write(ctx, conn, websocket.MessageText, b)
				} else {
					err = write(ctx, conn, websocket.MessageBinary, []byte{frameExit, exitByte(ev.Code)})
				}
				if err == nil {
					// The SDK reads a TTY's exit from the close code
					// alone (1000 is 0, any other 1): a non-zero exit
					// closes with 4000 + its code (private use).
					st := websocket.StatusNormalClosure
					if tty && ev.Code != 0 {
						st = websocket.StatusCode(4000 + int(exitByte(ev.Code)))
					}
					_ = conn.Close(st, "")
				}
				return true
			default:
				// The stream ended with no exit known: the socket closes
				// with no exit frame, as Sprites' does.
				_ = conn.Close(websocket.StatusInternalError, "the command's stream ended without an exit")
				return true
			}
			if err != nil {
				_ = cmd.Stop()
				return false
			}
		case <-ctx.Done():
			_ = cmd.Stop()
			return false
		}
	}
}

// readClient applies the client's messages: stdin, stdin EOF, resize,
// signal.
func (c *call) readClient(ctx context.Context, conn *websocket.Conn, cmd *sandbox.Command, tty, stdin bool) {
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			return
		}
		if typ == websocket.MessageText {
			var m struct {
				Type       string `json:"type"`
				Rows, Cols int
				Signal     string `json:"signal"`
			}
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "resize":
				if tty && m.Rows > 0 && m.Cols > 0 {
					_ = c.p.ResizeTTY(ctx, cmd, m.Rows, m.Cols)
				}
			case "signal":
				if sig, _, ok := signalOf(m.Signal); ok {
					_ = c.p.SignalCommand(ctx, cmd, sig)
				}
			}
			continue
		}
		if !stdin {
			continue
		}
		if tty {
			_ = c.p.WriteStdin(ctx, cmd, data)
			continue
		}
		if len(data) == 0 {
			continue
		}
		switch data[0] {
		case frameStdin:
			if len(data) > 1 {
				_ = c.p.WriteStdin(ctx, cmd, data[1:])
			}
		case frameEOF:
			_ = c.p.CloseStdin(ctx, cmd)
		}
	}
}

// runOn lets session id run for g once its creator's socket is gone, then
// terminates it through /v1 as the key that made it; g 0 is forever.
func (c *call) runOn(id string, g time.Duration) {
	if g <= 0 || id == "" {
		return
	}
	d := c.d
	gr := &grace{stop: make(chan struct{})}
	d.mu.Lock()
	if d.closing() {
		d.mu.Unlock()
		return
	}
	d.graces[gr] = struct{}{}
	d.wg.Add(1)
	d.mu.Unlock()
	key, h := c.key, c.h
	go func() {
		defer d.wg.Done()
		defer func() { d.mu.Lock(); delete(d.graces, gr); d.mu.Unlock() }()
		t := time.NewTimer(g)
		defer t.Stop()
		select {
		case <-t.C:
		case <-d.done:
			return
		}
		p, err := d.api.ClientFor(nil, key)
		if err != nil {
			return
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go func() {
			select {
			case <-d.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		_ = p.TerminateSession(ctx, h, id, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 10 * time.Second})
	}()
}

func (c *call) listSessions(w http.ResponseWriter, r *http.Request) {
	ss, err := c.p.ListSessions(r.Context(), c.h)
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	out := []map[string]any{}
	for _, s := range ss {
		created, last := s.CreatedAt, s.LastActivityAt
		if created.IsZero() {
			created = time.Now()
		}
		if last.IsZero() {
			last = created
		}
		out = append(out, map[string]any{"id": s.ID, "command": s.Command, "workdir": "",
			"created": created.UTC().Format(time.RFC3339Nano), "bytes_per_second": 0, "is_active": s.State == "" || s.State == sandbox.SessionRunning,
			"last_activity": last.UTC().Format(time.RFC3339Nano), "tty": s.TTY})
	}
	writeJSON(w, http.StatusOK, map[string]any{"sessions": out})
}

// kill serves POST …/exec/{id}/kill?signal=&timeout= with NDJSON events:
// signal, then exited (or timeout and killed), then complete with the
// exit code.
func (c *call) kill(w http.ResponseWriter, r *http.Request, id string) {
	q := r.URL.Query()
	sig, name, ok := signalOf(q.Get("signal"))
	if !ok {
		apiErr(w, http.StatusBadRequest, "invalid_request", "unknown signal")
		return
	}
	timeout := 10 * time.Second
	if t := q.Get("timeout"); t != "" {
		v, err := time.ParseDuration(t)
		if err != nil || v < 0 {
			apiErr(w, http.StatusBadRequest, "invalid_request", "bad timeout")
			return
		}
		timeout = min(v, 30*time.Second)
	}
	ss, err := c.p.ListSessions(r.Context(), c.h)
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	var found *sandbox.Session
	for i := range ss {
		if ss[i].ID == id {
			found = &ss[i]
		}
	}
	if found == nil {
		apiErr(w, http.StatusNotFound, "not_found", "session not found")
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	emit := func(v map[string]any) { _ = enc.Encode(v); _ = rc.Flush() }
	if found.State == sandbox.SessionExited {
		emit(map[string]any{"type": "exited"})
		emit(map[string]any{"type": "complete", "exit_code": found.ExitCode})
		return
	}
	att, err := c.p.Attach(r.Context(), c.h, id, sandbox.AttachOptions{})
	if err != nil {
		emit(map[string]any{"type": "error", "message": err.Error()})
		return
	}
	defer func() { _ = att.Stop() }()
	emit(map[string]any{"type": "signal", "signal": name})
	if sig == syscall.SIGKILL {
		err = c.p.TerminateSession(r.Context(), c.h, id, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: timeout})
	} else {
		err = c.p.SignalCommand(r.Context(), att, sig)
	}
	sigErr := err
	if errors.Is(sigErr, sandbox.ErrCommandExited) {
		sigErr = nil
	}
	wait := func(d time.Duration) (int, bool) {
		t := time.NewTimer(d)
		defer t.Stop()
		for {
			select {
			case ev, ok := <-att.Events():
				if !ok {
					return -1, true
				}
				if ev.Kind == sandbox.Exit {
					return ev.Code, true
				}
				if ev.Kind == sandbox.Error {
					return -1, true
				}
			case <-t.C:
				return 0, false
			case <-r.Context().Done():
				return 0, false
			case <-c.d.done:
				return 0, false
			}
		}
	}
	code, ok := wait(timeout)
	if ok && code < 0 {
		// The stream ended with no exit (a concurrent kill, a drop): the
		// session's record says how it ended.
		code, ok = c.exitOf(r.Context(), id)
	}
	if !ok && sigErr != nil {
		emit(map[string]any{"type": "error", "message": sigErr.Error()})
		return
	}
	if ok {
		emit(map[string]any{"type": "exited"})
	} else {
		emit(map[string]any{"type": "timeout"})
		if err := c.p.TerminateSession(r.Context(), c.h, id, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second}); err != nil {
			emit(map[string]any{"type": "error", "message": err.Error()})
			return
		}
		if code, ok = wait(5 * time.Second); !ok {
			emit(map[string]any{"type": "error", "message": "process did not die"})
			return
		}
		emit(map[string]any{"type": "killed"})
	}
	if code < 0 {
		code = 128 + int(sig)
	}
	emit(map[string]any{"type": "complete", "exit_code": code})
}

// exitOf polls the session's record (for up to 5 s) for its exit code.
func (c *call) exitOf(ctx context.Context, id string) (int, bool) {
	for i := 0; i < 50; i++ {
		ss, err := c.p.ListSessions(ctx, c.h)
		if err != nil {
			return 0, false
		}
		for _, s := range ss {
			if s.ID == id && s.State == sandbox.SessionExited {
				return s.ExitCode, true
			}
			if s.ID == id && s.State == sandbox.SessionLost {
				return -1, true
			}
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return 0, false
		}
	}
	return 0, false
}

// execHTTP serves POST /v1/sprites/{name}/exec?cmd=…: the request's body
// is the command's stdin (stdin=true), and the answer streams one HTTP
// chunk per frame, a stream byte (1 stdout, 2 stderr) and its bytes,
// ending with the exit frame (3 and the exit code's byte). Consecutive
// output of one stream is merged into one frame; frames are spaced so
// each arrives alone. A client that goes away stops the command.
func (c *call) execHTTP(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	argv := q["cmd"]
	if len(argv) == 0 && q.Get("path") != "" {
		argv = []string{q.Get("path")}
	}
	if len(argv) == 0 || argv[0] == "" {
		apiErr(w, http.StatusBadRequest, "invalid_request", "cmd is required")
		return
	}
	stdin := q.Get("stdin") == "true"
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	cmd, err := c.p.Spawn(r.Context(), c.h, sandbox.Cmd{Name: argv[0], Args: argv[1:]}, sandbox.SpawnOptions{Env: q["env"], Dir: q.Get("dir"), Stdin: stdin})
	if err != nil {
		fail(w, err, "sprite not found")
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	go func() {
		select {
		case <-c.d.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		if !stdin {
			return
		}
		body := http.MaxBytesReader(w, r.Body, maxStdin)
		buf := make([]byte, 32<<10)
		for {
			n, err := body.Read(buf)
			if n > 0 && c.p.WriteStdin(ctx, cmd, buf[:n]) != nil {
				return
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					_ = c.p.CloseStdin(ctx, cmd)
				}
				return
			}
		}
	}()
	// A body still being sent when the command is over is cut short: a
	// read deadline ends the stdin copy's read (the connection is then not
	// reused: its request was not read to its end). The write deadline is
	// cleared, so the connection's next request (or a socket hijacked
	// from it) does not inherit it.
	defer func() {
		cancel()
		select {
		case <-inDone:
		default:
			_ = rc.SetReadDeadline(time.Now())
			<-inDone
		}
		_ = rc.SetWriteDeadline(time.Time{})
	}()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	var pending []byte
	var last time.Time
	send := func(chunk []byte) bool {
		if d := httpFrameGap - time.Since(last); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return false
			}
		}
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		_, err := w.Write(chunk)
		if err == nil {
			err = rc.Flush()
		}
		last = time.Now()
		return err == nil
	}
	evs := cmd.Events()
	for {
		var tc <-chan time.Time
		var t *time.Timer
		if len(pending) > 0 {
			t = time.NewTimer(max(0, httpFrameGap-time.Since(last)))
			tc = t.C
		}
		select {
		case ev, ok := <-evs:
			if t != nil {
				t.Stop()
			}
			if !ok {
				return
			}
			switch ev.Kind {
			case sandbox.Stdout, sandbox.Stderr:
				stream := byte(frameStdout)
				if ev.Kind == sandbox.Stderr {
					stream = frameStderr
				}
				if len(pending) > 0 && (pending[0] != stream || len(pending)+len(ev.Data) > 1<<20) {
					if !send(pending) {
						_ = cmd.Stop()
						return
					}
					pending = nil
				}
				if len(pending) == 0 {
					pending = []byte{stream}
				}
				pending = append(pending, ev.Data...)
			case sandbox.Exit:
				if len(pending) > 0 && !send(pending) {
					return
				}
				_ = send([]byte{frameExit, exitByte(ev.Code)})
				return
			default:
				if len(pending) > 0 {
					_ = send(pending)
				}
				return // no exit frame: the SDK reports the missing exit
			}
		case <-tc:
			if !send(pending) {
				_ = cmd.Stop()
				return
			}
			pending = nil
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			_ = cmd.Stop()
			return
		}
	}
}
