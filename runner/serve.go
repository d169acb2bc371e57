package runner

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// conn is one platform connection.
type conn struct {
	d      *Daemon
	ws     *websocket.Conn
	ctx    context.Context // cancelled when the connection ends
	closed atomic.Bool

	qmu    sync.Mutex
	queues map[string]*opQueue // per-session stdin/stdin_close, in arrival order

	ops chan struct{} // a place per request served (Config.MaxOpsPerConn)
}

// opQueue runs one session's stdin requests in arrival order (Fountain's daemon
// ran each request in its own goroutine, so two writes could swap, D4).
type opQueue struct {
	items []queued
}

// queued is a stdin request and the release of its place (admit).
type queued struct {
	req     *wire.Request
	release func()
}

// enqueue runs req after the earlier stdin requests of its session; each
// holds its place (admit) until it was served.
func (c *conn) enqueue(req *wire.Request, release func(), wg *sync.WaitGroup) {
	key := req.Name + "\x00" + req.SessionID
	c.qmu.Lock()
	q := c.queues[key]
	if q != nil {
		q.items = append(q.items, queued{req, release})
		c.qmu.Unlock()
		return
	}
	q = &opQueue{items: []queued{{req, release}}}
	c.queues[key] = q
	c.qmu.Unlock()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c.qmu.Lock()
			if len(q.items) == 0 {
				delete(c.queues, key)
				c.qmu.Unlock()
				return
			}
			next := q.items[0]
			q.items = q.items[1:]
			c.qmu.Unlock()
			c.handle(next.req)
			next.release()
		}
	}()
}

// write sends one text frame; a failed write is logged and dropped (the
// frame stays in the journal).
func (c *conn) write(b []byte) error {
	if c == nil || c.closed.Load() {
		return errClosed
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.d.cfg.WriteTimeout)
	defer cancel()
	err := c.ws.Write(ctx, websocket.MessageText, b)
	if err != nil {
		c.d.log.Debug("runner: write failed", "err", err)
	}
	return err
}

var errClosed = errors.New("runner: connection closed")

func (d *Daemon) serve(ctx context.Context, ws *websocket.Conn) error {
	cctx, cancel := context.WithCancel(ctx)
	c := &conn{d: d, ws: ws, ctx: cctx, queues: map[string]*opQueue{}, ops: make(chan struct{}, d.cfg.MaxOpsPerConn)}
	var wg sync.WaitGroup
	defer func() {
		c.closed.Store(true)
		cancel()
		_ = ws.CloseNow()
		wg.Wait()
		// Sessions this socket listened to are detached, as if the
		// platform had said so: durable ones leave memory.
		d.mu.Lock()
		ss := make([]*session, 0, len(d.sessions))
		for _, s := range d.sessions {
			ss = append(ss, s)
		}
		d.mu.Unlock()
		for _, s := range ss {
			s.detach(c)
		}
	}()
	pingErr := make(chan error, 1)
	if d.cfg.PingInterval > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(d.cfg.PingInterval)
			defer t.Stop()
			for {
				select {
				case <-cctx.Done():
					return
				case <-t.C:
				}
				pctx, pcancel := context.WithTimeout(cctx, d.cfg.PingTimeout)
				err := ws.Ping(pctx)
				pcancel()
				if err != nil && cctx.Err() == nil {
					pingErr <- fmt.Errorf("runner: keep-alive ping unanswered: %w", err)
					_ = ws.CloseNow()
					return
				}
			}
		}()
	}
	for {
		typ, b, err := ws.Read(cctx)
		if err != nil {
			select {
			case perr := <-pingErr:
				return perr
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			switch websocket.CloseStatus(err) {
			case websocket.StatusNormalClosure, websocket.StatusGoingAway:
				return nil
			case wire.CloseDeleted:
				return fmt.Errorf("runner: this runner was deleted on the platform; it will re-register on reconnect: %w", err)
			case wire.CloseDuplicate:
				return fmt.Errorf("runner: a runner named %q is already connected: %w", d.cfg.Name, err)
			}
			return fmt.Errorf("runner: connection lost: %w", err)
		}
		if typ != websocket.MessageText {
			d.log.Warn("runner: bad frame (binary); skipped")
			continue
		}
		req, err := wire.DecodeRequest(b)
		if err != nil {
			d.log.Warn("runner: bad frame; skipped", "err", err)
			if req != nil && req.ID > 0 {
				_ = c.write(wire.AppendError(nil, req.ID, wire.CodeInvalid, "bad frame: "+err.Error()))
			}
			continue
		}
		release, ok := c.admit(req)
		if !ok {
			if cctx.Err() == nil {
				code, detail := wire.ErrorCode(&sandbox.RateLimitedError{RetryAfter: time.Second})
				_ = c.write(wire.AppendError(nil, req.ID, code, detail))
			}
			continue
		}
		if req.Op == wire.OpStdin || req.Op == wire.OpStdinClose {
			c.enqueue(req, release, &wg)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer release()
			c.handle(req)
		}()
	}
}

