// Package client is a sandbox.Provider over the platform's API (package
// platform/api): every call goes to a `managoat serve`, which keeps the
// records and calls the provider each sandbox lives on. It passes the
// conformance suite (sandboxtest) through serve for each backend.
//
//	p, err := client.New(client.Options{URL: "http://127.0.0.1:8080", APIKey: key})
//	h, err := p.Create(ctx, "my-box", sandbox.CreateOptions{})
//
// The provider's name is "platform"; a handle's name is the account's name
// for the sandbox. Options.Provider pins the provider new sandboxes go to
// (default: the platform's default); every other call goes where the
// sandbox lives. Streams (Spawn, Attach) are one WebSocket each; closing it
// (Command.Stop) detaches, and a detachable command goes on. Files stream
// both ways (OpenFile, WriteFileFrom: sandbox.FileOpener and
// FileStreamWriter), and so do ReadFile and WriteFile on the wire; an
// account's transfers under way at once are bounded by the platform (429
// rate_limited{file_transfers}, a *sandbox.RateLimitedError here).
//
// The key travels only in the Authorization header; it is never part of a
// URL, an error or a log line.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "platform"

// Options configure a Client.
type Options struct {
	URL    string // the platform's base URL, e.g. http://127.0.0.1:8080
	APIKey string // the account's API key (mgk_...)
	// Provider pins the provider of the sandboxes this client creates;
	// "" takes the platform's default.
	Provider   string
	HTTPClient *http.Client // default: a client of its own
}

// Client is the platform as a sandbox.Provider.
type Client struct {
	base  *url.URL
	key   string
	pin   string
	http  *http.Client
	owned bool

	mu       sync.Mutex
	caps     sandbox.Capabilities
	capsAt   time.Time
	defaultP string
}

var _ interface {
	sandbox.Provider
	sandbox.CreateNewer
	sandbox.OnceDestroyer
	sandbox.CheckpointOnceCreator
	sandbox.SessionTerminator
	sandbox.FileReader
	sandbox.FileOpener
	sandbox.FileStreamWriter
	sandbox.SandboxCapabilities
} = (*Client)(nil)

// New returns a client of the platform at o.URL.
func New(o Options) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(o.URL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, sandbox.Invalid("url", fmt.Sprintf("the platform URL must be http(s)://host[:port], not %q", o.URL))
	}
	if u.User != nil {
		return nil, sandbox.Invalid("url", "the platform URL must not carry credentials: use the API key")
	}
	if strings.TrimSpace(o.APIKey) == "" {
		return nil, sandbox.Invalid("api_key", "an API key is required")
	}
	c := &Client{base: u, key: strings.TrimSpace(o.APIKey), pin: o.Provider, http: o.HTTPClient}
	if c.http == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		c.http, c.owned = &http.Client{Transport: t}, true
	}
	return c, nil
}

// Close releases the client's idle connections.
func (c *Client) Close() error {
	if c.owned {
		c.http.CloseIdleConnections()
	}
	return nil
}

// Name returns "platform".
func (c *Client) Name() string { return Name }

// implemented are the capabilities whose operations this client carries.
var implemented = sandbox.KnownCapabilities()

