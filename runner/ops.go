package runner

// Op dispatch: the daemon's answer to each request op (sessions.go holds
// the sessions and their output).

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
	"syscall"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

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
			var from *skip
			if req.Offset != nil && *req.Offset > 0 {
				from = &skip{c: c, left: *req.Offset, want: req.OffsetCRC, replayFor: req.ID}
			}
			ok, err := s.attach(ctx, c, req.ID, res, from)
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