// admit takes req's place among the connection's requests served at once
// (and, for a file op, among the daemon's file ops), waiting up to
// BusyWait with the socket unread; ok false: no place came.
func (c *conn) admit(req *wire.Request) (release func(), ok bool) {
	t := time.NewTimer(c.d.cfg.BusyWait)
	defer t.Stop()
	select {
	case c.ops <- struct{}{}:
	case <-t.C:
		return nil, false
	case <-c.ctx.Done():
		return nil, false
	}
	if req.Op != wire.OpWriteFile {
		// (A read_file waits for its file place in its own goroutine,
		// holding nothing large: readFile.)
		return func() { <-c.ops }, true
	}
	// A write_file's frame is large: it waits here, so at most MaxFileOps
	// of them are held.
	select {
	case c.d.fileOps <- struct{}{}:
		return func() { <-c.d.fileOps; <-c.ops }, true
	case <-t.C:
	case <-c.ctx.Done():
	}
	<-c.ops
	return nil, false
}

// handle runs one request and writes its reply (and, for spawn and attach,
// the replay).
func (c *conn) handle(req *wire.Request) {
	d := c.d
	result, err := d.do(c, req)
	if errors.Is(err, errReplied) {
		return
	}
	if err != nil {
		code, detail := wire.ErrorCode(err)
		var oe *opError
		if errors.As(err, &oe) {
			detail = oe.op
		}
		if code == wire.CodeUnavailable || code == wire.CodeProvider {
			d.log.Warn("runner: op failed", "op", req.Op, "err", err)
		}
		_ = c.write(wire.AppendError(nil, req.ID, code, detail))
		return
	}
	_ = c.write(wire.AppendOK(nil, req.ID, result))
}

var errReplied = errors.New("replied")

func marshal(v any) ([]byte, error) { return json.Marshal(v) }

func (d *Daemon) handle(name string) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	return sandbox.BuildHandle(d.p.Name(), name), nil
}

