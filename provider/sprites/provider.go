package sprites

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// ProviderName is the registry name of this provider.
const ProviderName = "sprites"

// maxPages is the listing cap: reaching it with more indicated is
// ErrTruncated, never a partial view.
const maxPages = 40

// Provider is a sandbox.Provider for the Sprites API. It is safe for
// concurrent use. It never prints its token (see Config).
type Provider struct {
	cfg     Config
	client  *http.Client // ordinary REST calls: HTTP/1, no redirects
	ws      *http.Client // WebSocket handshakes: HTTP/1, no redirects, no client timeout
	bounded http.RoundTripper
}

var (
	_ sandbox.Provider              = (*Provider)(nil)
	_ sandbox.CreateNewer           = (*Provider)(nil)
	_ sandbox.OnceDestroyer         = (*Provider)(nil)
	_ sandbox.SessionTerminator     = (*Provider)(nil)
	_ sandbox.CheckpointOnceCreator = (*Provider)(nil)
)

// New returns a provider for cfg; unset fields take their defaults.
// An empty token is an error that names SPRITES_TOKEN.
func New(cfg Config) (*Provider, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Provider{
		cfg:     cfg,
		client:  &http.Client{Transport: newTransport(false), CheckRedirect: noRedirect},
		ws:      &http.Client{Transport: newTransport(false), CheckRedirect: noRedirect},
		bounded: newTransport(true),
	}, nil
}

// NewFromEnv is New(FromEnv()).
func NewFromEnv() (*Provider, error) {
	cfg, err := FromEnv()
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// Name returns "sprites".
func (p *Provider) Name() string { return ProviderName }

// Config returns the effective configuration (defaults filled in).
func (p *Provider) Config() Config { return p.cfg }

// String shows the provider without its token.
func (p *Provider) String() string { return "sprites.Provider{" + p.cfg.BaseURL + "}" }

// Format keeps the token out of every verb.
func (p *Provider) Format(f fmt.State, verb rune) { fmt.Fprint(f, p.String()) }

// Capabilities are suspend (Sprites park by themselves), network_policy,
// attach, tty, public_url, terminate_session, force_terminate_session,
// create_new and destroy_once; plus checkpoint and create_checkpoint_once
// only when Config.CheckpointCreationEnabled.
func (p *Provider) Capabilities() sandbox.Capabilities {
	cs := sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapNetworkPolicy, sandbox.CapAttach,
		sandbox.CapTTY, sandbox.CapPublicURL, sandbox.CapTerminateSession, sandbox.CapForceTerminateSession,
		sandbox.CapCreateNew, sandbox.CapDestroyOnce)
	if p.cfg.CheckpointCreationEnabled {
		cs = cs.With(sandbox.CapCheckpoint, sandbox.CapCreateCheckpointOnce)
	}
	return cs
}

// spriteState is what a Handle returned by Create carries in Private: the
// sprite's id and URL as Sprites reported them. It holds no credential;
// every operation works without it.
type spriteState struct {
	ID  string
	URL string
}

func (s *spriteState) String() string                { return "sprite" }
func (s *spriteState) Format(f fmt.State, verb rune) { fmt.Fprint(f, "sprite") }

// Create makes the named sprite, or adopts it when Sprites answers 409.
// A new sprite's URL is then made public (Config.PublicURLs) on a best-
// effort basis: that update's failure is logged and ignored.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, err
	}
	if err := sandbox.CheckNoMounts(ProviderName, opts); err != nil {
		return nil, err
	}
	if opts.Limits != (sandbox.Limits{}) {
		return nil, sandbox.Invalid("limits", "Sprites cannot enforce resource limits chosen at creation")
	}
	body, _ := json.Marshal(map[string]any{"name": name})
	r, err := p.do(ctx, request{method: http.MethodPost, path: "/v1/sprites", body: body,
		ctype: "application/json", timeout: p.cfg.CreateTimeout})
	if err != nil {
		return nil, err
	}
	h := sandbox.BuildHandle(ProviderName, name)
	switch {
	case r.status == http.StatusConflict:
		return h, nil
	case !is2xx(r.status):
		return nil, r.err()
	}
	var info struct {
		ID  string `json:"id"`
		URL string `json:"url"`
	}
	_ = json.Unmarshal(r.body, &info)
	h.Private = &spriteState{ID: info.ID, URL: info.URL}
	if p.cfg.publicURLs() {
		p.makePublic(ctx, name)
	}
	return h, nil
}

