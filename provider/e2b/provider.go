package e2b

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "e2b"

// Provider is a sandbox.Provider for E2B. It is safe for concurrent use.
type Provider struct {
	cfg      Config
	domains  sync.Map     // sandbox id → its envd domain ("" for Config.Domain)
	versions sync.Map     // sandbox id → its envd version
	tokens   sync.Map     // sandbox id → its envdAccessToken ("" when not secure)
	gen      atomic.Int32 // the create and connect routes' generation, once known
	killMu   sync.Mutex
	kills    map[chan struct{}]struct{} // process-tree kills running in the background
}

var (
	_ sandbox.Provider   = (*Provider)(nil)
	_ sandbox.FileReader = (*Provider)(nil)
)

// New returns a Provider for cfg. It fails, naming E2B_API_KEY, when
// cfg.APIKey is empty; it does no I/O.
func New(cfg Config) (*Provider, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Provider{cfg: c}, nil
}

// NewFromEnv is New(ConfigFromEnv()).
func NewFromEnv() (*Provider, error) { return New(ConfigFromEnv()) }

// Close waits for the process-tree kills of timed-out or cancelled execs
// still running (each bounded by Config.KillTimeout) and releases idle
// connections. Commands still running keep theirs.
func (p *Provider) Close() error {
	p.killMu.Lock()
	kills := make([]chan struct{}, 0, len(p.kills))
	for k := range p.kills {
		kills = append(kills, k)
	}
	p.killMu.Unlock()
	for _, k := range kills {
		<-k
	}
	p.cfg.HTTPClient.CloseIdleConnections()
	return nil
}

// Name returns "e2b".
func (p *Provider) Name() string { return Name }

// Capabilities are suspend (pause/connect), network_policy (denyOut
// 0.0.0.0/0 plus an allow-list) and attach (journaled detachable spawns).
func (p *Provider) Capabilities() sandbox.Capabilities {
	return sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapNetworkPolicy, sandbox.CapAttach)
}

// Create adopts the running or paused sandbox that carries name, or makes
// one stamped with it. When a concurrent Create made another, every racer
// converges on the canonical one (oldest creation stamp, then smallest
// id): a racer whose sandbox is not canonical kills it, and one whose
// sandbox is canonical kills the younger duplicates of the same race
// (stamped within raceWindow of its own), which a racer that listed before
// the canonical one was visible kept. No operation reaches a
// non-canonical duplicate: every one resolves the name to the canonical.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	if err := sandbox.CheckNoMounts(Name, opts); err != nil {
		return nil, err
	}
	if opts.Limits != (sandbox.Limits{}) {
		return nil, sandbox.Invalid("limits", "e2b sizes sandboxes by template; per-sandbox limits cannot be applied")
	}
	found, err := p.findAll(ctx, name)
	if err != nil {
		return nil, err
	}
	if len(found) > 0 {
		return p.handle(name, found[0].id()), nil
	}
	stamp := time.Now()
	id, err := p.createRaw(ctx, name, stamp)
	if err != nil {
		return nil, err
	}
	found, err = p.findAll(ctx, name)
	if err != nil || len(found) == 0 {
		return p.handle(name, id), nil // the listing cannot say yet
	}
	if found[0].id() == id {
		// Ours is canonical; a racer that created first but stamped
		// later may have kept its own before ours was listed.
		for _, l := range found[1:] {
			at, perr := time.Parse(time.RFC3339Nano, l.Metadata[MetaCreated])
			if perr != nil || at.Sub(stamp).Abs() > raceWindow {
				continue
			}
			if err := p.kill(ctx, l.id()); err != nil {
				p.cfg.Logger.Warn("e2b: could not remove the duplicate a create race made", "name", name, "sandbox", l.id(), "err", err)
			}
		}
		return p.handle(name, id), nil
	}
	if !slices.ContainsFunc(found, func(l listed) bool { return l.id() == id }) {
		// Not listed yet: keep ours; a later Create or Get converges.
		return p.handle(name, id), nil
	}
	if err := p.kill(ctx, id); err != nil {
		p.cfg.Logger.Warn("e2b: could not remove the duplicate a create race made", "name", name, "sandbox", id, "err", err)
	}
	return p.handle(name, found[0].id()), nil
}

// raceWindow bounds which duplicates a canonical Create removes: those
// stamped this close to its own, made by the same race.
const raceWindow = 2 * time.Minute

func (p *Provider) handle(name, id string) *sandbox.Handle {
	h := sandbox.BuildHandle(Name, name)
	h.Private = id
	return h
}