func envPairs(pairs [][]string) []string {
	var env []string
	for _, kv := range pairs {
		if len(kv) == 2 {
			env = append(env, kv[0]+"="+kv[1])
		}
	}
	return env
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func (d *Daemon) do(c *conn, req *wire.Request) ([]byte, error) {
	ctx := c.ctx
	p := d.p
	switch req.Op {
	case wire.OpList:
		names, err := p.ListAllNames(ctx)
		if err != nil {
			return nil, err
		}
		if names == nil {
			names = []string{}
		}
		sort.Strings(names)
		return marshal(map[string]any{"names": names})
	case wire.OpStdin:
		data, err := wire.DecodeData(deref(req.Data))
		if err != nil {
			return nil, sandbox.Invalid("data", "data is not base64")
		}
		for {
			s, err := d.lookup(ctx, req.Name, req.SessionID)
			if err != nil {
				return nil, err
			}
			if err := s.writeStdin(ctx, data); !s.isDropped() {
				return nil, err
			}
		}
	case wire.OpSignal:
		// Ctrl-C through the platform: the session's command gets the
		// signal (its trap runs) instead of being killed.
		sig, ok := d.p.(sandbox.CommandSignaler)
		if !ok {
			return nil, sandbox.ErrNotSupported
		}
		if req.Signal < 1 || req.Signal > 64 {
			return nil, sandbox.Invalid("signal", fmt.Sprintf("%d is not a signal number (1..64)", req.Signal))
		}
		for {
			s, err := d.lookup(ctx, req.Name, req.SessionID)
			if err != nil {
				return nil, err
			}
			err = sig.SignalCommand(ctx, s.upstream(), syscall.Signal(req.Signal))
			if s.isDropped() {
				continue
			}
			return nil, err
		}
	case wire.OpStdinClose:
		for {
			s, err := d.lookup(ctx, req.Name, req.SessionID)
			if err != nil {
				return nil, err
			}
			err = s.closeStdin(ctx)
			if s.isDropped() {
				continue
			}
			if err != nil && !errors.Is(err, sandbox.ErrCommandExited) {
				return nil, err
			}
			return nil, nil
		}
	case wire.OpDetach:
		// The platform detaches by the id it subscribed with (a wire id,
		// unique on this daemon); with a name, only that sandbox's.
		d.mu.Lock()
		var s *session
		if req.Name == "" {
			s = d.sessions[req.SessionID] // the platform's: a wire id, unique here
		} else if key, err := wireKey(req.Name, req.SessionID); err == nil && d.sessions[key] != nil && d.sessions[key].name == req.Name {
			s = d.sessions[key]
		}
		d.mu.Unlock()
		if s != nil {
			s.detach(c)
		}
		return nil, nil
	case wire.OpAttach:
		for {
			s, err := d.lookup(ctx, req.Name, req.SessionID)
			if err != nil {
				return nil, err
			}
			res, _ := marshal(map[string]string{"session_id": s.id})
			ok, err := s.attach(ctx, c, req.ID, res)
			if err != nil {
				return nil, err
			}
			if ok {
				return nil, errReplied
			}
		}
	}
	if req.Op == wire.OpCapacity {
		c, err := d.capacity(ctx)
		if err != nil {
			return nil, err
		}
		return marshal(c)
	}
	switch req.Op {
	case wire.OpCreate, wire.OpGet, wire.OpDestroy, wire.OpSuspend, wire.OpResume, wire.OpWriteFile, wire.OpReadFile,
		wire.OpExec, wire.OpSpawn, wire.OpListSessions, wire.OpNetworkPolicy, wire.OpTerminateSession:
	default:
		return nil, &opError{req.Op}
	}
	h, err := d.handle(req.Name)
	if err != nil {
		return nil, err
	}
	switch req.Op {
	case wire.OpCreate:
		var opts sandbox.CreateOptions
		if l := req.Limits; l != nil {
			if opts.Limits, err = limitsOf(l); err != nil { // bounds.go
				return nil, err
			}
		}
		if err := d.diskFor(&opts.Limits); err != nil {
			return nil, err
		}
		_, err := p.Create(ctx, req.Name, opts)
		return nil, err
	case wire.OpGet:
		info, err := p.Get(ctx, h)
		if err != nil {
			return nil, err
		}
		res := map[string]any{"status": string(info.Status)}
		if hp, ok := p.(sandbox.HostPather); ok {
			res["path"] = hp.HostPath(h, "/home/sprite")
		}
		if len(info.Raw) > 0 && json.Valid(info.Raw) {
			res["raw"] = json.RawMessage(info.Raw)
		}
		return marshal(res)
	case wire.OpDestroy:
		if err := p.Destroy(ctx, h); err != nil {
			return nil, err
		}
		d.forget(req.Name)
		return nil, nil
	case wire.OpSuspend:
		return nil, p.Suspend(ctx, h)
	case wire.OpResume:
		_, err := p.Resume(ctx, h)
		return nil, err
	case wire.OpWriteFile:
		var mode fs.FileMode
		if req.Mode != nil {
			mode = fs.FileMode(*req.Mode) & fs.ModePerm
		}
		return nil, d.writeFile(ctx, h, req, sandbox.WriteFileOptions{Mode: mode})
	case wire.OpReadFile:
		return nil, d.readFile(c, h, req)
	case wire.OpExec:
		opts := sandbox.ExecOptions{Env: envPairs(req.Env), Dir: deref(req.Dir), StderrToStdout: req.StderrToStdout}
		if req.TimeoutMS != nil && *req.TimeoutMS > 0 {
			if opts.Timeout, err = msDuration("timeout_ms", *req.TimeoutMS); err != nil {
				return nil, err
			}
		}
		// The reply is one frame: its output is capped far below the
		// frame limit (a 60 MB reply closed the whole connection), and
		// the provider keeps no more than that in memory while it reads.
		opts.MaxOutput = wire.MaxExecOutput
		res, err := p.Exec(ctx, h, sandbox.Cmd{Name: req.Cmd, Args: req.Args}, opts)
		if err != nil {
			return nil, err
		}
		res = sandbox.CapOutput(res, wire.MaxExecOutput)
		reply := map[string]any{"output": wire.EncodeData(res.Output), "code": res.ExitCode}
		if res.Truncated {
			reply["truncated"] = true
		}
		return marshal(reply)
	case wire.OpSpawn:
		return nil, d.spawn(c, h, req)
	case wire.OpListSessions:
		return d.listSessions(ctx, h)
	case wire.OpNetworkPolicy:
		var allow []string
		if req.Allow != nil {
			allow = *req.Allow
		}
		return nil, p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: allow})
	case wire.OpTerminateSession:
		st, ok := p.(sandbox.SessionTerminator)
		if !ok || !p.Capabilities().Has(sandbox.CapTerminateSession) {
			return nil, sandbox.ErrNotSupported
		}
		opts := sandbox.TerminateOptions{}
		if req.Force {
			if !p.Capabilities().Has(sandbox.CapForceTerminateSession) {
				return nil, sandbox.ErrNotSupported
			}
			opts.Mode = sandbox.Force
		}
		if req.TimeoutMS != nil {
			if opts.Timeout, err = msDuration("timeout_ms", *req.TimeoutMS); err != nil {
				return nil, err
			}
		}
		sid, err := providerSID(req.Name, req.SessionID)
		if err != nil {
			return nil, err
		}
		return nil, st.TerminateSession(ctx, h, sid, opts)
	}
	return nil, &opError{req.Op}
}