func (p *Provider) makePublic(ctx context.Context, name string) {
	body, _ := json.Marshal(map[string]any{"url_settings": map[string]string{"auth": "public"}})
	r, err := p.do(ctx, request{method: http.MethodPut, path: p.spritePath(name), body: body, ctype: "application/json"})
	if err == nil && !is2xx(r.status) {
		err = r.err()
	}
	if err != nil {
		p.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "sprites: making the sprite URL public failed; create still succeeded",
			slog.String("sprite", name), slog.String("kind", sandbox.Kind(err)))
	}
}

// Get returns the sprite's status and its body untouched; 404 is
// ErrNotFound, anything transient a different error.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return sandbox.Info{}, err
	}
	r, err := p.get(ctx, h.Name)
	if err != nil {
		return sandbox.Info{}, err
	}
	var s struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(r.body, &s)
	return sandbox.Info{Status: mapStatus(s.Status), Raw: json.RawMessage(r.body)}, nil
}

func (p *Provider) get(ctx context.Context, name string) (response, error) {
	r, err := p.do(ctx, request{method: http.MethodGet, path: p.spritePath(name)})
	if err != nil {
		return r, err
	}
	if !is2xx(r.status) {
		return r, r.err()
	}
	return r, nil
}

func mapStatus(s string) sandbox.Status {
	switch s {
	case "running", "ready", "active":
		return sandbox.StatusRunning
	case "suspended", "paused", "stopped":
		return sandbox.StatusSuspended
	}
	return sandbox.StatusUnknown
}

// Destroy deletes the sprite; a 404 counts as done.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	r, err := p.do(ctx, request{method: http.MethodDelete, path: p.spritePath(h.Name)})
	if err != nil {
		return err
	}
	if is2xx(r.status) || r.status == http.StatusNotFound {
		return nil
	}
	return r.err()
}

// ListAllNames pages through the account following continuation tokens
// while has_more is true; when the 40th page still indicates more, the
// answer is ErrTruncated. A page that says has_more but gives no token to
// go on with is ErrTruncated too: the names collected so far are a part
// that would look whole.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	var names []string
	token := ""
	for page := 1; ; page++ {
		q := url.Values{}
		if token != "" {
			q.Set("continuation_token", token)
		}
		r, err := p.do(ctx, request{method: http.MethodGet, path: "/v1/sprites", query: q})
		if err != nil {
			return nil, err
		}
		if !is2xx(r.status) {
			return nil, r.err()
		}
		var body struct {
			Sprites *[]struct {
				Name string `json:"name"`
			} `json:"sprites"`
			HasMore bool   `json:"has_more"`
			Next    string `json:"next_continuation_token"`
		}
		if json.Unmarshal(r.body, &body) != nil || body.Sprites == nil {
			// A 2xx without a sprites list is an unexpected answer.
			return nil, sandbox.FromHTTPStatus(r.status, string(r.body), 0)
		}
		for _, s := range *body.Sprites {
			names = append(names, s.Name)
		}
		if !body.HasMore {
			sort.Strings(names)
			return names, nil
		}
		if page >= maxPages || body.Next == "" {
			return nil, sandbox.ErrTruncated
		}
		token = body.Next
	}
}

// Suspend is a no-op: a sprite parks by itself after about 30 s without
// activity, with its disk kept, at negligible cost. It succeeds even for a
// missing sprite.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	return sandbox.CheckHandle(h, ProviderName)
}

// Resume probes the sprite (the next exec wakes it) and returns the same
// handle, or Get's error (ErrNotFound for a missing sprite).
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	if _, err := p.Get(ctx, h); err != nil {
		return nil, err
	}
	return h, nil
}

