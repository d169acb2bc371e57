package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "runner"

// Caller reaches runners. *Server implements it in the platform process
// (over its Host's connections) and *Client in another process (over a
// platform's proxy endpoint).
type Caller interface {
	Call(ctx context.Context, runnerID string, req *wire.Request, sub *Subscription) (*wire.Reply, error)
	Unsubscribe(sub *Subscription)
	Runners(ctx context.Context) ([]Info, error)
}

// ProviderOptions configure a Provider.
type ProviderOptions struct {
	// CallTimeout bounds a call whose ctx has no deadline; default 30 s.
	CallTimeout time.Duration
}

// Provider is the sandbox provider "runner": every operation is a request
// to the runner whose id the sandbox's name carries (see For and Parse).
// Offline, disconnected and timed out are all Unavailable, so transient: a
// switched-off machine's sandbox is never taken for gone.
//
// It advertises suspend and attach, plus network_policy and
// terminate_session when every online runner reports them (a runner whose
// provider isolates its sandboxes). With no runner online it advertises
// only suspend and attach.
type Provider struct {
	c       Caller
	timeout time.Duration
}

// NewProvider returns the provider over c.
func NewProvider(c Caller, opts ProviderOptions) *Provider {
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 30 * time.Second
	}
	return &Provider{c: c, timeout: opts.CallTimeout}
}

var _ interface {
	sandbox.Provider
	sandbox.SessionTerminator
	sandbox.HostPather
	sandbox.SandboxCapabilities
	sandbox.PartialLister
} = (*Provider)(nil)

// Name returns "runner".
func (p *Provider) Name() string { return Name }

// Capabilities: suspend and attach, plus the extras every online runner
// offers: what any sandbox of this provider can do. What one sandbox can do
// is its runner's (CapabilitiesOf), and that is what gates an operation.
func (p *Provider) Capabilities() sandbox.Capabilities {
	caps := sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapAttach)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rs, err := p.c.Runners(ctx)
	if err != nil || len(rs) == 0 {
		return caps
	}
	for _, c := range []sandbox.Capability{sandbox.CapNetworkPolicy, sandbox.CapTerminateSession, sandbox.CapForceTerminateSession} {
		all := true
		for _, r := range rs {
			all = all && r.HasCap(string(c))
		}
		if all {
			caps = caps.With(c)
		}
	}
	return caps
}

// CapabilitiesOf is what the sandbox h can do: suspend and attach, plus
// the extras its own runner offers (sandbox.SandboxCapabilities). A runner
// that is not online is Unavailable{runner_offline}.
func (p *Provider) CapabilitiesOf(ctx context.Context, h *sandbox.Handle) (sandbox.Capabilities, error) {
	r, err := p.runnerOf(ctx, h)
	if err != nil {
		return nil, err
	}
	caps := sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapAttach)
	for _, c := range []sandbox.Capability{sandbox.CapNetworkPolicy, sandbox.CapTerminateSession, sandbox.CapForceTerminateSession} {
		if r.HasCap(string(c)) {
			caps = caps.With(c)
		}
	}
	return caps, nil
}

// Mint returns a fresh sandbox name on the runner the placement policy
// puts first for a create that asks nothing (Place: the least loaded
// online runner), or Unavailable{no_runner_online}, or a *NoFitError.
// Fountain's platform placed on the most recently connected runner, so every
// sandbox went to the newest one. An application that keeps records
// places through Place, with the create's limits and selector and what
// its records say each runner holds.
func (p *Provider) Mint(ctx context.Context) (string, error) {
	cs, err := p.Place(ctx, PlaceRequest{})
	if err != nil {
		return "", err
	}
	return For(cs[0].Info.ID)
}

type cmdPrivate struct {
	runnerID, name string
	stdin          bool

	mu      sync.Mutex
	sub     *Subscription // the current one; a resume replaces it
	sid     string        // the session's wire id, once the spawn or attach answered
	stopped bool
	cancel  context.CancelFunc // ends a resume under way
	ready   chan struct{}      // closed once the spawn or attach answered (sid set or not)
}