// writeFile writes a write_file's data, decoded as it is written where
// the provider streams (sandbox.FileStreamWriter), else decoded whole.
func (d *Daemon) writeFile(ctx context.Context, h *sandbox.Handle, req *wire.Request, opts sandbox.WriteFileOptions) error {
	if fw, ok := d.p.(sandbox.FileStreamWriter); ok {
		src := &b64Reader{r: base64.NewDecoder(base64.StdEncoding, strings.NewReader(deref(req.Data)))}
		err := fw.WriteFileFrom(ctx, h, req.Path, src, opts)
		if src.bad {
			return sandbox.Invalid("data", "data is not base64")
		}
		return err
	}
	data, err := wire.DecodeData(deref(req.Data))
	if err != nil {
		return sandbox.Invalid("data", "data is not base64")
	}
	return d.p.WriteFile(ctx, h, req.Path, data, opts)
}

// b64Reader notes a base64 decoder's complaint.
type b64Reader struct {
	r   io.Reader
	bad bool
}

func (b *b64Reader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.bad = true
	}
	return n, err
}

// readFile answers a read_file. The reply is one frame, so a file over
// wire.MaxWriteFile is file_too_large; with a provider that streams
// (sandbox.FileOpener) that is known from the open file's size before a
// byte is read, and the reply is encoded from the file straight into its
// frame (bounds.go).
func (d *Daemon) readFile(c *conn, h *sandbox.Handle, req *wire.Request) error {
	tooLarge := func(n int64) error {
		return sandbox.Invalid("file_too_large", fmt.Sprintf("%d bytes: a runner sends files of at most %d MiB in one read", n, wire.MaxWriteFile>>20))
	}
	fo, ok := d.p.(sandbox.FileOpener)
	if !ok {
		fr, ok := d.p.(sandbox.FileReader)
		if !ok {
			return sandbox.ErrNotSupported
		}
		data, err := fr.ReadFile(c.ctx, h, req.Path)
		if err != nil {
			return err
		}
		if len(data) > wire.MaxWriteFile {
			return tooLarge(int64(len(data)))
		}
		res, _ := marshal(map[string]string{"data": wire.EncodeData(data)})
		_ = c.write(wire.AppendOK(nil, req.ID, res))
		return errReplied
	}
	select {
	case d.fileOps <- struct{}{}:
		defer func() { <-d.fileOps }()
	case <-c.ctx.Done():
		return sandbox.Unavailable("shutting_down", nil)
	}
	rc, size, err := fo.OpenFile(c.ctx, h, req.Path)
	if err != nil {
		return err
	}
	defer rc.Close()
	if size > wire.MaxWriteFile {
		return tooLarge(size)
	}
	var buf []byte
	select {
	case buf = <-d.frameBufs:
	default:
	}
	frame, err := readFileReply(buf, req.ID, rc, size)
	if err != nil {
		return &sandbox.ProviderError{Provider: d.p.Name(), Reason: "read_file", Err: err}
	}
	_ = c.write(frame)
	if cap(frame) <= maxPooledFrame {
		select {
		case d.frameBufs <- frame[:0]:
		default:
		}
	}
	return errReplied
}

// maxPooledFrame is the largest read_file frame buffer kept for reuse (a
// larger one goes back to the heap: the daemon keeps no 48 MiB buffer for
// its life).
const maxPooledFrame = 4 << 20

// opError is an unknown op: not_supported with the op as detail.
type opError struct{ op string }

func (e *opError) Error() string { return e.op }
func (e *opError) Is(target error) bool {
	return target == sandbox.ErrNotSupported
}

