// Package fake is managoat's reference provider: an in-memory sandbox.Provider
// whose commands are scripts run by real goroutines, so the event contract is
// exercised for real. It passes sandbox/sandboxtest in full and is the model
// for adapter authors; hosts can also register it to drive a provisioning
// path without a network.
//
// A command's arguments are its script (the command name is only recorded
// in the session's command line). Instructions run in order:
//
//	out:<data>   a stdout event with <data>
//	err:<data>   a stderr event
//	exit:<code>  the exit event with <code>; the command stops
//	stay         keep running: each stdin write W yields stdout "echo:W";
//	             stdin EOF exits 0
//	drop         the transport closes without an exit: an error event
//	             Unavailable{closed_before_exit}
//	sleep:<dur>  wait <dur> (a Go duration such as 100ms)
//	env:<KEY>    a stdout event with the value of KEY from the options' Env
//	pwd          a stdout event with the options' Dir
//	connect:<host:port>  a real TCP connection from this process to
//	             host:port, made only where the sandbox's network policy
//	             lets it (no policy: any; an empty allow list: none; else
//	             host must be listed, or match a "*.domain" entry): a
//	             stdout "connected", or a stderr line saying why not and
//	             the exit code 1 (a refusal by policy never dials)
//
// A script with no terminal instruction ends with exit 0. An unknown
// instruction is refused with an InvalidError before anything runs.
//
// Where the Elixir library's Fake left gaps, this one does better: replay and
// subscription are atomic with emission (no frame missed or duplicated by a
// concurrent attach), Destroy stops the sandbox's command goroutines instead
// of leaving them running, and Close stops everything.
package fake

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "fake"

// Provider is the fake. The zero value is not usable; call New.
type Provider struct {
	mu       sync.Mutex
	boxes    map[string]*box
	nextID   int
	nextSess int
}

type box struct {
	status     sandbox.Status
	files      map[string][]byte
	policy     *sandbox.NetworkPolicy
	sessions   map[string]*session
	instanceID string
}

// New returns an empty fake.
func New() *Provider { return &Provider{boxes: map[string]*box{}} }

var _ interface {
	sandbox.Provider
	sandbox.CreateNewer
	sandbox.SessionTerminator
	sandbox.FileReader
} = (*Provider)(nil)

// Name returns "fake".
func (p *Provider) Name() string { return Name }

// Capabilities: suspend, network_policy, attach, public_url,
// terminate_session, force_terminate_session, create_new.
func (p *Provider) Capabilities() sandbox.Capabilities {
	return sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapNetworkPolicy, sandbox.CapAttach,
		sandbox.CapPublicURL, sandbox.CapTerminateSession, sandbox.CapForceTerminateSession,
		sandbox.CapCreateNew)
}

// Close stops every command of every sandbox and waits for them.
func (p *Provider) Close() error {
	p.mu.Lock()
	var ss []*session
	for _, b := range p.boxes {
		ss = slices.AppendSeq(ss, maps.Values(b.sessions))
	}
	p.mu.Unlock()
	for _, s := range ss {
		s.kill()
		s.emit(sandbox.Event{Kind: sandbox.Error, Err: sandbox.Unavailable("provider_closed", nil)})
	}
	return nil
}

// Reset stops everything and forgets every sandbox.
func (p *Provider) Reset() {
	_ = p.Close()
	p.mu.Lock()
	p.boxes = map[string]*box{}
	p.mu.Unlock()
}

// Policy returns the last policy applied to the sandbox, verbatim, or nil.
func (p *Provider) Policy(name string) *sandbox.NetworkPolicy {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.boxes[name]; b != nil && b.policy != nil {
		return &sandbox.NetworkPolicy{Allow: slices.Clone(b.policy.Allow)} // an empty list stays non-nil
	}
	return nil
}

// File returns the stored bytes of a file, or nil.
func (p *Provider) File(name, path string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.boxes[name]; b != nil {
		return slices.Clone(b.files[path])
	}
	return nil
}

func (p *Provider) lookup(h *sandbox.Handle) (*box, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	b := p.boxes[h.Name]
	if b == nil {
		return nil, sandbox.ErrNotFound
	}
	return b, nil
}

// Create inserts the name if absent; it always adopts.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	if err := sandbox.CheckNoMounts(p.Name(), opts); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.boxes[name] == nil {
		p.boxes[name] = newBox()
	}
	return sandbox.BuildHandle(Name, name), nil
}

func newBox() *box {
	return &box{status: sandbox.StatusRunning, files: map[string][]byte{}, sessions: map[string]*session{}}
}

// CreateNew is an atomic check-and-insert: of two concurrent calls exactly
// one wins, the other gets ErrAlreadyExists.
func (p *Provider) CreateNew(ctx context.Context, name string, _ sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.boxes[name] != nil {
		return nil, sandbox.ErrAlreadyExists
	}
	p.nextID++
	b := newBox()
	b.instanceID = "fake-" + strconv.Itoa(p.nextID)
	p.boxes[name] = b
	h := sandbox.BuildHandle(Name, name)
	h.InstanceID = b.instanceID
	return h, nil
}

// Get returns the stored status; Raw is {"name","id"} for a sandbox born
// from CreateNew, {} otherwise.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return sandbox.Info{}, err
	}
	raw := json.RawMessage("{}")
	if b.instanceID != "" {
		raw, _ = json.Marshal(map[string]string{"name": h.Name, "id": b.instanceID})
	}
	return sandbox.Info{Status: b.status, Raw: raw}, nil
}

