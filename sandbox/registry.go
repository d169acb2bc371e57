package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Registry maps provider names to providers and is the facade hosts call:
// creation-side calls take a provider name, everything else dispatches on
// the Handle's (or Command's) Provider. Every call validates its input
// before any provider is called. The zero Registry is empty and ready.
type Registry struct {
	mu sync.RWMutex
	m  map[string]Provider
}

// NewRegistry returns a registry holding ps.
func NewRegistry(ps ...Provider) *Registry {
	r := &Registry{}
	for _, p := range ps {
		r.Register(p)
	}
	return r
}

// Default is the process-wide registry used by the package-level functions.
var Default = &Registry{}

// Register adds p to the default registry under p.Name().
func Register(p Provider) { Default.Register(p) }

// Register adds p under p.Name(), replacing any provider of that name.
func (r *Registry) Register(p Provider) {
	if p == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = map[string]Provider{}
	}
	r.m[p.Name()] = p
}

// Names lists the registered provider names, sorted.
func (r *Registry) Names() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	names := make([]string, 0, len(r.m))
	for n := range r.m {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Provider returns the provider registered as name. An unknown name is an
// InvalidError that lists the known ones.
func (r *Registry) Provider(name string) (Provider, error) {
	r.mu.RLock()
	p, ok := r.m[name]
	r.mu.RUnlock()
	if !ok {
		return nil, &InvalidError{Reason: ReasonProvider,
			Msg: fmt.Sprintf("unknown sandbox provider %q — configured: [%s]", name, strings.Join(r.Names(), ", "))}
	}
	return p, nil
}

func (r *Registry) forHandle(h *Handle) (Provider, error) {
	if h == nil {
		return nil, Invalid(ReasonHandle, "nil handle")
	}
	p, err := r.Provider(h.Provider)
	if err != nil {
		return nil, err
	}
	if err := ValidateName(h.Name); err != nil {
		return nil, err
	}
	return p, nil
}

func (r *Registry) forCommand(c *Command) (*Command, error) {
	if c == nil {
		return nil, Invalid(ReasonHandle, "nil command")
	}
	if _, err := r.Provider(c.Provider); err != nil {
		return nil, err
	}
	return c, nil
}

// Supports reports whether the named provider advertises c and
// implements what c needs (Implemented).
func (r *Registry) Supports(provider string, c Capability) (bool, error) {
	p, err := r.Provider(provider)
	if err != nil {
		return false, err
	}
	return Implemented(p, p.Capabilities()).Has(c), nil
}

// Implemented is caps without the capabilities whose optional interface p
// does not implement (CapCheckpoint without Checkpointer, CapPublicURL
// without PublicURLer, CapCreateNew without CreateNewer, CapDestroyOnce
// without OnceDestroyer, CapCreateCheckpointOnce without
// CheckpointOnceCreator, CapTerminateSession without SessionTerminator):
// a capability is claimed only where the method behind it exists, as
// net/http finds a Flusher. The conformance suite fails a provider whose
// Capabilities claim one it lacks.
func Implemented(p Provider, caps Capabilities) Capabilities {
	var drop []Capability
	for c, ok := range map[Capability]bool{
		CapCheckpoint:           is[Checkpointer](p),
		CapPublicURL:            is[PublicURLer](p),
		CapCreateNew:            is[CreateNewer](p),
		CapDestroyOnce:          is[OnceDestroyer](p),
		CapCreateCheckpointOnce: is[CheckpointOnceCreator](p),
		CapTerminateSession:     is[SessionTerminator](p),
	} {
		if !ok && caps.Has(c) {
			drop = append(drop, c)
		}
	}
	if drop == nil {
		return caps
	}
	return caps.Without(drop...)
}

func is[T any](p Provider) bool { _, ok := p.(T); return ok }

// CapabilitiesOf is what the sandbox h can do: its provider's
// SandboxCapabilities answer where the provider has one (a runner's
// sandboxes have their runner's), else the provider's Capabilities.
func (r *Registry) CapabilitiesOf(ctx context.Context, h *Handle) (Capabilities, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	return capabilitiesOf(ctx, p, h)
}

func capabilitiesOf(ctx context.Context, p Provider, h *Handle) (Capabilities, error) {
	if sc, ok := p.(SandboxCapabilities); ok {
		caps, err := sc.CapabilitiesOf(ctx, h)
		if err != nil {
			return nil, err
		}
		return Implemented(p, caps), nil
	}
	return Implemented(p, p.Capabilities()), nil
}

// Create makes or adopts the named sandbox on provider.
func (r *Registry) Create(ctx context.Context, provider, name string, opts CreateOptions) (*Handle, error) {
	p, err := r.Provider(provider)
	if err != nil {
		return nil, err
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	return p.Create(ctx, name, opts)
}

// CreateNew is one creation attempt that never adopts; ErrNotSupported when
// the provider lacks CreateNewer. It never falls back to Create.
func (r *Registry) CreateNew(ctx context.Context, provider, name string, opts CreateNewOptions) (*Handle, error) {
	p, err := r.Provider(provider)
	if err != nil {
		return nil, err
	}
	if err := ValidateName(name); err != nil {
		return nil, err
	}
	cn, ok := p.(CreateNewer)
	if !ok {
		return nil, ErrNotSupported
	}
	return cn.CreateNew(ctx, name, opts)
}

// ListAllNames returns every sandbox name on provider, or ErrTruncated.
func (r *Registry) ListAllNames(ctx context.Context, provider string) ([]string, error) {
	p, err := r.Provider(provider)
	if err != nil {
		return nil, err
	}
	return p.ListAllNames(ctx)
}

// Get returns the sandbox's status; ErrNotFound only when surely gone.
func (r *Registry) Get(ctx context.Context, h *Handle) (Info, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return Info{}, err
	}
	return p.Get(ctx, h)
}

// Destroy removes the sandbox; nil when it is already gone.
func (r *Registry) Destroy(ctx context.Context, h *Handle) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	return p.Destroy(ctx, h)
}