func (p *Provider) call(ctx context.Context, runnerID string, req *wire.Request, sub *Subscription) (json.RawMessage, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.timeout)
		defer cancel()
	}
	r, err := p.c.Call(ctx, runnerID, req, sub)
	if err != nil {
		return nil, err
	}
	if err := r.Err(); err != nil {
		return nil, err
	}
	return r.Result, nil
}

// op checks h, parses its runner id and calls op with the name set.
func (p *Provider) op(ctx context.Context, h *sandbox.Handle, req *wire.Request) (json.RawMessage, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	id, err := Parse(h.Name)
	if err != nil {
		return nil, err
	}
	req.Name = h.Name
	return p.call(ctx, id, req, nil)
}

func malformed(what string, res []byte) error {
	return &sandbox.ProviderError{Provider: Name, Reason: "malformed_" + what + "_reply", Err: errors.New(clip(string(res), 200))}
}

// Create makes or adopts the named sandbox on its runner. Limits go to
// the runner in create's limits field, and only to a runner that reported
// create_limits: any other (Fountain's daemon) would accept and drop
// them, so a create with limits is ErrNotSupported there, never a sandbox
// without its limits. The runner's provider refuses a limit it cannot
// enforce.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	h := sandbox.BuildHandle(Name, name)
	// A runner's sandboxes are on its user's machine: no host path of
	// the platform's means anything there.
	if err := sandbox.CheckNoMounts(Name, opts); err != nil {
		return nil, err
	}
	req := &wire.Request{Op: wire.OpCreate}
	if l := opts.Limits; l != (sandbox.Limits{}) {
		if err := l.Validate(); err != nil {
			return nil, err
		}
		r, err := p.runnerOf(ctx, h)
		if err != nil {
			return nil, err
		}
		if !r.HasCap(wire.CapLimits) {
			return nil, fmt.Errorf("runner %s (%s) does not take resource limits (no %s): %w", r.Name, r.ID, wire.CapLimits, sandbox.ErrNotSupported)
		}
		if l.DiskBytes > 0 && !r.HasCap(wire.CapDiskLimit) {
			return nil, fmt.Errorf("runner %s (%s) does not take a disk limit (no %s): %w", r.Name, r.ID, wire.CapDiskLimit, sandbox.ErrNotSupported)
		}
		req.Limits = &wire.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUMillis: l.CPUMillis, WallClockMS: l.WallClock.Milliseconds(), DiskBytes: l.DiskBytes}
		if l.WallClock > 0 && req.Limits.WallClockMS == 0 {
			req.Limits.WallClockMS = 1
		}
	}
	if _, err := p.op(ctx, h, req); err != nil {
		return nil, err
	}
	return h, nil
}

// Get asks the runner; an unrecognised status is StatusUnknown.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	res, err := p.op(ctx, h, &wire.Request{Op: wire.OpGet})
	if err != nil {
		return sandbox.Info{}, err
	}
	var r struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(res, &r)
	st := sandbox.StatusUnknown
	switch r.Status {
	case "running":
		st = sandbox.StatusRunning
	case "suspended":
		st = sandbox.StatusSuspended
	}
	return sandbox.Info{Status: st, Raw: res}, nil
}

// Destroy removes the sandbox; not_found is success.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	_, err := p.op(ctx, h, &wire.Request{Op: wire.OpDestroy})
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}

// ListAllNames is the union of every online runner's list; the first
// failure refuses the whole view.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	parts, err := p.ListParts(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	out := []string{}
	for _, part := range parts {
		if part.Err != nil {
			// Not the whole view: say which runner, never a part.
			return nil, fmt.Errorf("runner %s did not list its sandboxes (%v): %w", part.Source, part.Err, sandbox.ErrTruncated)
		}
		for _, n := range part.Names {
			if !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	return out, nil
}

// ListParts lists each online runner's sandboxes apart
// (sandbox.PartialLister): a runner that fails or answers badly is one
// part with its error, and the others are whole.
func (p *Provider) ListParts(ctx context.Context) ([]sandbox.ListPart, error) {
	rs, err := p.c.Runners(ctx)
	if err != nil {
		return nil, err
	}
	parts := make([]sandbox.ListPart, len(rs))
	for i, r := range rs {
		parts[i].Source = r.Name
		res, err := p.call(ctx, r.ID, &wire.Request{Op: wire.OpList}, nil)
		if err != nil {
			parts[i].Err = err
			continue
		}
		var names []string
		var probe map[string]json.RawMessage
		if json.Unmarshal(res, &probe) != nil || json.Unmarshal(probe["names"], &names) != nil || names == nil {
			parts[i].Err = malformed("list", res)
			continue
		}
		parts[i].Names = names
	}
	return parts, nil
}

// Suspend stops the sandbox's sessions and marks it suspended.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	_, err := p.op(ctx, h, &wire.Request{Op: wire.OpSuspend})
	return err
}