// WriteFile writes data at path, creating parent directories; the mode
// defaults to 0644.
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, opts sandbox.WriteFileOptions) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	mode := opts.Mode.Perm()
	if mode == 0 {
		mode = 0o644
	}
	q := url.Values{"path": {path}, "workingDir": {"/"}, "mode": {strconv.FormatUint(uint64(mode), 8)}, "mkdirParents": {"true"}}
	if data == nil {
		data = []byte{}
	}
	r, err := p.do(ctx, request{method: http.MethodPut, path: p.spritePath(h.Name, "fs", "write"), query: q,
		body: data, ctype: "application/octet-stream"})
	if err != nil {
		return err
	}
	if !is2xx(r.status) {
		return r.err()
	}
	return nil
}

// policyRules compiles a NetworkPolicy: an empty allowlist is one
// standalone deny rule for "*" (Sprites reads an empty rule list as
// allow-all, and include:"defaults" would re-add platform allowances); a
// non-empty one is an allow rule per domain, in order.
func policyRules(pol sandbox.NetworkPolicy) []map[string]string {
	if len(pol.Allow) == 0 {
		return []map[string]string{{"domain": "*", "action": "deny"}}
	}
	rules := make([]map[string]string, 0, len(pol.Allow))
	for _, d := range pol.Allow {
		rules = append(rules, map[string]string{"domain": d, "action": "allow"})
	}
	return rules
}

// domainOnly refuses an allow-list entry a Sprites rule cannot carry:
// its rules name domains (a "domain" field), so an address, a CIDR or a
// port would be sent as a domain that matches nothing, allowing nothing
// the caller asked for. Invalid{network_policy} naming the entry, before
// any request.
func domainOnly(e string) error {
	if err := sandbox.CheckAllowEntry(e); err != nil {
		return err
	}
	host := strings.TrimPrefix(e, "*.")
	bad := ""
	switch {
	case strings.Contains(e, "/"):
		bad = "a CIDR"
	case strings.HasPrefix(e, "[") || net.ParseIP(e) != nil:
		bad = "an address"
	case strings.Contains(host, ":"):
		bad = "a port"
	}
	if bad != "" {
		return &sandbox.InvalidError{Reason: "network_policy",
			Msg: fmt.Sprintf("%q is %s: a Sprites network policy allows domains only (example.com, *.example.com)", e, bad)}
	}
	return nil
}

// ApplyNetworkPolicy replaces the sprite's egress policy. Only a 204 is
// success; a 400 is Invalid (the Elixir adapter reported it as a transient
// provider error); any other 2xx is Invalid{http}.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	for _, e := range pol.Allow {
		if err := domainOnly(e); err != nil {
			return err
		}
	}
	body, _ := json.Marshal(map[string]any{"rules": policyRules(pol)})
	r, err := p.do(ctx, request{method: http.MethodPost, path: p.spritePath(h.Name, "policy", "network"), body: body,
		ctype: "application/json", timeout: p.cfg.PolicyTimeout})
	if err != nil {
		return err
	}
	if r.status == http.StatusNoContent {
		return nil
	}
	if r.status == http.StatusBadRequest {
		return &sandbox.InvalidError{Reason: "network_policy", Msg: "Sprites refused the policy",
			HTTP: &sandbox.HTTPDetail{Status: r.status, Body: string(r.body)}}
	}
	return r.err()
}

// PublicURL returns the sprite's url, or ErrUnsupported when Sprites
// reports none.
func (p *Provider) PublicURL(ctx context.Context, h *sandbox.Handle) (string, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return "", err
	}
	r, err := p.get(ctx, h.Name)
	if err != nil {
		return "", err
	}
	var s struct {
		URL string `json:"url"`
	}
	if json.Unmarshal(r.body, &s) != nil || s.URL == "" {
		return "", sandbox.ErrUnsupported
	}
	return s.URL, nil
}