// Capabilities are those of the provider new sandboxes go to (the pin,
// else the platform's default), as the platform reports them (cached for
// two seconds). A platform that does not answer yields none.
func (c *Client) Capabilities() sandbox.Capabilities {
	c.mu.Lock()
	if c.caps != nil && time.Since(c.capsAt) < 2*time.Second {
		defer c.mu.Unlock()
		return c.caps
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out struct {
		Default string             `json:"default"`
		Data    []api.ProviderInfo `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, "/v1/providers", nil, &out); err != nil {
		return sandbox.Capabilities{}
	}
	want := c.pin
	if want == "" {
		want = out.Default
	}
	caps := sandbox.Capabilities{}
	for _, p := range out.Data {
		if p.Name == want {
			caps = toCaps(p.Capabilities)
		}
	}
	c.mu.Lock()
	c.caps, c.capsAt, c.defaultP = caps, time.Now(), out.Default
	c.mu.Unlock()
	return caps
}

func toCaps(ss []string) sandbox.Capabilities {
	var cs []sandbox.Capability
	for _, s := range ss {
		cp := sandbox.Capability(s)
		for _, k := range implemented {
			if k == cp {
				cs = append(cs, cp)
			}
		}
	}
	return sandbox.NewCapabilities(cs...)
}

// CapabilitiesOf is what the sandbox h can do, as its provider says; for a
// name the account does not have, the pinned provider's.
func (c *Client) CapabilitiesOf(ctx context.Context, h *sandbox.Handle) (sandbox.Capabilities, error) {
	v, err := c.Lookup(ctx, h)
	if errors.Is(err, sandbox.ErrNotFound) {
		return c.Capabilities(), nil
	}
	if err != nil {
		return nil, err
	}
	return toCaps(v.Capabilities), nil
}

func (c *Client) path(name string, rest ...string) string {
	p := "/v1/sandboxes/" + url.PathEscape(name)
	for _, r := range rest {
		p += "/" + r
	}
	return p
}

// do sends a JSON request (body nil: none) and decodes a JSON answer into
// out (nil: discarded). An error answer is the taxonomy's error.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return sandbox.Invalid("body", err.Error())
		}
		rd = bytes.NewReader(b)
	}
	return c.doRaw(ctx, method, path, rd, "application/json", func(r io.Reader) error {
		if out == nil {
			return nil
		}
		if err := json.NewDecoder(r).Decode(out); err != nil {
			return &sandbox.ProviderError{Provider: Name, Reason: "malformed_answer", Err: err}
		}
		return nil
	})
}

func (c *Client) doRaw(ctx context.Context, method, path string, body io.Reader, ctype string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, body)
	if err != nil {
		return sandbox.Invalid("request", err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	if body != nil {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return api.DecodeError(resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	if err := read(resp.Body); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return nil
}

// Lookup returns the platform's view of the sandbox: its provider, state,
// URL, status and capabilities.
func (c *Client) Lookup(ctx context.Context, h *sandbox.Handle) (api.Sandbox, error) {
	var v api.Sandbox
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return v, err
	}
	err := c.do(ctx, http.MethodGet, c.path(h.Name), nil, &v)
	return v, err
}

// List returns the account's sandboxes on every provider.
func (c *Client) List(ctx context.Context) ([]api.Sandbox, error) {
	var out struct {
		Data []api.Sandbox `json:"data"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes", nil, &out)
	return out.Data, err
}

func (c *Client) create(ctx context.Context, name string, req api.CreateRequest) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	req.Name, req.Provider = name, c.pin
	placeInto(ctx, &req) // fleet.go
	var v api.Sandbox
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes", req, &v); err != nil {
		return nil, err
	}
	h := sandbox.BuildHandle(Name, v.Name)
	h.InstanceID = v.InstanceID
	return h, nil
}

// Create makes the named sandbox on the pinned (or default) provider, or
// adopts the account's sandbox of that name where it lives. Publish ports
// are proxied by the platform (PublicURL is its URL of the first), on a
// provider that publishes (local); any other refuses them.
func (c *Client) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	// A host path of this machine means nothing where the platform runs
	// the sandbox.
	if err := sandbox.CheckNoMounts(Name, opts); err != nil {
		return nil, err
	}
	if err := opts.Limits.Validate(); err != nil {
		return nil, err
	}
	return c.create(ctx, name, api.CreateRequest{Limits: api.FromLimits(opts.Limits), Publish: opts.Publish, Image: opts.Image, Labels: opts.Labels})
}

// CreateNew is one creation attempt that never adopts.
func (c *Client) CreateNew(ctx context.Context, name string, opts sandbox.CreateNewOptions) (*sandbox.Handle, error) {
	if opts.Timeout < 0 {
		return nil, sandbox.Invalid("timeout", "negative timeout")
	}
	return c.create(ctx, name, api.CreateRequest{CreateNew: true, TimeoutMS: opts.Timeout.Milliseconds()})
}

// Get returns the sandbox's status. Raw is the provider's own body with
// the platform's word added: "provider" (where it lives), "platform_state"
// (creating, running, suspended, parked), "url", "parked_by", "image" and
// "labels" (the record's, over any of the provider's own); for a
// sandbox parked by destroy, which its provider no longer has, it is the
// platform's view (Lookup) alone.
func (c *Client) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	v, err := c.Lookup(ctx, h)
	if err != nil {
		return sandbox.Info{}, err
	}
	st := sandbox.Status(v.Status)
	if st != sandbox.StatusRunning && st != sandbox.StatusSuspended {
		st = sandbox.StatusUnknown
	}
	return sandbox.Info{Status: st, Raw: rawOf(v)}, nil
}

