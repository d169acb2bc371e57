package e2bdoor

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"path"
	"sort"
	"sync"
	"syscall"

	"connectrpc.com/connect"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// jsonCodec is Connect's JSON codec over the door's own message structs
// (written from envd's process.proto in proto3 JSON: bytes as base64,
// int64 as strings where the proto has them, zero values omitted).
type jsonCodec struct{}

func (jsonCodec) Name() string                  { return "json" }
func (jsonCodec) Marshal(v any) ([]byte, error) { return json.Marshal(v) }
func (jsonCodec) Unmarshal(b []byte, v any) error {
	return json.Unmarshal(b, v)
}

type procConfig struct {
	Cmd  string            `json:"cmd"`
	Args []string          `json:"args,omitempty"`
	Envs map[string]string `json:"envs,omitempty"`
	Cwd  *string           `json:"cwd,omitempty"`
}

type ptyMsg struct {
	Size struct {
		Cols uint32 `json:"cols"`
		Rows uint32 `json:"rows"`
	} `json:"size"`
}

type selector struct {
	Pid *uint32 `json:"pid,omitempty"`
	Tag *string `json:"tag,omitempty"`
}

type startReq struct {
	Process procConfig `json:"process"`
	Pty     *ptyMsg    `json:"pty,omitempty"`
	Tag     *string    `json:"tag,omitempty"`
	Stdin   *bool      `json:"stdin,omitempty"`
}

type connectReq struct {
	Process selector `json:"process"`
}

type inputReq struct {
	Process selector `json:"process"`
	Input   struct {
		Stdin []byte `json:"stdin,omitempty"`
		Pty   []byte `json:"pty,omitempty"`
	} `json:"input"`
}

type signalReq struct {
	Process selector `json:"process"`
	Signal  any      `json:"signal"`
}

type empty struct{}

type procInfo struct {
	Config procConfig `json:"config"`
	Pid    uint32     `json:"pid"`
	Tag    string     `json:"tag,omitempty"`
}

type listResp struct {
	Processes []procInfo `json:"processes,omitempty"`
}

// event is process.StartResponse / ConnectResponse.
type event struct {
	Event eventBody `json:"event"`
}

type eventBody struct {
	Start *struct {
		Pid uint32 `json:"pid"`
	} `json:"start,omitempty"`
	Data *struct {
		Stdout []byte `json:"stdout,omitempty"`
		Stderr []byte `json:"stderr,omitempty"`
		Pty    []byte `json:"pty,omitempty"`
	} `json:"data,omitempty"`
	End *struct {
		ExitCode int32  `json:"exitCode,omitempty"`
		Exited   bool   `json:"exited"`
		Status   string `json:"status"`
		Error    string `json:"error,omitempty"`
	} `json:"end,omitempty"`
	Keepalive *empty `json:"keepalive,omitempty"`
}

type ctxKey struct{}

// envdCall is what an authenticated envd call acts on.
type envdCall struct {
	p   *client.Client
	h   *sandbox.Handle
	key string
	id  string
}

func callOf(ctx context.Context) envdCall { c, _ := ctx.Value(ctxKey{}).(envdCall); return c }

// serveEnvd checks the sandbox's access token and serves envd.
func (d *Door) serveEnvd(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("E2b-Sandbox-Id")
	key, ok := d.open(r.Header.Get("X-Access-Token"), id)
	if !ok {
		apiErr(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	p, err := d.providerFor(r, key)
	if err != nil {
		apiErr(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	defer p.Close()
	c := envdCall{p: p, h: &sandbox.Handle{Provider: client.Name, Name: id}, key: key, id: id}
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, c))
	switch r.URL.Path {
	case "/health":
		if _, err := p.Lookup(r.Context(), c.h); err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	case "/files":
		d.files(w, r, c)
	default:
		d.envd.ServeHTTP(w, r)
	}
}

func (d *Door) envdMux() http.Handler {
	opts := []connect.HandlerOption{connect.WithCodec(jsonCodec{}), connect.WithReadMaxBytes(maxBody)}
	mux := http.NewServeMux()
	mux.Handle("/process.Process/Start", connect.NewServerStreamHandler("/process.Process/Start", d.start, opts...))
	mux.Handle("/process.Process/Connect", connect.NewServerStreamHandler("/process.Process/Connect", d.connect, opts...))
	mux.Handle("/process.Process/List", connect.NewUnaryHandler("/process.Process/List", d.listProcs, opts...))
	mux.Handle("/process.Process/SendInput", connect.NewUnaryHandler("/process.Process/SendInput", d.sendInput, opts...))
	mux.Handle("/process.Process/CloseStdin", connect.NewUnaryHandler("/process.Process/CloseStdin", d.closeStdin, opts...))
	mux.Handle("/process.Process/SendSignal", connect.NewUnaryHandler("/process.Process/SendSignal", d.sendSignal, opts...))
	mux.Handle("/process.Process/Update", connect.NewUnaryHandler("/process.Process/Update", d.update, opts...))
	for _, op := range []string{"Stat", "MakeDir", "Move", "Remove"} {
		proc := "/filesystem.Filesystem/" + op
		mux.Handle(proc, connect.NewUnaryHandler(proc, d.fsCall(op), opts...))
	}
	mux.Handle("/filesystem.Filesystem/WatchDir", connect.NewServerStreamHandler("/filesystem.Filesystem/WatchDir", d.watchDir, opts...))
	mux.Handle("/filesystem.Filesystem/ListDir", connect.NewUnaryHandler("/filesystem.Filesystem/ListDir", d.listDir, opts...))
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotImplemented, map[string]any{"code": "unimplemented", "message": r.URL.Path + " is not supported by managoat's E2B front door"})
	}))
	return mux
}