func (d *Daemon) listSessions(ctx context.Context, h *sandbox.Handle) ([]byte, error) {
	ss, err := d.p.ListSessions(ctx, h)
	if err != nil {
		return nil, err
	}
	sort.SliceStable(ss, func(i, j int) bool { return ss[i].CreatedAt.After(ss[j].CreatedAt) })
	ts := func(t time.Time) string {
		if t.IsZero() {
			return ""
		}
		return t.UTC().Format(time.RFC3339)
	}
	out := make([]wire.Session, 0, len(ss))
	for _, s := range ss {
		id := wireID(h.Name, s.ID)
		e := wire.Session{ID: id, Command: s.Command, CreatedAt: ts(s.CreatedAt), LastActivityAt: ts(s.LastActivityAt), TTY: s.TTY}
		switch s.State {
		case sandbox.SessionRunning:
			e.State = wire.SessionRunning
		case sandbox.SessionExited:
			code := s.ExitCode
			e.State, e.ExitCode = wire.SessionExited, &code
		case sandbox.SessionLost:
			e.State = wire.SessionLost
		}
		if e.State == "" {
			// The provider does not say: what this daemon saw of a
			// session it holds, else nothing (an upstream that ended
			// without an exit says nothing of the session; the platform
			// reads a session with neither state nor exit_code as
			// running).
			d.mu.Lock()
			if ds := d.sessions[id]; ds != nil {
				ds.mu.Lock()
				switch {
				case ds.exited:
					code := ds.code
					e.State, e.ExitCode = wire.SessionExited, &code
				case !ds.ended:
					e.State = wire.SessionRunning
				}
				ds.mu.Unlock()
			}
			d.mu.Unlock()
		}
		out = append(out, e)
	}
	return marshal(map[string]any{"sessions": out})
}

func (d *Daemon) spawn(c *conn, h *sandbox.Handle, req *wire.Request) error {
	opts := sandbox.SpawnOptions{Env: envPairs(req.Env), Dir: deref(req.Dir), Stdin: req.Stdin, Detachable: true}
	cmd := sandbox.Cmd{Name: req.Cmd, Args: req.Args}
	up, err := d.p.Spawn(c.ctx, h, cmd, opts)
	if err != nil {
		return err
	}
	sid := up.SessionID
	durable := sid != "" && d.p.Capabilities().Has(sandbox.CapAttach)
	if sid == "" {
		sid = fmt.Sprintf("s-%d-%d", time.Now().Unix(), d.seq.Add(1))
	}
	sid = wireID(h.Name, sid)
	s := d.adopt(sid, h.Name, cmd.String(), up, durable)
	if s == nil {
		_ = up.Stop()
		return sandbox.Unavailable("shutting_down", nil)
	}
	res, _ := marshal(map[string]string{"session_id": sid})
	if _, err := s.attach(c.ctx, c, req.ID, res); err != nil {
		return err
	}
	d.prune(h.Name)
	return errReplied
}

// adopt registers an upstream command as a session and starts its pump.
func (d *Daemon) adopt(id, name, command string, up *sandbox.Command, durable bool) *session {
	s := &session{d: d, id: id, name: name, command: command, created: time.Now(), up: up, durable: durable}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return nil
	}
	if old := d.sessions[id]; old != nil && !old.isDropped() {
		d.mu.Unlock()
		_ = up.Stop()
		return old
	}
	d.sessions[id] = s
	d.wg.Add(1)
	d.mu.Unlock()
	go s.pump(up, 0)
	return s
}

// lookup finds a session of sandbox name, recovering one the daemon does
// not hold (after a restart, or pruned) through the provider's Attach. id
// is a wire id (wireID), or the provider's own id of a session of name; a
// session of another sandbox is never found, whatever id says.
func (d *Daemon) lookup(ctx context.Context, name, id string) (*session, error) {
	// A request that names no sandbox reaches no session: every platform
	// names it in stdin, stdin_close and attach.
	if name == "" || id == "" {
		return nil, sandbox.ErrNotFound
	}
	key, err := wireKey(name, id)
	if err != nil {
		return nil, sandbox.ErrNotFound
	}
	d.mu.Lock()
	s := d.sessions[key]
	d.mu.Unlock()
	if s != nil && !s.isDropped() && s.name == name {
		return s, nil
	}
	if !d.p.Capabilities().Has(sandbox.CapAttach) {
		return nil, sandbox.ErrNotFound
	}
	sid, err := providerSID(name, id)
	if err != nil {
		return nil, sandbox.ErrNotFound
	}
	if err := sandbox.ValidateSessionID(sid); err != nil {
		return nil, sandbox.ErrNotFound
	}
	h, err := d.handle(name)
	if err != nil {
		return nil, err
	}
	d.recoMu.Lock()
	defer d.recoMu.Unlock()
	d.mu.Lock()
	s = d.sessions[key]
	d.mu.Unlock()
	if s != nil && !s.isDropped() && s.name == name {
		return s, nil
	}
	up, err := d.p.Attach(ctx, h, sid, sandbox.AttachOptions{Stdin: true})
	if err != nil {
		return nil, err
	}
	s = d.adopt(key, name, "", up, true)
	if s == nil {
		_ = up.Stop()
		return nil, sandbox.Unavailable("shutting_down", nil)
	}
	return s, nil
}