// Resume unmarks it and returns the same handle.
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	if _, err := p.op(ctx, h, &wire.Request{Op: wire.OpResume}); err != nil {
		return nil, err
	}
	return h, nil
}

// WriteFile writes data at path; Mode zero means the runner's default.
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, opts sandbox.WriteFileOptions) error {
	if len(data) > wire.MaxWriteFile {
		// One frame carries the file: a larger one would close the
		// runner's whole connection (it read as runner_disconnected).
		return sandbox.Invalid("file_too_large", fmt.Sprintf("%d bytes: a runner takes files of at most %d MiB in one write", len(data), wire.MaxWriteFile>>20))
	}
	req := &wire.Request{Op: wire.OpWriteFile, Path: path, Data: wire.StrPtr(wire.EncodeData(data))}
	if opts.Mode != 0 {
		m := int64(opts.Mode.Perm())
		req.Mode = &m
	}
	_, err := p.op(ctx, h, req)
	return err
}

// ReadFile reads the file at path in the sandbox, through the runner
// (read_file). A runner that does not report read_file (Fountain's
// daemon) is not_supported without a frame sent (Conn.accepts); see
// Advertised for a provider that claims FileReader only where it works.
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	res, err := p.op(ctx, h, &wire.Request{Op: wire.OpReadFile, Path: path})
	if err != nil {
		return nil, err
	}
	var r struct {
		Data string `json:"data"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return nil, &sandbox.ProviderError{Provider: Name, Reason: "read_file", Err: err}
	}
	data, err := wire.DecodeData(r.Data)
	if err != nil {
		return nil, &sandbox.ProviderError{Provider: Name, Reason: "read_file", Err: err}
	}
	return data, nil
}

var _ sandbox.FileReader = (*Provider)(nil)

func envPairs(env []string) [][]string {
	var out [][]string
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		out = append(out, []string{k, v})
	}
	return out
}

func dirPtr(d string) *string {
	if d == "" {
		return nil
	}
	return &d
}

// Exec runs c to completion on the runner under one deadline.
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return sandbox.ExecResult{}, err
	}
	budget := opts.Timeout
	if dl, ok := ctx.Deadline(); ok && budget == 0 {
		budget = time.Until(dl)
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		req := &wire.Request{Op: wire.OpExec, Cmd: c.Name, Args: c.Args, Env: envPairs(opts.Env),
			Dir: dirPtr(opts.Dir), StderrToStdout: opts.StderrToStdout}
		if dl, ok := ctx.Deadline(); ok {
			ms := max(time.Until(dl).Milliseconds(), 1)
			req.TimeoutMS = &ms
			// The call waits for the command's own deadline plus 10 s.
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl.Add(10*time.Second))
			defer cancel()
		}
		res, err := p.op(ctx, h, req)
		if sandbox.IsExecTimeout(err) {
			return sandbox.ExecResult{}, sandbox.ExecTimeout(budget) // the original budget
		}
		if err != nil {
			return sandbox.ExecResult{}, err
		}
		var r struct {
			Output    *string `json:"output"`
			Code      *int    `json:"code"`
			Truncated bool    `json:"truncated"`
		}
		if json.Unmarshal(res, &r) != nil || r.Output == nil || r.Code == nil {
			return sandbox.ExecResult{}, malformed("exec", res)
		}
		out, err := wire.DecodeData(*r.Output)
		if err != nil {
			out = []byte(*r.Output)
		}
		return sandbox.CapOutput(sandbox.ExecResult{Output: out, ExitCode: *r.Code, Truncated: r.Truncated}, opts.MaxOutput), nil
	})
}

// subscribe runs a spawn or attach request with a fresh subscription.
func (p *Provider) subscribe(ctx context.Context, h *sandbox.Handle, req *wire.Request, want string) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	rid, err := Parse(h.Name)
	if err != nil {
		return nil, err
	}
	req.Name = h.Name
	rctx, cancel := context.WithCancel(context.Background())
	priv := &cmdPrivate{runnerID: rid, name: h.Name, stdin: req.Stdin || req.TTY, cancel: cancel, ready: make(chan struct{})}
	defer close(priv.ready)
	cmd, stream := sandbox.NewCommand(p, "", priv)
	sub := p.newSub(rctx, stream, priv, 0, 0, 0)
	priv.sub = sub
	res, err := p.call(ctx, rid, req, sub)
	if err != nil {
		cancel()
		stream.Detach()
		return nil, err
	}
	var r struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(res, &r)
	if r.SessionID == "" || (want != "" && r.SessionID != want && !canonicalOf(r.SessionID, want, h.Name)) {
		cancel()
		p.c.Unsubscribe(sub)
		stream.Detach()
		return nil, malformed(req.Op, res)
	}
	cmd.SessionID = r.SessionID
	priv.mu.Lock()
	priv.sid = r.SessionID
	priv.mu.Unlock()
	return cmd, nil
}

// newSub is a subscription feeding stream that resumes when its reader
// falls behind (see Subscription). Its output begins at offset base of
// the session's: a daemon attached at that offset (wire.CapAttachOffset)
// sends from there, and sum is the CRC-32C of the bytes before it; or,
// with skip > 0 (a daemon without the capability replays from byte
// zero), the subscription drops the first skip bytes of the replay and
// checks they sum to sum.
func (p *Provider) newSub(ctx context.Context, stream *sandbox.Stream, priv *cmdPrivate, base, skip int64, sum uint32) *Subscription {
	sub := NewSubscription(stream)
	if skip > 0 {
		sub.skip, sub.want = skip, sum
	} else {
		sub.sum = sum
	}
	sub.onBehind = func(pos int64, sum uint32) {
		// Called under the connection's lock: the resume runs apart,
		// from the offset this subscription began at plus what it
		// delivered, checking the replay against the bytes' checksum.
		go p.resume(ctx, stream, priv, sub, base+skip+pos, sum)
	}
	return sub
}

// attachesAt reports whether runner id's daemon starts an attach at an
// offset (wire.CapAttachOffset).
func (p *Provider) attachesAt(ctx context.Context, id string) bool {
	rs, err := p.c.Runners(ctx)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.ID == id {
			return r.HasCap(wire.CapAttachOffset)
		}
	}
	return false
}

// resume takes over from a subscription whose reader fell behind: once
// the reader has drained most of what is queued, it attaches to the
// session again and delivers its output from offset pos on, then the
// live output: a daemon with wire.CapAttachOffset is asked to start
// there (the bytes before pos, which the reader has, never cross the
// socket); from one without (Fountain's) the replay comes from byte zero
// and the bytes before pos are dropped here. So a slow reader slows only
// itself and loses nothing, as on provider/local, whose journal the
// daemon's replay reads. A resume that cannot attach ends the Command
// with the attach's error.
func (p *Provider) resume(ctx context.Context, stream *sandbox.Stream, priv *cmdPrivate, old *Subscription, pos int64, sum uint32) {
	select {
	case <-priv.ready:
	case <-ctx.Done():
		return
	}
	p.c.Unsubscribe(old)
	if !stream.WaitRoom(ctx, sandbox.StreamLimit/4) {
		return // stopped, or ended
	}
	req := &wire.Request{Op: wire.OpAttach, Name: priv.name, Stdin: priv.stdin}
	var sub *Subscription
	if pos > 0 && p.attachesAt(ctx, priv.runnerID) {
		req.Offset, req.OffsetCRC = &pos, sum
		sub = p.newSub(ctx, stream, priv, pos, 0, sum)
	} else {
		sub = p.newSub(ctx, stream, priv, 0, pos, sum)
	}
	priv.mu.Lock()
	sid := priv.sid
	if priv.stopped || sid == "" {
		priv.mu.Unlock()
		return
	}
	priv.sub = sub
	priv.mu.Unlock()
	actx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	req.SessionID = sid
	r, err := p.c.Call(actx, priv.runnerID, req, sub)
	if err == nil {
		err = r.Err()
	}
	if err != nil {
		if ctx.Err() == nil {
			stream.Fail(err)
		}
		return
	}
	priv.mu.Lock()
	stopped := priv.stopped
	priv.mu.Unlock()
	if stopped {
		p.c.Unsubscribe(sub) // a Stop came during the call
	}
}

// canonicalOf reports whether got is the daemon's wire id of the session
// of sandbox name that want names by its provider's id: want, "--", and
// wire.SandboxTag(name) (runner/serve.go). An attach of a session by the
// id its provider gave it is answered with that id, and the session's
// frames come under it.
func canonicalOf(got, want, name string) bool {
	return got == want+"--"+wire.SandboxTag(name)
}

// Spawn starts c as a detachable session on the runner.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	return p.subscribe(ctx, h, &wire.Request{Op: wire.OpSpawn, Cmd: c.Name, Args: c.Args, Env: envPairs(opts.Env),
		Dir: dirPtr(opts.Dir), Stdin: opts.Stdin, TTY: opts.TTY, Detachable: opts.Detachable}, "")
}

// Attach re-joins a session: replay from byte zero, then live output.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.AttachOptions) (*sandbox.Command, error) {
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	return p.subscribe(ctx, h, &wire.Request{Op: wire.OpAttach, SessionID: sessionID, Stdin: opts.Stdin}, sessionID)
}

func (p *Provider) private(c *sandbox.Command) (*cmdPrivate, error) {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return nil, err
	}
	priv, ok := c.Private.(*cmdPrivate)
	if !ok {
		return nil, sandbox.Invalid(sandbox.ReasonHandle, "command without runner state")
	}
	return priv, nil
}

// WriteStdin sends data to the session's stdin. not_found is
// command_exited; a transport failure is WriteFailed.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	priv, err := p.private(c)
	if err != nil {
		return err
	}
	_, err = p.call(ctx, priv.runnerID, &wire.Request{Op: wire.OpStdin, Name: priv.name, SessionID: c.SessionID,
		Data: wire.StrPtr(wire.EncodeData(data))}, nil)
	var una *sandbox.UnavailableError
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return sandbox.ErrCommandExited
	case errors.As(err, &una):
		return &sandbox.WriteFailedError{Err: err}
	}
	return err
}

// CloseStdin sends EOF; a gone or finished session is success.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	priv, err := p.private(c)
	if err != nil {
		return err
	}
	_, err = p.call(ctx, priv.runnerID, &wire.Request{Op: wire.OpStdinClose, Name: priv.name, SessionID: c.SessionID}, nil)
	if errors.Is(err, sandbox.ErrNotFound) || errors.Is(err, sandbox.ErrCommandExited) {
		return nil
	}
	return err
}

var _ sandbox.CommandSignaler = (*Provider)(nil)

// SignalCommand sends sig to the session's process group on its runner
// (the signal op), as a CLI forwards its Ctrl-C. A runner whose daemon
// did not report the signal capability (Fountain's daemon) is
// ErrNotSupported, checked on the connection that carries the request; a
// session that ended is ErrCommandExited.
func (p *Provider) SignalCommand(ctx context.Context, c *sandbox.Command, sig syscall.Signal) error {
	priv, err := p.private(c)
	if err != nil {
		return err
	}
	if c.Finished() {
		return sandbox.ErrCommandExited
	}
	_, err = p.call(ctx, priv.runnerID, &wire.Request{Op: wire.OpSignal, Name: priv.name, SessionID: c.SessionID, Signal: int(sig)}, nil)
	if errors.Is(err, sandbox.ErrNotFound) {
		return sandbox.ErrCommandExited
	}
	return err
}

// StopCommand unsubscribes locally; the daemon is told to detach when this
// was the session's last listener. The remote process keeps running.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if priv, err := p.private(c); err == nil {
		priv.mu.Lock()
		priv.stopped = true
		sub := priv.sub
		priv.mu.Unlock()
		priv.cancel()
		p.c.Unsubscribe(sub)
	}
	return nil
}

// ListSessions lists the sandbox's sessions, newest first. A session's
// State is the daemon's (wire.Session.RunState): one that says neither its
// state nor an exit code (Fountain's daemon's running session) is
// running, so the platform never parks a sandbox for a session it could
// not see end. An exited session carries its exit code.
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	res, err := p.op(ctx, h, &wire.Request{Op: wire.OpListSessions})
	if err != nil {
		return nil, err
	}
	var probe map[string]json.RawMessage
	var rows []wire.Session
	if json.Unmarshal(res, &probe) != nil || json.Unmarshal(probe["sessions"], &rows) != nil || rows == nil {
		return nil, malformed("sessions", res)
	}
	ts := func(s string) time.Time {
		t, _ := time.Parse(time.RFC3339, s)
		return t
	}
	out := make([]sandbox.Session, 0, len(rows))
	for _, r := range rows {
		s := sandbox.Session{ID: r.ID, Command: r.Command, CreatedAt: ts(r.CreatedAt),
			LastActivityAt: ts(r.LastActivityAt), TTY: r.TTY}
		switch r.RunState() {
		case wire.SessionRunning:
			s.State = sandbox.SessionRunning
		case wire.SessionExited:
			s.State = sandbox.SessionExited
			if r.ExitCode != nil {
				s.ExitCode = *r.ExitCode
			}
		case wire.SessionLost:
			s.State = sandbox.SessionLost
		}
		out = append(out, s)
	}
	return out, nil
}

func (p *Provider) runnerHas(ctx context.Context, h *sandbox.Handle, c sandbox.Capability) error {
	r, err := p.runnerOf(ctx, h)
	if err != nil {
		return err
	}
	if !r.HasCap(string(c)) {
		return sandbox.ErrNotSupported
	}
	return nil
}

// runnerOf is the online runner that hosts h, or Unavailable{runner_offline}.
func (p *Provider) runnerOf(ctx context.Context, h *sandbox.Handle) (Info, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return Info{}, err
	}
	id, err := Parse(h.Name)
	if err != nil {
		return Info{}, err
	}
	rs, err := p.c.Runners(ctx)
	if err != nil {
		return Info{}, err
	}
	for _, r := range rs {
		if r.ID == id {
			return r, nil
		}
	}
	return Info{}, sandbox.Unavailable(ReasonOffline, nil)
}

// ApplyNetworkPolicy is served by runners that advertise network_policy;
// others answer ErrNotSupported.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	if err := p.runnerHas(ctx, h, sandbox.CapNetworkPolicy); err != nil {
		return err
	}
	allow := pol.Allow
	if allow == nil {
		allow = []string{}
	}
	_, err := p.op(ctx, h, &wire.Request{Op: wire.OpNetworkPolicy, Allow: &allow})
	return err
}

// TerminateSession is served by runners that advertise terminate_session.
func (p *Provider) TerminateSession(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.TerminateOptions) error {
	opts, err := sandbox.ValidateTermination(sessionID, opts)
	if err != nil {
		return err
	}
	need := sandbox.CapTerminateSession
	if opts.Mode == sandbox.Force {
		need = sandbox.CapForceTerminateSession
	}
	if err := p.runnerHas(ctx, h, need); err != nil {
		return err
	}
	ms := opts.Timeout.Milliseconds()
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout+5*time.Second)
	defer cancel()
	_, err = p.op(ctx, h, &wire.Request{Op: wire.OpTerminateSession, SessionID: sessionID, TimeoutMS: &ms, Force: opts.Mode == sandbox.Force})
	return err
}

// HostPath maps /home/sprite (and below) to the runner's real sandbox
// directory, from get's path; any other path, or a runner that cannot be
// reached, gives path unchanged.
func (p *Provider) HostPath(h *sandbox.Handle, path string) string {
	const home = "/home/sprite"
	if path != home && !strings.HasPrefix(path, home+"/") {
		return path
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	res, err := p.op(ctx, h, &wire.Request{Op: wire.OpGet})
	if err != nil {
		return path
	}
	var r struct {
		Path string `json:"path"`
	}
	if json.Unmarshal(res, &r) != nil || r.Path == "" {
		return path
	}
	return r.Path + strings.TrimPrefix(path, home)
}