// Get reports the sandbox's state without resuming it. A sandbox the
// listing shows paused is read again by its own record, which says running
// for one being snapshotted (the listing shows it paused when an earlier
// pause left a snapshot record); when the record cannot be read, the
// listing's word stands.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return sandbox.Info{}, err
	}
	l, err := p.lookup(ctx, h)
	if err != nil {
		return sandbox.Info{}, err
	}
	if l.State == "paused" {
		if d, err := p.detail(ctx, l.id()); err == nil {
			l = d
		}
	}
	st := sandbox.StatusUnknown
	switch l.State {
	case "running":
		st = sandbox.StatusRunning
	case "paused":
		st = sandbox.StatusSuspended
	}
	return sandbox.Info{Status: st, Raw: l.raw}, nil
}

// Destroy kills every sandbox that carries the name (and the one the
// handle names, which the listing leaves out while it is snapshotted); nil
// when none does.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	found, err := p.findAll(ctx, h.Name)
	if err != nil {
		return err
	}
	if len(found) == 0 {
		l, err := p.lookup(ctx, h)
		switch {
		case isNotFound(err):
			return nil
		case err != nil:
			return err
		}
		found = []listed{l}
	}
	for _, l := range found {
		if err := p.kill(ctx, l.id()); err != nil {
			return err
		}
	}
	return nil
}

// ListAllNames returns the name of every sandbox this provider stamped,
// over every page of the listing, or ErrTruncated past MaxPages pages.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	ls, err := p.list(ctx, url.Values{MetaMarker: {"1"}})
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(ls))
	for _, l := range ls {
		if n := l.Metadata[MetaName]; n != "" {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Suspend pauses the sandbox; a paused one is left as it is. Only the
// sandbox's own record (GET /sandboxes/{id}) says it is paused: the
// listing shows a sandbox paused also while it is being snapshotted or
// killed when an earlier pause left a snapshot, and a snapshotted one runs
// (and bills) again after. E2B's pause waits out a snapshot or a pause in
// progress and answers 409 when the sandbox is already paused or is being
// killed; after a 409 only a record that says paused is success.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	l, err := p.lookup(ctx, h)
	if err != nil {
		return err
	}
	if l.State == "paused" {
		if paused, err := p.pausedNow(ctx, h.Name, l.id()); err != nil || paused {
			return err
		}
	}
	_, b, err := p.doTimeout(ctx, p.cfg.LongRequestTimeout, http.MethodPost, "/sandboxes/"+url.PathEscape(l.id())+"/pause", struct{}{})
	if isTransitioning(err) {
		if paused, perr := p.pausedNow(ctx, h.Name, l.id()); perr == nil && paused {
			return nil
		}
		return err
	}
	if err == nil {
		p.domains.Delete(l.id()) // a resume may place it elsewhere
	}
	return p.confirmGone(ctx, h.Name, err, b)
}

// pausedNow reports whether sandbox id's own record says paused. A record
// that is not found (the sandbox is gone or being killed) is ErrNotFound
// once the listing agrees, else Unavailable.
func (p *Provider) pausedNow(ctx context.Context, name, id string) (bool, error) {
	d, err := p.detail(ctx, id)
	if err != nil {
		return false, p.confirmGone(ctx, name, err, nil)
	}
	return d.State == "paused", nil
}

// Resume connects to the sandbox, resuming it when paused.
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return nil, err
	}
	return p.handle(h.Name, id), nil
}

// WriteFile uploads data through envd's files API, which creates the
// parent directories. The mode is not honoured (the API has none).
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, opts sandbox.WriteFileOptions) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	if path == "" || strings.IndexByte(path, 0) >= 0 {
		return sandbox.Invalid("path", "empty path or a path with NUL")
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return err
	}
	return p.writeFile(ctx, id, path, data)
}

// ReadFile downloads a file through envd's files API (sandbox.FileReader).
// A missing file is ErrNotFound.
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return nil, err
	}
	return p.readFile(ctx, id, path, 1<<30)
}

func newTag(prefix string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func envMap(env []string) map[string]string {
	m := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if k != "" {
			m[k] = v
		}
	}
	return m
}

// start opens a Start stream for one command and returns its Command once
// envd acknowledged the process.
func (p *Provider) start(ctx context.Context, sandboxID string, sr startRequest, srv *cmdServer) (*sandbox.Command, error) {
	cmd, stream := sandbox.NewCommand(p, "", &cmdPrivate{srv: srv})
	if srv.journaled {
		cmd.SessionID = srv.tag
	}
	srv.stream = stream
	srv.started = make(chan struct{})
	srv.finished = make(chan struct{})
	srv.sandboxID = sandboxID
	srv.p = p
	sctx, cancel := context.WithCancel(context.Background())
	body, err := p.startStream(sctx, sandboxID, sr)
	if err != nil {
		cancel()
		stream.Detach()
		return nil, err
	}
	srv.body = body
	srv.cancel = cancel
	go srv.run()
	if err := srv.awaitStart(ctx); err != nil {
		srv.stop()
		stream.Detach()
		return nil, normalize(err)
	}
	return cmd, nil
}