// DestroyOnce is one bounded, confirmed deletion; ErrNotSupported when the
// provider lacks OnceDestroyer. It never falls back to Destroy.
func (r *Registry) DestroyOnce(ctx context.Context, h *Handle, opts DestroyOnceOptions) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	d, ok := p.(OnceDestroyer)
	if !ok {
		return ErrNotSupported
	}
	return d.DestroyOnce(ctx, h, opts)
}

// Suspend parks the sandbox.
func (r *Registry) Suspend(ctx context.Context, h *Handle) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	return p.Suspend(ctx, h)
}

// Resume wakes the sandbox and returns a usable handle.
func (r *Registry) Resume(ctx context.Context, h *Handle) (*Handle, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	return p.Resume(ctx, h)
}

// WriteFile writes data at path inside the sandbox.
func (r *Registry) WriteFile(ctx context.Context, h *Handle, path string, data []byte, opts WriteFileOptions) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	if path == "" || strings.IndexByte(path, 0) >= 0 {
		return Invalid("path", "empty path or a path with NUL")
	}
	return p.WriteFile(ctx, h, path, data, opts)
}

// ReadFile reads a file inside the sandbox; ErrNotSupported when the
// provider lacks FileReader.
func (r *Registry) ReadFile(ctx context.Context, h *Handle, path string) ([]byte, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	if path == "" || strings.IndexByte(path, 0) >= 0 {
		return nil, Invalid("path", "empty path or a path with NUL")
	}
	fr, ok := p.(FileReader)
	if !ok {
		return nil, ErrNotSupported
	}
	return fr.ReadFile(ctx, h, path)
}

// Exec runs c to completion under one monotonic deadline: opts.Timeout
// and ctx's, whichever is sooner. A spent budget (a negative Timeout, or a
// ctx whose deadline passed) never dispatches. When the deadline passes the
// result is Unavailable{exec_timeout} carrying the original budget, even if
// the command had just exited.
func (r *Registry) Exec(ctx context.Context, h *Handle, c Cmd, opts ExecOptions) (ExecResult, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return ExecResult{}, err
	}
	if c.Name == "" {
		return ExecResult{}, Invalid("command", "empty command name")
	}
	if opts.MaxOutput < 0 {
		return ExecResult{}, Invalid("max_output", "MaxOutput is negative")
	}
	res, err := ExecWithDeadline(ctx, opts, func(ctx context.Context) (ExecResult, error) {
		return p.Exec(ctx, h, c, opts)
	})
	return CapOutput(res, opts.MaxOutput), err
}