func rawOf(v api.Sandbox) json.RawMessage {
	var m map[string]json.RawMessage
	if len(v.Raw) == 0 || json.Unmarshal(v.Raw, &m) != nil || m == nil {
		v.Raw = nil
		b, _ := json.Marshal(v)
		return b
	}
	set := func(k, val string) {
		if val != "" {
			b, _ := json.Marshal(val)
			m[k] = b
		}
	}
	set("provider", v.Provider)
	set("platform_state", v.State)
	set("url", v.URL)
	set("parked_by", v.ParkedBy)
	set("image", v.Image)
	if len(v.Labels) > 0 {
		m["labels"], _ = json.Marshal(v.Labels)
	}
	b, _ := json.Marshal(m)
	return b
}

// Destroy destroys the sandbox; nil when the account has none of that name.
func (c *Client) Destroy(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	err := c.do(ctx, http.MethodDelete, c.path(h.Name), nil, nil)
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}

// DestroyOnce is the bounded deletion, under the platform's intent.
func (c *Client) DestroyOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.DestroyOnceOptions) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	if opts.Timeout < 0 {
		return sandbox.Invalid("timeout", "negative timeout")
	}
	err := c.do(ctx, http.MethodDelete, c.path(h.Name)+"?once=true&timeout_ms="+strconv.FormatInt(opts.Timeout.Milliseconds(), 10), nil, nil)
	if errors.Is(err, sandbox.ErrNotFound) {
		return nil
	}
	return err
}

// ListAllNames lists the account's sandboxes, on every provider.
func (c *Client) ListAllNames(ctx context.Context) ([]string, error) {
	l, err := c.List(ctx)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(l))
	for i, v := range l {
		names[i] = v.Name
	}
	return names, nil
}

// Suspend parks the sandbox.
func (c *Client) Suspend(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, c.path(h.Name, "suspend"), nil, nil)
}

// Resume wakes the sandbox.
func (c *Client) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	if err := c.do(ctx, http.MethodPost, c.path(h.Name, "resume"), nil, nil); err != nil {
		return nil, err
	}
	return sandbox.BuildHandle(Name, h.Name), nil
}

// WriteFile writes a file in the sandbox.
func (c *Client) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, opts sandbox.WriteFileOptions) error {
	return c.WriteFileFrom(ctx, h, path, bytes.NewReader(data), opts)
}

// WriteFileFrom writes a file in the sandbox from a stream
// (sandbox.FileStreamWriter): the body is sent as it is read, and the
// platform streams it on to the provider, so neither end holds the file.
func (c *Client) WriteFileFrom(ctx context.Context, h *sandbox.Handle, path string, r io.Reader, opts sandbox.WriteFileOptions) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if opts.Mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(opts.Mode.Perm()), 8))
	}
	return c.doRaw(ctx, http.MethodPut, c.path(h.Name, "files")+"?"+q.Encode(), r, "application/octet-stream",
		func(io.Reader) error { return nil })
}

// ReadFile reads a file of the sandbox.
func (c *Client) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	rc, _, err := c.OpenFile(ctx, h, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// OpenFile opens a file of the sandbox for a streamed read
// (sandbox.FileOpener): the reader is the response body, and size the
// length the platform announced. A body that ends before it (the file
// shrank, the connection broke) is Unavailable{transport}. The caller
// closes the reader.
func (c *Client) OpenFile(ctx context.Context, h *sandbox.Handle, path string) (io.ReadCloser, int64, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, 0, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base.String()+c.path(h.Name, "files")+"?"+url.Values{"path": {path}}.Encode(), nil)
	if err != nil {
		return nil, 0, sandbox.Invalid("request", err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return nil, 0, api.DecodeError(resp.StatusCode, b, resp.Header.Get("Retry-After"))
	}
	return transportBody{resp.Body}, resp.ContentLength, nil
}

// transportBody reports a broken body as Unavailable{transport}.
type transportBody struct{ io.ReadCloser }

func (b transportBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		err = sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	return n, err
}

// Exec runs a command to completion on the platform. The budget sent is
// ctx's remaining time (the facade's one deadline) or opts.Timeout.
func (c *Client) Exec(ctx context.Context, h *sandbox.Handle, cmd sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return sandbox.ExecResult{}, err
	}
	if opts.Timeout < 0 {
		return sandbox.ExecResult{}, sandbox.ExecTimeout(0) // a spent budget never dispatches
	}
	req := api.ExecRequest{Cmd: cmd.Name, Args: cmd.Args, Env: opts.Env, Dir: opts.Dir, StderrToStdout: opts.StderrToStdout, MaxOutput: opts.MaxOutput,
		TimeoutMS: opts.Timeout.Milliseconds()}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		if left <= 0 {
			return sandbox.ExecResult{}, sandbox.ExecTimeout(opts.Timeout)
		}
		ms := (left + time.Millisecond - 1).Milliseconds()
		if req.TimeoutMS <= 0 || ms < req.TimeoutMS {
			req.TimeoutMS = ms
		}
	}
	var res api.ExecResult
	if err := c.do(ctx, http.MethodPost, c.path(h.Name, "exec"), req, &res); err != nil {
		if sandbox.IsExecTimeout(err) && opts.Timeout > 0 {
			return sandbox.ExecResult{}, sandbox.ExecTimeout(opts.Timeout)
		}
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecResult{Output: res.Output, ExitCode: res.ExitCode, Truncated: res.Truncated}, nil
}