// Session ids on the wire. A provider numbers the sessions of each sandbox
// on its own (the local provider's are s1, s2, ... in every sandbox), but
// the platform routes stream frames by session_id alone, per connection:
// the daemon therefore puts on the wire the provider's id (or one it made
// up, s-<unix>-<seq>, for a provider that names none) followed by "--"
// and wire.SandboxTag of the sandbox's name, unique on this daemon, and
// takes a request's id back only for the sandbox the request names. (Fountain's
// daemon's ids were s-<unix>-<seq>, unique by construction; its platform
// treats them as opaque, so these need no change there.)
const wireSep = "--"

// wireID is the wire id of the provider's session sid of sandbox name.
func wireID(name, sid string) string { return sid + wireSep + wire.SandboxTag(name) }

// providerSID is the provider's id of wire id id, which must belong to
// sandbox name (or carry no sandbox tag: a provider's own id).
func providerSID(name, id string) (string, error) {
	i := strings.LastIndex(id, wireSep)
	if i < 0 || len(id)-i-len(wireSep) != 16 {
		return id, nil
	}
	if id[i+len(wireSep):] != wire.SandboxTag(name) {
		return "", sandbox.ErrNotFound
	}
	return id[:i], nil
}

// wireKey is the daemon's key of a session of name called id by a request
// (a wire id, or the provider's own id): always tagged with name.
func wireKey(name, id string) (string, error) {
	sid, err := providerSID(name, id)
	if err != nil {
		return "", err
	}
	return wireID(name, sid), nil
}

// forget drops the sessions of a destroyed sandbox from memory. Running
// ones are kept until their upstream ends (the provider's destroy ends
// them), so an attached listener still gets the terminal event.
func (d *Daemon) forget(name string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, s := range d.sessions {
		if s.name != name {
			continue
		}
		s.mu.Lock()
		s.gone = true
		if s.ended {
			delete(d.sessions, id)
		}
		s.mu.Unlock()
	}
}

// maxFinished is how many finished sessions per sandbox the daemon keeps in
// memory; the provider keeps them all.
const maxFinished = 100

func (d *Daemon) prune(name string) {
	d.mu.Lock()
	var done []*session
	for _, s := range d.sessions {
		if s.name == name && s.finished() {
			done = append(done, s)
		}
	}
	if len(done) <= maxFinished {
		d.mu.Unlock()
		return
	}
	sort.Slice(done, func(i, j int) bool { return done[i].created.Before(done[j].created) })
	for _, s := range done[:len(done)-maxFinished] {
		delete(d.sessions, s.id)
	}
	d.mu.Unlock()
}

// maxJournal bounds the output a session keeps in the daemon's memory
// while a listener is attached (a variable for tests). Past it, a durable
// session's journal is dropped (the provider keeps the whole journal on
// disk), and the next attach swaps in a fresh upstream from the provider's
// Attach, which replays from byte zero (see session.attach); a session the
// provider cannot give back keeps its first maxJournal bytes and refuses
// a later attach with unavailable/replay_unavailable rather than replay a
// part. So the daemon holds at most maxJournal bytes per attached session,
// whatever the session writes (1.5 GB of output used to take 1.5 GB).
var maxJournal = 8 << 20

// session is one journaled upstream command.
//
// Output positions: live counts the output bytes (stdout and stderr as
// one sequence) sent live so far. When a session's journal was trimmed and
// another listener attaches, the daemon takes a new upstream from the
// provider's Attach (generation gen+1) and ignores the old one's events
// from then on; the new upstream replays from byte zero, and its bytes
// below live, which every earlier listener already has, go to the new
// listener alone (tagged replay_for its request, catchup), while its bytes
// from live on are live for all. The provider's replay of a session is the
// same byte sequence as its live output (provider/local reads both from
// its journal), so nothing is lost or sent twice.
type session struct {
	d                 *Daemon
	id, name, command string
	created           time.Time
	stdinMu           sync.Mutex
	mu                sync.Mutex
	up                *sandbox.Command // guarded by mu: a trimmed session's attach replaces it
	gen               int              // which upstream's events count
	upPos             int64            // output bytes the current upstream has delivered
	live              int64            // output bytes sent live
	catchup           int64            // request id whose replay the current upstream delivers, 0 when caught up
	caughtUp          chan struct{}    // closed when catchup returns to 0
	journal           []sandbox.Event
	journalBytes      int
	trimmed           bool  // the journal passed maxJournal and was dropped
	out               *conn // the attached connection, nil when detached
	exited, ended     bool
	gone              bool
	// durable: the provider can give this session back through Attach, so
	// the daemon may drop it from memory while nobody listens (dropped).
	durable, dropped    bool
	code                int
	lastActivityUnixSec atomic.Int64
}