// rpcErr maps a platform error onto a Connect error as envd's would read.
func rpcErr(err error) error {
	st, msg := statusOf(err)
	switch st {
	case http.StatusNotFound, http.StatusBadGateway:
		return connect.NewError(connect.CodeUnavailable, errors.New("sandbox not running: "+msg))
	case http.StatusUnauthorized:
		return connect.NewError(connect.CodeUnauthenticated, errors.New(msg))
	case http.StatusBadRequest:
		return connect.NewError(connect.CodeInvalidArgument, errors.New(msg))
	case http.StatusTooManyRequests:
		return connect.NewError(connect.CodeResourceExhausted, errors.New(msg))
	case http.StatusNotImplemented:
		return connect.NewError(connect.CodeUnimplemented, errors.New(msg))
	}
	return connect.NewError(connect.CodeUnavailable, errors.New(msg))
}

// procTable is one sandbox's commands the door follows, by pid.
type procTable struct {
	mu    sync.Mutex
	next  uint32
	procs map[uint32]*proc
}

// proc is one command: its events go to every subscriber (the Start
// stream and Connect streams); with none, output is dropped, as envd does.
type proc struct {
	pid  uint32
	tag  string
	cfg  procConfig
	cmd  *sandbox.Command
	pty  bool
	mu   sync.Mutex
	subs map[chan event]struct{}
	done chan struct{}
}

func (t *procTable) stopAll() {
	t.mu.Lock()
	ps := make([]*proc, 0, len(t.procs))
	for _, p := range t.procs {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Stop()
		<-p.done
	}
}

func (d *Door) table(c envdCall, make_ bool) *procTable {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := metaKey(c.key, c.id)
	t := d.procs[k]
	if t == nil && make_ {
		t = &procTable{next: 1000, procs: map[uint32]*proc{}}
		d.procs[k] = t
	}
	return t
}