// cmdPrivate is a Command's private state.
type cmdPrivate struct {
	srv *cmdServer
}

// Exec runs c through envd's Start stream and collects it under Exec's
// single deadline; a command still running at the deadline, or when the
// caller cancels, is killed with its whole process tree.
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return sandbox.ExecResult{}, err
	}
	if c.Name == "" {
		return sandbox.ExecResult{}, sandbox.Invalid("command", "empty command name")
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		budget := opts.Timeout
		if dl, ok := ctx.Deadline(); ok && budget <= 0 {
			budget = time.Until(dl)
		}
		id, err := p.resolveRunning(ctx, h)
		if err != nil {
			return sandbox.ExecResult{}, err
		}
		if ctx.Err() != nil { // the lookup spent the budget: never dispatch
			return sandbox.ExecResult{}, sandbox.ExecTimeout(budget)
		}
		f := false
		srv := &cmdServer{tag: newTag(execPrefix)}
		pc := processConfig{Cmd: c.Name, Args: c.Args, Envs: envMap(opts.Env), Cwd: opts.Dir}
		if versionLess(p.envdVersion(id), EnvdStdinVersion) {
			pc = noStdin(pc) // this envd ignores stdin:false
		}
		cmd, err := p.start(ctx, id, startRequest{Process: pc, Tag: srv.tag, Stdin: &f}, srv)
		if err != nil {
			if ctx.Err() != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return sandbox.ExecResult{}, sandbox.ExecTimeout(budget)
			}
			return sandbox.ExecResult{}, err
		}
		res, err := sandbox.CollectExecMax(ctx, cmd, opts.StderrToStdout, budget, opts.MaxOutput, normalize)
		if sandbox.IsExecTimeout(err) || errors.Is(err, context.Canceled) {
			// Past its deadline, or given up by its caller: the command
			// and everything it started must not run on. The kill goes on
			// in the background, so the caller hears at once, unless the
			// caller's process may exit as soon as Exec returns.
			if done := p.killTree(id, srv); p.cfg.ExecWaitsForKill {
				<-done
			}
		}
		return res, err
	})
}

// Spawn starts c and returns once envd acknowledged it. A Detachable spawn
// runs under the journaling shim (see ShimScript) so that Attach can replay
// it from byte zero and recover its exit code.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, sandbox.Invalid("command", "empty command name")
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return nil, err
	}
	srv := &cmdServer{tag: newTag(SessionPrefix), journaled: opts.Detachable}
	pc := processConfig{Cmd: c.Name, Args: c.Args, Envs: envMap(opts.Env), Cwd: opts.Dir}
	if opts.Detachable {
		pc.Cmd, pc.Args = "bash", []string{"-lc", ShimScript(srv.tag, c.Argv())}
	}
	if !opts.Stdin && versionLess(p.envdVersion(id), EnvdStdinVersion) {
		pc = noStdin(pc) // this envd ignores stdin:false
	}
	stdin := opts.Stdin
	return p.start(ctx, id, startRequest{Process: pc, Tag: srv.tag, Stdin: &stdin}, srv)
}

func private(c *sandbox.Command) *cmdServer {
	if c == nil {
		return nil
	}
	if pr, ok := c.Private.(*cmdPrivate); ok && pr != nil {
		return pr.srv
	}
	return nil
}

// WriteStdin sends data to the command's process, by pid when known and by
// tag otherwise; a tag refused with 404 (envd's answer after a pause and
// resume) is resolved to a pid through List once and retried. A process
// that is gone is ErrCommandExited; a command without private state (not
// made by this provider) is ErrCommandExited too, never a panic.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return err
	}
	srv := private(c)
	if srv == nil || srv.stopped.Load() {
		return sandbox.ErrCommandExited
	}
	in := func(sel selector) map[string]any {
		return map[string]any{"process": sel, "input": map[string]string{"stdin": base64.StdEncoding.EncodeToString(data)}}
	}
	err := p.stdinCall(ctx, srv, "SendInput", in)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, sandbox.ErrNotFound):
		return sandbox.ErrCommandExited
	case errors.Is(err, sandbox.ErrCommandExited):
		return err
	}
	return &sandbox.WriteFailedError{Err: err}
}

// CloseStdin sends EOF to the command's process. A process that is gone
// has no stdin to close: nil.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return err
	}
	srv := private(c)
	if srv == nil || srv.stopped.Load() {
		return sandbox.ErrCommandExited
	}
	if v := p.envdVersion(srv.sandboxID); versionLess(v, EnvdCloseStdinVersion) {
		return errNoCloseStdin(v)
	}
	err := p.stdinCall(ctx, srv, "CloseStdin", func(sel selector) map[string]any {
		return map[string]any{"process": sel}
	})
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}