// ListSessions lists the sprite's exec sessions. There is deliberately no
// active flag (see sandbox.Session).
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return nil, err
	}
	r, err := p.do(ctx, request{method: http.MethodGet, path: p.spritePath(h.Name, "exec")})
	if err != nil {
		return nil, err
	}
	if !is2xx(r.status) {
		return nil, r.err()
	}
	var body struct {
		Sessions []struct {
			ID           any    `json:"id"`
			Command      string `json:"command"`
			Created      string `json:"created"`
			LastActivity string `json:"last_activity"`
			TTY          bool   `json:"tty"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(r.body, &body); err != nil {
		return nil, sandbox.FromHTTPStatus(r.status, string(r.body), 0)
	}
	out := make([]sandbox.Session, 0, len(body.Sessions))
	for _, s := range body.Sessions {
		var id string
		switch v := s.ID.(type) {
		case string:
			id = v
		case float64:
			id = strconv.FormatFloat(v, 'f', -1, 64)
		default:
			continue
		}
		out = append(out, sandbox.Session{ID: id, Command: s.Command, CreatedAt: parseTime(s.Created),
			LastActivityAt: parseTime(s.LastActivity), TTY: s.TTY})
	}
	return out, nil
}

func parseTime(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}
	}
	return t
}

// CreateCheckpoint (flag-gated) asks for a checkpoint, drains its NDJSON
// stream (the checkpoint is listed only once the stream completes), then
// reads the listing and returns the newest saved checkpoint whose comment
// matches (any saved one when none matches). The id is never parsed from
// stream prose.
func (p *Provider) CreateCheckpoint(ctx context.Context, h *sandbox.Handle, opts sandbox.CheckpointOptions) (string, error) {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return "", err
	}
	if !p.cfg.CheckpointCreationEnabled {
		return "", sandbox.ErrNotSupported
	}
	body := []byte("{}")
	if opts.Comment != "" {
		body, _ = json.Marshal(map[string]string{"comment": opts.Comment})
	}
	r, err := p.do(ctx, request{method: http.MethodPost, path: p.spritePath(h.Name, "checkpoint"), body: body,
		ctype: "application/json", timeout: p.cfg.CreateTimeout})
	if err != nil {
		return "", err
	}
	if !is2xx(r.status) {
		return "", r.err()
	}
	noID := &sandbox.ProviderError{Provider: ProviderName, Reason: "no_checkpoint_id"}
	l, err := p.do(ctx, request{method: http.MethodGet, path: p.spritePath(h.Name, "checkpoints")})
	if err != nil || !is2xx(l.status) {
		return "", noID
	}
	var cps []struct {
		ID         string `json:"id"`
		CreateTime string `json:"create_time"`
		Comment    string `json:"comment"`
	}
	if json.Unmarshal(l.body, &cps) != nil {
		return "", noID
	}
	type cp struct {
		id string
		at time.Time
	}
	var all, matching []cp
	for _, c := range cps {
		if c.ID == "" || c.ID == "Current" {
			continue
		}
		x := cp{c.ID, parseTime(c.CreateTime)}
		all = append(all, x)
		if c.Comment == opts.Comment {
			matching = append(matching, x)
		}
	}
	pick := matching
	if len(pick) == 0 {
		pick = all
	}
	if len(pick) == 0 {
		return "", noID
	}
	best := pick[0]
	for _, c := range pick[1:] {
		if c.at.After(best.at) {
			best = c
		}
	}
	return best.id, nil
}

// RestoreCheckpoint (flag-gated) restores a checkpoint and scans every
// NDJSON element: an element of type "error", or with a non-empty error
// field, is RestoreFailed, never success.
func (p *Provider) RestoreCheckpoint(ctx context.Context, h *sandbox.Handle, id string) error {
	if err := sandbox.CheckHandle(h, ProviderName); err != nil {
		return err
	}
	if !p.cfg.CheckpointCreationEnabled {
		return sandbox.ErrNotSupported
	}
	if id == "" {
		return sandbox.Invalid("checkpoint", "empty checkpoint id")
	}
	r, err := p.do(ctx, request{method: http.MethodPost, path: p.spritePath(h.Name, "checkpoints", escapeSegment(id), "restore"),
		timeout: p.cfg.CreateTimeout})
	if err != nil {
		return err
	}
	if !is2xx(r.status) {
		return r.err()
	}
	for _, line := range bytes.Split(r.body, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Data  any    `json:"data"`
			Error any    `json:"error"`
		}
		if json.Unmarshal(line, &ev) != nil {
			continue
		}
		msg, _ := ev.Error.(string)
		if ev.Type == "error" || msg != "" {
			if msg == "" {
				msg, _ = ev.Data.(string)
			}
			if msg == "" {
				msg = string(line)
			}
			return &sandbox.RestoreFailedError{Detail: msg}
		}
	}
	return nil
}