func (d *Door) find(c envdCall, s selector) *proc {
	t := d.table(c, false)
	if t == nil {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if s.Pid != nil {
		return t.procs[*s.Pid]
	}
	if s.Tag != nil {
		for _, p := range t.procs {
			if p.tag == *s.Tag {
				return p
			}
		}
	}
	return nil
}

func (p *proc) subscribe() chan event {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs == nil {
		return nil
	}
	ch := make(chan event, 64)
	p.subs[ch] = struct{}{}
	return ch
}

func (p *proc) unsubscribe(ch chan event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.subs != nil {
		delete(p.subs, ch)
	}
}

// pump feeds p's events to its subscribers (waiting for a slow one:
// backpressure, never loss), then ends p.
func (d *Door) pump(t *procTable, p *proc) {
	defer close(p.done)
	defer func() {
		t.mu.Lock()
		delete(t.procs, p.pid)
		t.mu.Unlock()
	}()
	send := func(e event, last bool) {
		p.mu.Lock()
		subs := make([]chan event, 0, len(p.subs))
		for ch := range p.subs {
			subs = append(subs, ch)
		}
		if last {
			p.subs = nil
		}
		p.mu.Unlock()
		for _, ch := range subs {
			select {
			case ch <- e:
			case <-d.done:
			}
			if last {
				close(ch)
			}
		}
	}
	for ev := range p.cmd.Events() {
		var e event
		switch ev.Kind {
		case sandbox.Stdout, sandbox.Stderr:
			e.Event.Data = &struct {
				Stdout []byte `json:"stdout,omitempty"`
				Stderr []byte `json:"stderr,omitempty"`
				Pty    []byte `json:"pty,omitempty"`
			}{}
			switch {
			case p.pty:
				e.Event.Data.Pty = ev.Data
			case ev.Kind == sandbox.Stdout:
				e.Event.Data.Stdout = ev.Data
			default:
				e.Event.Data.Stderr = ev.Data
			}
			send(e, false)
			continue
		case sandbox.Exit:
			e.Event.End = &struct {
				ExitCode int32  `json:"exitCode,omitempty"`
				Exited   bool   `json:"exited"`
				Status   string `json:"status"`
				Error    string `json:"error,omitempty"`
			}{ExitCode: int32(ev.Code), Exited: ev.Code >= 0, Status: "exit status " + itoa(ev.Code)}
			if ev.Code < 0 || ev.Code > 128 {
				e.Event.End.Status = "signal: killed"
			}
		default:
			msg := "the command's stream ended"
			if ev.Err != nil {
				msg = ev.Err.Error()
			}
			e.Event.End = &struct {
				ExitCode int32  `json:"exitCode,omitempty"`
				Exited   bool   `json:"exited"`
				Status   string `json:"status"`
				Error    string `json:"error,omitempty"`
			}{ExitCode: -1, Status: "error", Error: msg}
		}
		send(e, true)
	}
	p.mu.Lock()
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	for ch := range subs {
		close(ch)
	}
}

func (d *Door) start(ctx context.Context, req *connect.Request[startReq], st *connect.ServerStream[event]) error {
	c := callOf(ctx)
	m := req.Msg
	if m.Process.Cmd == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("empty cmd"))
	}
	var env []string
	d.mu.Lock()
	if mt := d.meta[metaKey(c.key, c.id)]; mt != nil {
		for k, v := range mt.Envs {
			env = append(env, k+"="+v)
		}
	}
	d.mu.Unlock()
	for k, v := range m.Process.Envs {
		env = append(env, k+"="+v)
	}
	sort.Strings(env)
	o := sandbox.SpawnOptions{Env: env, Stdin: m.Stdin == nil || *m.Stdin}
	if m.Process.Cwd != nil {
		o.Dir = *m.Process.Cwd
	}
	if m.Pty != nil {
		o.TTY, o.TTYRows, o.TTYCols, o.Stdin = true, int(m.Pty.Size.Rows), int(m.Pty.Size.Cols), true
	}
	select {
	case <-d.done:
		return connect.NewError(connect.CodeUnavailable, errors.New("the door is closing"))
	default:
	}
	cmd, err := c.p.Spawn(ctx, c.h, sandbox.Cmd{Name: m.Process.Cmd, Args: m.Process.Args}, o)
	if err != nil {
		return rpcErr(err)
	}
	t := d.table(c, true)
	p := &proc{cfg: m.Process, cmd: cmd, pty: o.TTY, subs: map[chan event]struct{}{}, done: make(chan struct{})}
	if m.Tag != nil {
		p.tag = *m.Tag
	}
	ch := p.subscribe()
	t.mu.Lock()
	t.next++
	p.pid = t.next
	t.procs[p.pid] = p
	t.mu.Unlock()
	go d.pump(t, p)
	return d.follow(ctx, p, ch, st)
}

// follow sends the start event and then ch's events to st.
func (d *Door) follow(ctx context.Context, p *proc, ch chan event, st *connect.ServerStream[event]) error {
	defer p.unsubscribe(ch)
	var e event
	e.Event.Start = &struct {
		Pid uint32 `json:"pid"`
	}{p.pid}
	if err := st.Send(&e); err != nil {
		return err
	}
	for {
		select {
		case e, ok := <-ch:
			if !ok {
				return nil
			}
			if err := st.Send(&e); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		case <-d.done:
			return connect.NewError(connect.CodeUnavailable, errors.New("the door is closing"))
		}
	}
}