func (p *Provider) stdinCall(ctx context.Context, srv *cmdServer, method string, body func(selector) map[string]any) error {
	sel := srv.selector()
	err := p.unary(ctx, srv.sandboxID, method, body(sel), nil)
	if !errors.Is(err, sandbox.ErrNotFound) || sel.Tag == "" {
		return err
	}
	procs, lerr := p.listProcesses(ctx, srv.sandboxID)
	if lerr != nil {
		return err
	}
	for _, pi := range procs {
		if pi.Tag == srv.tag && pi.Pid != 0 {
			srv.setPid(pi.Pid)
			return p.unary(ctx, srv.sandboxID, method, body(selector{Pid: pi.Pid}), nil)
		}
	}
	return err
}

// StopCommand ends this process's end of the command; the remote process
// keeps running. It is total: a command without private state is fine.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if srv := private(c); srv != nil {
		srv.stop()
	}
	return nil
}

// ListSessions lists the sandbox's detachable (journaled) spawns, running
// or finished (a finished one keeps its journals and can be attached);
// their tags are the session ids. Exec processes, attach replayers and
// spawns that were not Detachable are not sessions: they cannot be
// attached.
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return nil, err
	}
	procs, err := p.listProcesses(ctx, id)
	if err != nil {
		return nil, p.confirmGone(ctx, h.Name, err, nil)
	}
	var out []sandbox.Session
	running := map[string]bool{}
	for _, pi := range procs {
		if !strings.HasPrefix(pi.Tag, SessionPrefix) || !isShim(pi.Config) {
			continue // only journaled spawns are detachable sessions
		}
		running[pi.Tag] = true
		s := sandbox.Session{ID: pi.Tag}
		if argv := shimArgv(pi.Config); len(argv) > 0 {
			s.Command = sandbox.Cmd{Name: argv[0], Args: argv[1:]}.String()
		}
		out = append(out, s)
	}
	// Finished sessions keep their journals and can still be attached.
	entries, err := p.listDir(ctx, id, JournalDir)
	if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
		return nil, err
	}
	for _, en := range entries {
		tag, ok := strings.CutSuffix(en.Name, ".out")
		if !ok || !strings.HasPrefix(tag, SessionPrefix) || running[tag] || sandbox.ValidateSessionID(tag) != nil {
			continue
		}
		s := sandbox.Session{ID: tag, LastActivityAt: en.ModifiedTime}
		if b, err := p.readFile(ctx, id, JournalDir+"/"+tag+".cmd", 64<<10); err == nil {
			if argv := decodeArgv(string(b)); len(argv) > 0 {
				s.Command = sandbox.Cmd{Name: argv[0], Args: argv[1:]}.String()
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b sandbox.Session) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Attach replays a journaled session from byte zero and then tails it,
// through a replayer process over the session's journals; the exit code
// comes from the session's exit file, and a session whose shim died
// without writing one ends with Unavailable{closed_before_exit}. A session
// without a journal (unknown, or a spawn that was not Detachable) is
// ErrNotFound: it can never be replayed.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.AttachOptions) (*sandbox.Command, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return nil, err
	}
	procs, err := p.listProcesses(ctx, id)
	if err != nil {
		return nil, p.confirmGone(ctx, h.Name, err, nil)
	}
	for _, pi := range procs {
		if pi.Tag == sessionID && !isShim(pi.Config) {
			return nil, sandbox.ErrNotFound // running, but never journaled
		}
	}
	// Running or finished, a journaled session has its .out journal.
	if _, err := p.readFile(ctx, id, JournalDir+"/"+sessionID+".out", 1); err != nil {
		return nil, err // ErrNotFound: unknown, or never journaled
	}
	f := false
	srv := &cmdServer{tag: sessionID, attach: true, journaled: true}
	return p.start(ctx, id, startRequest{
		Process: processConfig{Cmd: "bash", Args: []string{"-lc", ReplayScript(sessionID)}},
		Tag:     newTag(replayPrefix), Stdin: &f,
	}, srv)
}

// ApplyNetworkPolicy replaces the sandbox's egress rules: deny 0.0.0.0/0,
// allow exactly pol.Allow (E2B's allow entries take precedence), so an
// empty list denies all egress.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	id, err := p.resolveRunning(ctx, h)
	if err != nil {
		return err
	}
	allow := append([]string{}, pol.Allow...)
	// PUT replaces the rules, so repeating it after a 409 is safe.
	return p.retryTransition(ctx, "network", func(ctx context.Context) error {
		return p.byID(ctx, h.Name, http.MethodPut, "/sandboxes/"+url.PathEscape(id)+"/network",
			map[string][]string{"denyOut": {"0.0.0.0/0"}, "allowOut": allow})
	})
}