// ListSessions lists the sandbox's detachable sessions.
func (c *Client) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return nil, err
	}
	var out struct {
		Data []api.Session `json:"data"`
	}
	if err := c.do(ctx, http.MethodGet, c.path(h.Name, "sessions"), nil, &out); err != nil {
		return nil, err
	}
	ss := make([]sandbox.Session, len(out.Data))
	for i, s := range out.Data {
		ss[i] = sandbox.Session{ID: s.ID, Command: s.Command, TTY: s.TTY, State: s.State}
		if s.ExitCode != nil {
			ss[i].ExitCode = *s.ExitCode
		}
		if s.CreatedAt != nil {
			ss[i].CreatedAt = *s.CreatedAt
		}
		if s.LastActivityAt != nil {
			ss[i].LastActivityAt = *s.LastActivityAt
		}
	}
	return ss, nil
}

// TerminateSession stops one session, under the platform's intent.
func (c *Client) TerminateSession(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.TerminateOptions) error {
	opts, err := sandbox.ValidateTermination(sessionID, opts)
	if err != nil {
		return err
	}
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, c.path(h.Name, "sessions", url.PathEscape(sessionID), "terminate"),
		api.TerminateRequest{Mode: string(opts.Mode), TimeoutMS: opts.Timeout.Milliseconds()}, nil)
}

// ApplyNetworkPolicy replaces the sandbox's egress allow list.
func (c *Client) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, p sandbox.NetworkPolicy) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	allow := p.Allow
	if allow == nil {
		allow = []string{}
	}
	return c.do(ctx, http.MethodPut, c.path(h.Name, "network-policy"), api.PolicyRequest{Allow: allow}, nil)
}

// PublicURL returns the sandbox's URL, or ErrUnsupported. For a sandbox
// of a provider on the platform's host (local) it is the platform's proxy
// of its first published port, /v1/sandboxes/NAME/ports/PORT/, which
// takes the account's API key as every call does.
func (c *Client) PublicURL(ctx context.Context, h *sandbox.Handle) (string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return "", err
	}
	var out struct {
		URL string `json:"url"`
	}
	err := c.do(ctx, http.MethodGet, c.path(h.Name, "url"), nil, &out)
	return out.URL, err
}

// CreateCheckpoint snapshots the sandbox.
func (c *Client) CreateCheckpoint(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOptions) (string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return "", err
	}
	var out struct {
		ID string `json:"id"`
	}
	err := c.do(ctx, http.MethodPost, c.path(h.Name, "checkpoints"), api.CheckpointRequest{Comment: opts.Comment}, &out)
	return out.ID, err
}

// CreateCheckpointOnce is the bounded checkpoint creation, under the
// platform's intent.
func (c *Client) CreateCheckpointOnce(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOnceOptions) (string, error) {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return "", err
	}
	if opts.OperationID == "" {
		return "", sandbox.Invalid("operation_id", "an operation id is required")
	}
	var out struct {
		ID string `json:"id"`
	}
	err := c.do(ctx, http.MethodPost, c.path(h.Name, "checkpoints"),
		api.CheckpointRequest{OperationID: opts.OperationID, TimeoutMS: opts.Timeout.Milliseconds()}, &out)
	return out.ID, err
}

// RestoreCheckpoint restores a checkpoint.
func (c *Client) RestoreCheckpoint(ctx context.Context, h *sandbox.Handle, id string) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, c.path(h.Name, "checkpoints", url.PathEscape(id), "restore"), nil, nil)
}