// CapOutput cuts res's output to max bytes (0: no cap), saying Truncated:
// the cap of a provider that could not apply it while reading.
func CapOutput(res ExecResult, max int) ExecResult {
	if max > 0 && len(res.Output) > max {
		res.Output, res.Truncated = res.Output[:max:max], true
	}
	return res
}

// ExecWithDeadline applies Exec's deadline rules around run; providers that
// are called directly use it too.
func ExecWithDeadline(ctx context.Context, opts ExecOptions, run func(ctx context.Context) (ExecResult, error)) (ExecResult, error) {
	budget := opts.Timeout
	if budget < 0 {
		return ExecResult{}, ExecTimeout(0)
	}
	if budget > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, budget)
		defer cancel()
	} else if dl, ok := ctx.Deadline(); ok {
		budget = time.Until(dl)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return ExecResult{}, ExecTimeout(budget)
	}
	if err := ctx.Err(); err != nil {
		return ExecResult{}, err
	}
	res, err := run(ctx)
	if ctx.Err() != nil && (err == nil || !IsExecTimeout(err)) {
		if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
			return ExecResult{}, ExecTimeout(budget)
		}
		if err == nil {
			return ExecResult{}, ctx.Err()
		}
	}
	return res, err
}

// Spawn starts c and returns once the provider acknowledged it.
func (r *Registry) Spawn(ctx context.Context, h *Handle, c Cmd, opts SpawnOptions) (*Command, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	if c.Name == "" {
		return nil, Invalid("command", "empty command name")
	}
	return p.Spawn(ctx, h, c, opts)
}

// WriteStdin writes to c's stdin; ErrCommandExited after exit or Stop.
func (r *Registry) WriteStdin(ctx context.Context, c *Command, data []byte) error {
	c, err := r.forCommand(c)
	if err != nil {
		return err
	}
	return c.WriteStdin(ctx, data)
}

// CloseStdin sends EOF to c's stdin.
func (r *Registry) CloseStdin(ctx context.Context, c *Command) error {
	c, err := r.forCommand(c)
	if err != nil {
		return err
	}
	return c.CloseStdin(ctx)
}

// StopCommand detaches locally; always nil for a known provider.
func (r *Registry) StopCommand(c *Command) error {
	c, err := r.forCommand(c)
	if err != nil {
		return err
	}
	return c.Stop()
}

// ListSessions lists the sandbox's detachable sessions.
func (r *Registry) ListSessions(ctx context.Context, h *Handle) ([]Session, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	return p.ListSessions(ctx, h)
}

// Attach re-joins a session, replaying from byte zero then tailing.
func (r *Registry) Attach(ctx context.Context, h *Handle, sessionID string, opts AttachOptions) (*Command, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return nil, err
	}
	if err := ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	return p.Attach(ctx, h, sessionID, opts)
}

// TerminateSession stops one session, keeping the sandbox. In order: an
// invalid request is Invalid{termination_request}; a provider without
// CapTerminateSession or SessionTerminator is ErrNotSupported; Force on a
// provider without CapForceTerminateSession is ErrNotSupported without
// calling it. It never falls back to destroying the sandbox.
func (r *Registry) TerminateSession(ctx context.Context, h *Handle, sessionID string, opts TerminateOptions) error {
	opts, err := ValidateTermination(sessionID, opts)
	if err != nil {
		return err
	}
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	caps, err := capabilitiesOf(ctx, p, h)
	if err != nil {
		return err
	}
	st, ok := p.(SessionTerminator)
	if !ok || !caps.Has(CapTerminateSession) {
		return ErrNotSupported
	}
	if opts.Mode == Force && !caps.Has(CapForceTerminateSession) {
		return ErrNotSupported
	}
	return st.TerminateSession(ctx, h, sessionID, opts)
}

// ApplyNetworkPolicy applies pol; an empty Allow denies all egress.
// Each entry must be one CheckAllowEntry accepts (Invalid{network_policy}
// naming it otherwise); a provider that cannot enforce a form (an
// address or CIDR on a provider that filters by domain only) refuses it
// itself.
func (r *Registry) ApplyNetworkPolicy(ctx context.Context, h *Handle, pol NetworkPolicy) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	for _, d := range pol.Allow {
		if err := CheckAllowEntry(d); err != nil {
			return err
		}
	}
	return p.ApplyNetworkPolicy(ctx, h, pol)
}