// Destroy deletes the record and stops its commands; nil when absent.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	p.mu.Lock()
	b, err := p.lookup(h)
	if err == nil {
		delete(p.boxes, h.Name)
	}
	p.mu.Unlock()
	if err == sandbox.ErrNotFound {
		return nil
	}
	if err != nil {
		return err
	}
	for _, s := range b.sessions {
		s.kill()
		s.emit(sandbox.Event{Kind: sandbox.Error, Err: sandbox.Unavailable("sandbox_destroyed", nil)})
	}
	return nil
}

// ListAllNames returns every name.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Sorted(maps.Keys(p.boxes)), nil
}

// Suspend marks the sandbox suspended.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return err
	}
	b.status = sandbox.StatusSuspended
	return nil
}

// Resume marks the sandbox running and returns the same handle.
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return nil, err
	}
	b.status = sandbox.StatusRunning
	return h, nil
}

// WriteFile stores data at the exact path.
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, _ sandbox.WriteFileOptions) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return err
	}
	b.files[path] = slices.Clone(data)
	return nil
}

// ReadFile returns what WriteFile stored.
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return nil, err
	}
	d, ok := b.files[path]
	if !ok {
		return nil, sandbox.ErrNotFound
	}
	return slices.Clone(d), nil
}

// ApplyNetworkPolicy records the policy verbatim.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.lookup(h)
	if err != nil {
		return err
	}
	allow := slices.Clone(pol.Allow)
	if allow == nil {
		allow = []string{}
	}
	b.policy = &sandbox.NetworkPolicy{Allow: allow}
	return nil
}

// connect is the connect instruction of sandbox name: "" when a TCP
// connection to addr was made (and closed), else why not. A policy that
// does not let addr's host through refuses it without dialing.
func (p *Provider) connect(ctx context.Context, name, addr string) string {
	host, _, _ := net.SplitHostPort(addr)
	p.mu.Lock()
	var allow []string
	limited := false
	if b := p.boxes[name]; b != nil && b.policy != nil {
		allow, limited = slices.Clone(b.policy.Allow), true
	}
	p.mu.Unlock()
	if limited && !slices.ContainsFunc(allow, func(a string) bool {
		if d, ok := strings.CutPrefix(a, "*."); ok {
			return strings.HasSuffix(host, "."+d)
		}
		return strings.EqualFold(a, host)
	}) {
		return "connect " + addr + ": refused by the network policy\n"
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	if err != nil {
		return "connect " + addr + ": " + err.Error() + "\n"
	}
	c.Close()
	return ""
}

// PublicURL is https://<name>.fake.test for an existing sandbox.
func (p *Provider) PublicURL(ctx context.Context, h *sandbox.Handle) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := p.lookup(h); err != nil {
		return "", err
	}
	return "https://" + h.Name + ".fake.test", nil
}

// instruction is one parsed script step.
type instruction struct {
	op  string // out err exit stay drop sleep env pwd
	arg string
	n   int
	d   time.Duration
}

func parse(args []string) ([]instruction, error) {
	out := make([]instruction, 0, len(args))
	for _, a := range args {
		op, arg, _ := strings.Cut(a, ":")
		in := instruction{op: op, arg: arg}
		switch op {
		case "out", "err", "env":
		case "exit":
			n, err := strconv.Atoi(arg)
			if err != nil || n < 0 || n > 255 {
				return nil, sandbox.Invalid("command", fmt.Sprintf("fake: exit code %q is not 0..255", arg))
			}
			in.n = n
		case "sleep":
			d, err := time.ParseDuration(arg)
			if err != nil || d < 0 {
				return nil, sandbox.Invalid("command", fmt.Sprintf("fake: bad sleep %q", arg))
			}
			in.d = d
		case "connect":
			if _, _, err := net.SplitHostPort(arg); err != nil {
				return nil, sandbox.Invalid("command", fmt.Sprintf("fake: connect %q is not host:port", clip(arg)))
			}
		case "stay", "drop", "pwd":
			if strings.Contains(a, ":") {
				return nil, sandbox.Invalid("command", fmt.Sprintf("fake: %q takes no argument", op))
			}
		default:
			return nil, sandbox.Invalid("command", fmt.Sprintf("fake: unknown instruction %q", clip(a)))
		}
		out = append(out, in)
	}
	return out, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func lookupEnv(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, ok := strings.Cut(env[i], "="); ok && k == key {
			return v
		}
	}
	return ""
}

// Exec evaluates the script synchronously: stdout collected, stderr only
// with StderrToStdout, the first exit code wins, stay is ignored, and any
// drop makes the result Unavailable{closed_before_exit}.
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	p.mu.Lock()
	_, err := p.lookup(h)
	p.mu.Unlock()
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	name := h.Name
	script, err := parse(c.Args)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		var out bytes.Buffer
		code, exited, dropped := 0, false, false
		for _, in := range script {
			switch in.op {
			case "out":
				out.WriteString(in.arg)
			case "err":
				if opts.StderrToStdout {
					out.WriteString(in.arg)
				}
			case "env":
				out.WriteString(lookupEnv(opts.Env, in.arg))
			case "pwd":
				out.WriteString(opts.Dir)
			case "exit":
				if !exited {
					code, exited = in.n, true
				}
			case "drop":
				dropped = true
			case "connect":
				if why := p.connect(ctx, name, in.arg); why != "" {
					if opts.StderrToStdout {
						out.WriteString(why)
					}
					if !exited {
						code, exited = 1, true
					}
				} else {
					out.WriteString("connected")
				}
			case "sleep":
				t := time.NewTimer(in.d)
				select {
				case <-ctx.Done():
					t.Stop()
					return sandbox.ExecResult{}, ctx.Err()
				case <-t.C:
				}
			}
		}
		if dropped {
			return sandbox.ExecResult{}, sandbox.ClosedBeforeExit()
		}
		return sandbox.ExecResult{Output: out.Bytes(), ExitCode: code}, nil
	})
}