func (d *Door) connect(ctx context.Context, req *connect.Request[connectReq], st *connect.ServerStream[event]) error {
	p := d.find(callOf(ctx), req.Msg.Process)
	if p == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	ch := p.subscribe()
	if ch == nil {
		return connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	return d.follow(ctx, p, ch, st)
}

func (d *Door) listProcs(ctx context.Context, _ *connect.Request[json.RawMessage]) (*connect.Response[listResp], error) {
	out := &listResp{}
	if t := d.table(callOf(ctx), false); t != nil {
		t.mu.Lock()
		for _, p := range t.procs {
			out.Processes = append(out.Processes, procInfo{Config: p.cfg, Pid: p.pid, Tag: p.tag})
		}
		t.mu.Unlock()
	}
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

func (d *Door) sendInput(ctx context.Context, req *connect.Request[inputReq]) (*connect.Response[empty], error) {
	p := d.find(callOf(ctx), req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	data := req.Msg.Input.Stdin
	if req.Msg.Input.Pty != nil {
		data = req.Msg.Input.Pty
	}
	if err := p.cmd.WriteStdin(ctx, data); err != nil {
		if errors.Is(err, sandbox.ErrCommandExited) {
			return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
		}
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&empty{}), nil
}

func (d *Door) closeStdin(ctx context.Context, req *connect.Request[connectReq]) (*connect.Response[empty], error) {
	p := d.find(callOf(ctx), req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	if err := p.cmd.CloseStdin(ctx); err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&empty{}), nil
}

func (d *Door) sendSignal(ctx context.Context, req *connect.Request[signalReq]) (*connect.Response[empty], error) {
	c := callOf(ctx)
	p := d.find(c, req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	sig := syscall.SIGTERM
	switch v := req.Msg.Signal.(type) {
	case string:
		if v == "SIGNAL_SIGKILL" {
			sig = syscall.SIGKILL
		}
	case float64:
		if v == 9 {
			sig = syscall.SIGKILL
		}
	}
	if err := c.p.SignalCommand(ctx, p.cmd, sig); err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
		return nil, rpcErr(err)
	}
	return connect.NewResponse(&empty{}), nil
}

// files is envd's GET /files?path= and POST /files.
func (d *Door) files(w http.ResponseWriter, r *http.Request, c envdCall) {
	q := r.URL.Query()
	p := q.Get("path")
	switch r.Method {
	case http.MethodGet:
		if p == "" {
			apiErr(w, http.StatusBadRequest, "path is required")
			return
		}
		rc, n, err := c.p.OpenFile(r.Context(), c.h, p)
		if err != nil {
			st, msg := statusOf(err)
			if st == http.StatusNotFound {
				msg = "path '" + p + "' does not exist"
			}
			apiErr(w, st, msg)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		if n >= 0 {
			w.Header().Set("Content-Length", itoa(int(n)))
		}
		_, _ = io.Copy(w, rc)
	case http.MethodPost:
		type entry struct {
			Name string `json:"name"`
			Type string `json:"type"`
			Path string `json:"path"`
		}
		var out []entry
		put := func(dst string, body io.Reader) bool {
			if err := c.p.WriteFileFrom(r.Context(), c.h, dst, body, sandbox.WriteFileOptions{Mode: 0o644}); err != nil {
				st, msg := statusOf(err)
				apiErr(w, st, msg)
				return false
			}
			out = append(out, entry{Name: path.Base(dst), Type: "file", Path: dst})
			return true
		}
		mt, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if mt == "multipart/form-data" {
			mr := multipart.NewReader(r.Body, params["boundary"])
			for {
				part, err := mr.NextPart()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					apiErr(w, http.StatusBadRequest, "malformed multipart body: "+err.Error())
					return
				}
				dst := p
				if dst == "" {
					// The part's file name is the whole path (FileName
					// would keep only its last element).
					_, cd, _ := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
					dst = cd["filename"]
				}
				if dst == "" {
					apiErr(w, http.StatusBadRequest, "a part names no path")
					return
				}
				if !put(dst, part) {
					return
				}
			}
		} else {
			if p == "" {
				apiErr(w, http.StatusBadRequest, "path is required")
				return
			}
			var body io.Reader = r.Body
			if r.Header.Get("Content-Encoding") == "gzip" {
				zr, err := gzip.NewReader(r.Body)
				if err != nil {
					apiErr(w, http.StatusBadRequest, "malformed gzip body")
					return
				}
				defer zr.Close()
				body = zr
			}
			if !put(p, body) {
				return
			}
		}
		writeJSON(w, http.StatusOK, out)
	default:
		apiErr(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

type updateReq struct {
	Process selector `json:"process"`
	Pty     *ptyMsg  `json:"pty,omitempty"`
}

// update is process.Process/Update: a terminal's resize.
func (d *Door) update(ctx context.Context, req *connect.Request[updateReq]) (*connect.Response[empty], error) {
	c := callOf(ctx)
	p := d.find(c, req.Msg.Process)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("process not found"))
	}
	if !p.pty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("tty not assigned to process"))
	}
	if req.Msg.Pty != nil {
		if err := c.p.ResizeTTY(ctx, p.cmd, int(req.Msg.Pty.Size.Rows), int(req.Msg.Pty.Size.Cols)); err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
			return nil, rpcErr(err)
		}
	}
	return connect.NewResponse(&empty{}), nil
}