// CheckAllowEntry checks the form of one entry of a NetworkPolicy's
// Allow: a domain (example.com, or *.example.com for its subdomains), an
// IPv4 or IPv6 address, or a CIDR (10.0.0.0/8), each optionally with a
// port (example.com:443, 10.0.0.0/8:443, [2001:db8::/32]:443). Anything
// else (a URL, a path, a list in one entry, a space) is
// Invalid{network_policy} naming it.
func CheckAllowEntry(e string) error {
	bad := func(why string) error {
		return Invalid("network_policy", fmt.Sprintf("allow entry %q is neither a domain (example.com, *.example.com) nor an address or CIDR (10.0.0.0/8), each optionally with :PORT: %s", clip(e, 60), why))
	}
	if e == "" || len(e) > 300 {
		return bad("its length")
	}
	host, port := e, ""
	if strings.HasPrefix(e, "[") {
		i := strings.Index(e, "]")
		if i < 0 {
			return bad("an unclosed [")
		}
		host, port = e[1:i], e[i+1:]
		if port != "" && !strings.HasPrefix(port, ":") {
			return bad("something after ]")
		}
		port = strings.TrimPrefix(port, ":")
		if port == "" && e[i+1:] != "" {
			return bad("an empty port")
		}
	} else if strings.Count(e, ":") == 1 {
		host, port, _ = strings.Cut(e, ":")
		if port == "" {
			return bad("an empty port")
		}
	}
	if port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return bad(fmt.Sprintf("port %q is not 1 to 65535", clip(port, 10)))
		}
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return nil
	}
	if _, err := netip.ParsePrefix(host); err == nil {
		return nil
	}
	if strings.ContainsAny(host, "/:") {
		return bad("not an address or CIDR")
	}
	name := strings.TrimSuffix(strings.TrimPrefix(host, "*."), ".")
	labels := strings.Split(name, ".")
	if len(labels) < 2 {
		return bad("a domain has at least two labels")
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return bad(fmt.Sprintf("label %q", clip(l, 20)))
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return bad(fmt.Sprintf("character %q", c))
			}
		}
	}
	return nil
}

// PublicURL returns the sandbox's URL, or ErrNotSupported.
func (r *Registry) PublicURL(ctx context.Context, h *Handle) (string, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return "", err
	}
	u, ok := p.(PublicURLer)
	if !ok {
		return "", ErrNotSupported
	}
	return u.PublicURL(ctx, h)
}

// CreateCheckpoint snapshots the sandbox and returns the checkpoint id.
func (r *Registry) CreateCheckpoint(ctx context.Context, h *Handle, opts CheckpointOptions) (string, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return "", err
	}
	c, ok := p.(Checkpointer)
	if !ok {
		return "", ErrNotSupported
	}
	return c.CreateCheckpoint(ctx, h, opts)
}

// RestoreCheckpoint restores a checkpoint; a reported failure is
// RestoreFailed, never nil.
func (r *Registry) RestoreCheckpoint(ctx context.Context, h *Handle, id string) error {
	p, err := r.forHandle(h)
	if err != nil {
		return err
	}
	c, ok := p.(Checkpointer)
	if !ok {
		return ErrNotSupported
	}
	if id == "" {
		return Invalid("checkpoint", "empty checkpoint id")
	}
	return c.RestoreCheckpoint(ctx, h, id)
}

// CreateCheckpointOnce is the bounded checkpoint creation; ErrNotSupported
// when the provider lacks CheckpointOnceCreator.
func (r *Registry) CreateCheckpointOnce(ctx context.Context, h *Handle, opts CheckpointOnceOptions) (string, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return "", err
	}
	c, ok := p.(CheckpointOnceCreator)
	if !ok {
		return "", ErrNotSupported
	}
	return c.CreateCheckpointOnce(ctx, h, opts)
}

// HostPath maps a sandbox path to a host path where the provider can;
// otherwise it returns path unchanged.
func (r *Registry) HostPath(h *Handle, path string) (string, error) {
	p, err := r.forHandle(h)
	if err != nil {
		return "", err
	}
	if hp, ok := p.(HostPather); ok {
		return hp.HostPath(h, path), nil
	}
	return path, nil
}