func (s *session) finished() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended
}

func (s *session) upstream() *sandbox.Command {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.up
}

// pump journals the events of upstream generation gen and sends them
// while attached; events of a replaced upstream are ignored.
func (s *session) pump(up *sandbox.Command, gen int) {
	defer s.d.wg.Done()
	var buf []byte
	for ev := range up.Events() {
		s.lastActivityUnixSec.Store(time.Now().Unix())
		s.mu.Lock()
		if s.gen == gen {
			buf = s.record(buf, ev)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	current, gone := s.gen == gen, s.gone
	if current {
		s.caughtUpLocked()
	}
	s.mu.Unlock()
	if current && gone {
		s.d.mu.Lock()
		if s.d.sessions[s.id] == s {
			delete(s.d.sessions, s.id)
		}
		s.d.mu.Unlock()
	}
}

// caughtUpLocked ends a catch-up: the new listener has its replay.
func (s *session) caughtUpLocked() {
	s.catchup = 0
	if s.caughtUp != nil {
		close(s.caughtUp)
		s.caughtUp = nil
	}
}

// record handles one event of the current upstream, under s.mu.
func (s *session) record(buf []byte, ev sandbox.Event) []byte {
	switch {
	case ev.Kind == sandbox.Stdout || ev.Kind == sandbox.Stderr:
		data := ev.Data
		start := s.upPos
		s.upPos += int64(len(data))
		if start < s.live {
			// A swapped-in upstream's replay of what is already out.
			k := min(int64(len(data)), s.live-start)
			if s.catchup != 0 && s.out != nil {
				buf = s.emit(buf, s.out, sandbox.Event{Kind: ev.Kind, Data: data[:k]}, s.catchup)
			}
			data = data[k:]
			if len(data) == 0 {
				if s.upPos == s.live && !s.ended {
					// (An ended session's catch-up ends with its
					// replayed terminal event.)
					s.caughtUpLocked()
				}
				return buf
			}
		}
		s.caughtUpLocked()
		s.live += int64(len(data))
		ev.Data = data
		s.keep(ev)
	case ev.Terminal():
		if s.ended {
			// The replayed end of a session that ended before the swap:
			// only the new listener has not seen it.
			if s.catchup != 0 && s.out != nil {
				buf = s.emit(buf, s.out, ev, s.catchup)
			}
			s.caughtUpLocked()
			return buf
		}
		s.caughtUpLocked()
		if ev.Kind == sandbox.Exit {
			s.exited, s.code = true, ev.Code
		}
		s.ended = true
		s.journal = append(s.journal, ev)
	default:
		return buf
	}
	if s.out != nil {
		buf = s.emit(buf[:0], s.out, ev, 0)
	}
	return buf
}

// keep journals an output event while the journal is under maxJournal.
func (s *session) keep(ev sandbox.Event) {
	if s.trimmed {
		return
	}
	if s.journalBytes+len(ev.Data) > maxJournal {
		s.trimmed = true
		if s.durable {
			s.journal, s.journalBytes = nil, 0
		}
		return
	}
	s.journal = append(s.journal, ev)
	s.journalBytes += len(ev.Data)
}

// emit writes one event as frames (output split into MaxChunk pieces).
func (s *session) emit(buf []byte, c *conn, ev sandbox.Event, replayFor int64) []byte {
	f := wire.Stream{SessionID: s.id, ReplayFor: replayFor}
	switch ev.Kind {
	case sandbox.Stdout, sandbox.Stderr:
		f.Kind = wire.StreamStdout
		if ev.Kind == sandbox.Stderr {
			f.Kind = wire.StreamStderr
		}
		data := ev.Data
		for len(data) > 0 {
			n := min(len(data), wire.MaxChunk)
			f.Data = data[:n]
			data = data[n:]
			buf = wire.AppendStream(buf[:0], &f)
			if c.write(buf) != nil {
				return buf
			}
		}
		return buf
	case sandbox.Exit:
		f.Kind, f.Code = wire.StreamExit, ev.Code
	case sandbox.Error:
		f.Kind = wire.StreamError
		f.Error, f.Detail = wire.ErrorCode(ev.Err)
	default:
		return buf
	}
	buf = wire.AppendStream(buf[:0], &f)
	_ = c.write(buf)
	return buf
}

// attach writes the reply for request id, replays the journal tagged with
// id, and binds live output to c, all under the session lock: nothing is
// recorded in between, so nothing is missed or sent twice. It reports
// false for a session dropped meanwhile (the caller looks it up again).
// A trimmed durable session is replayed by a fresh upstream from the
// provider instead (see session); a trimmed session the provider cannot
// give back is refused.
func (s *session) attach(ctx context.Context, c *conn, id int64, reply []byte) (bool, error) {
	s.mu.Lock()
	trimmed := s.trimmed
	s.mu.Unlock()
	if !trimmed {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.dropped {
			return false, nil
		}
		if c.write(wire.AppendOK(nil, id, reply)) != nil {
			return true, nil
		}
		var buf []byte
		for _, ev := range s.journal {
			buf = s.emit(buf, c, ev, id)
		}
		s.out = c
		return true, nil
	}
	if !s.durable {
		return false, sandbox.Unavailable("replay_unavailable", fmt.Errorf("the session wrote more than %d bytes and its provider cannot replay it", maxJournal))
	}
	h, err := s.d.handle(s.name)
	if err != nil {
		return false, err
	}
	sid, err := providerSID(s.name, s.id)
	if err != nil {
		return false, err
	}
	for {
		// One catch-up at a time: a second would cut the first one's replay.
		s.mu.Lock()
		wait := s.caughtUp
		s.mu.Unlock()
		if wait != nil {
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		up, err := s.d.p.Attach(ctx, h, sid, sandbox.AttachOptions{Stdin: true})
		if err != nil {
			return false, err
		}
		if ok, again, err := s.swap(c, id, reply, up); !again {
			return ok, err
		}
	}
}

// swap makes up, a fresh upstream from the provider's Attach, the
// session's upstream, with request id's listener catching up from it (see
// session). again: another catch-up began meanwhile; up was stopped.
func (s *session) swap(c *conn, id int64, reply []byte, up *sandbox.Command) (ok, again bool, err error) {
	// The new pump counts in the daemon's WaitGroup; take it before s.mu
	// (forget locks d.mu, then a session's mu).
	s.d.mu.Lock()
	closed := s.d.closed
	if !closed {
		s.d.wg.Add(1)
	}
	s.d.mu.Unlock()
	if closed {
		_ = up.Stop()
		return false, false, sandbox.Unavailable("shutting_down", nil)
	}
	// No stdin write is in flight while the upstream changes (one sent to
	// the old upstream as it stops would be lost).
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	s.mu.Lock()
	if s.dropped || s.caughtUp != nil || c.write(wire.AppendOK(nil, id, reply)) != nil {
		dropped, racing := s.dropped, s.caughtUp != nil
		s.mu.Unlock()
		s.d.wg.Done()
		_ = up.Stop()
		// A dropped session is looked up again; a write that failed means
		// the socket is gone, and so is the listener.
		return !dropped, racing && !dropped, nil
	}
	old := s.up
	s.gen++
	s.up, s.upPos, s.catchup, s.caughtUp = up, 0, id, make(chan struct{})
	s.out = c
	gen := s.gen
	s.mu.Unlock()
	go s.pump(up, gen)
	_ = old.Stop()
	return true, false, nil
}

// detach stops live output to c (the platform's last listener left). A
// durable session is then dropped from the daemon's memory, journal and
// all: the provider keeps running and journaling it, and the next attach or
// stdin takes it back through the provider's Attach, from byte zero. So the
// daemon holds output only for sessions someone is listening to (Fountain's
// daemon held every journal in memory for the daemon's life, D6).
func (s *session) detach(c *conn) {
	s.mu.Lock()
	if s.out == c {
		s.out = nil
	}
	drop := s.out == nil && s.durable && !s.dropped
	if drop {
		s.dropped = true
		s.journal = nil
	}
	s.mu.Unlock()
	if !drop {
		return
	}
	s.d.mu.Lock()
	if s.d.sessions[s.id] == s {
		delete(s.d.sessions, s.id)
	}
	s.d.mu.Unlock()
	_ = s.upstream().Stop()
}

func (s *session) isDropped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

func (s *session) closeStdin(ctx context.Context) error {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	return s.upstream().CloseStdin(ctx)
}

func (s *session) writeStdin(ctx context.Context, data []byte) error {
	s.stdinMu.Lock()
	defer s.stdinMu.Unlock()
	if s.finished() {
		return sandbox.ErrCommandExited
	}
	err := s.upstream().WriteStdin(ctx, data)
	if err != nil && s.finished() {
		return sandbox.ErrCommandExited
	}
	if err == nil {
		s.lastActivityUnixSec.Store(time.Now().Unix())
	}
	return err
}
