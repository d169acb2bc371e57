package daytona

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"mime/multipart"
	"net/http"
	"net/url"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Name is the provider's registry name.
const Name = "daytona"

// Creation settings: no platform auto-stop or auto-delete (the host's idle
// policy owns suspension; a platform stop mid-turn would look like a crash)
// and a 7-day auto-archive (a long-stopped sandbox moves to object storage,
// still startable).
const (
	labelKey            = "managoat"
	autoArchiveInterval = 10080
	listPageLimit       = 100
	maxListPages        = 40
)

// Provider is the Daytona sandbox.Provider. It is safe for concurrent use.
type Provider struct {
	cfg Config
	c   *client

	mu       sync.Mutex
	proxyURL map[string]string // toolbox proxy per region (target), once learned

	// upload is the toolbox's single-file upload route, once a toolbox has
	// answered: uploadUnknown, uploadV2 or uploadV1.
	upload atomic.Int32
}

// The single-file upload routes: the current service's POST
// /files/upload-v2 (the only one the 0.218 toolbox client defines), and
// the public daemon's POST /files/upload (v0.190.0, which has no v2).
const (
	uploadUnknown int32 = iota
	uploadV2
	uploadV1
)

var (
	_ sandbox.Provider   = (*Provider)(nil)
	_ sandbox.FileReader = (*Provider)(nil)
)

// New returns a Provider for cfg. cfg.APIKey is required.
func New(cfg Config) (*Provider, error) {
	if strings.TrimSpace(cfg.APIKey) == "" {
		return nil, ErrNoAPIKey
	}
	cfg = cfg.withDefaults()
	return &Provider{cfg: cfg, c: &client{hc: cfg.HTTPClient, key: cfg.APIKey, timeout: cfg.Timeout}}, nil
}

// NewFromEnv returns a Provider configured by ConfigFromEnv; without
// DAYTONA_API_KEY it returns ErrNoAPIKey.
func NewFromEnv() (*Provider, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return New(cfg)
}

// Name returns "daytona".
func (p *Provider) Name() string { return Name }

// Capabilities: suspend (stop keeps the disk), network_policy and attach
// (every spawn is a toolbox session with a journal replayed from byte zero).
func (p *Provider) Capabilities() sandbox.Capabilities {
	return sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapNetworkPolicy, sandbox.CapAttach)
}

// checkName refuses, before any request, the names the contract refuses
// and those Daytona's API refuses or cannot route: "www." anywhere, in any
// case (the API's IsSafeDisplayString, apps/api
// common/validators/is-safe-string.validator.ts), and "paginated" and
// "for-runner", which GET /sandbox/<name> routes to other endpoints
// (sandbox.controller.ts; routes match without regard to case).
func checkName(name string) error {
	if err := sandbox.ValidateName(name); err != nil {
		return err
	}
	switch {
	case strings.Contains(strings.ToLower(name), "www."):
		return sandbox.Invalid(sandbox.ReasonName, fmt.Sprintf("Daytona refuses sandbox names containing %q: %q", "www.", name))
	case strings.EqualFold(name, "paginated"), strings.EqualFold(name, "for-runner"):
		return sandbox.Invalid(sandbox.ReasonName, fmt.Sprintf("Daytona's API routes /sandbox/%s elsewhere; a sandbox of that name cannot be addressed", name))
	}
	return nil
}

// checkHandle is sandbox.CheckHandle with checkName.
func checkHandle(h *sandbox.Handle) error {
	if err := sandbox.CheckHandle(h, Name); err != nil {
		return err
	}
	return checkName(h.Name)
}

// sandboxBody is the part of Daytona's sandbox record the adapter reads.
type sandboxBody struct {
	ID              string `json:"id"`
	Name            string `json:"name"`
	State           string `json:"state"`
	DesiredState    string `json:"desiredState"`
	Target          string `json:"target"`
	ToolboxProxyURL string `json:"toolboxProxyUrl"`
	ErrorReason     string `json:"errorReason"`
}

// State vocabularies (the provider's own; anything else is unknown).
func stateRunning(s string) bool { return s == "started" || s == "starting" || s == "resuming" }

func stateSuspended(s string) bool {
	switch s {
	case "stopped", "stopping", "archived", "archiving", "paused", "pausing":
		return true
	}
	return false
}

// stateFailed is a sandbox that will not serve commands: it is reported as
// such and never adopted or used as healthy.
func stateFailed(s string) bool { return s == "error" || s == "build_failed" }

// stateLeaving is a sandbox on its way to a parked state; start must wait
// for it to get there.
func stateLeaving(s string) bool {
	return s == "stopping" || s == "archiving" || s == "pausing"
}

// stateArriving is a sandbox on its way to started (creation included).
func stateArriving(s string) bool {
	switch s {
	case "starting", "creating", "restoring", "resuming", "pulling_snapshot", "pending_build", "building_snapshot":
		return true
	}
	return false
}

// stateTransient is a sandbox passing through an operation of the
// platform's (apps/api enums/sandbox-state.enum.ts), or whose state the
// platform lost for the moment: it is waited out before anything else.
func stateTransient(s string) bool {
	switch s {
	case "resizing", "snapshotting", "forking", "unknown":
		return true
	}
	return false
}

// stateError is the error for a sandbox in a failed state.
func stateError(name string, sb *sandboxBody) error {
	msg := fmt.Sprintf("daytona sandbox %q is in state %q", name, sb.State)
	if sb.ErrorReason != "" {
		msg += ": " + sb.ErrorReason
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "sandbox_" + sb.State, Err: errors.New(msg)}
}

func (p *Provider) api(parts ...string) string {
	u := p.cfg.APIURL + "/sandbox"
	for _, s := range parts {
		u += "/" + url.PathEscape(s)
	}
	return u
}

// getSandbox reads GET /sandbox/{name}: 404 (or state "destroyed") is
// ErrNotFound.
func (p *Provider) getSandbox(ctx context.Context, name string) (*sandboxBody, []byte, error) {
	r, err := p.c.call(ctx, http.MethodGet, p.api(name), nil)
	if err != nil {
		return nil, nil, err
	}
	var sb sandboxBody
	if err := json.Unmarshal(r.body, &sb); err != nil {
		return nil, nil, &sandbox.InvalidError{Reason: sandbox.ReasonHTTP, Msg: "sandbox record is not a JSON object",
			HTTP: &sandbox.HTTPDetail{Status: r.status, Body: bodyText(r.body)}}
	}
	if sb.deleted() {
		return nil, nil, sandbox.ErrNotFound
	}
	return &sb, r.body, nil
}

// deleted reports a soft-deleted sandbox: the API renames it
// DESTROYED_<name>_<ms> and sets desiredState destroyed at once, and it is
// listed while "destroying" (apps/api sandbox.entity.ts,
// getSoftDeleteUpdate).
func (sb *sandboxBody) deleted() bool {
	return sb.DesiredState == "destroyed" || sb.State == "destroyed" || sb.State == "destroying"
}

// lifecycleTimeout bounds POST /sandbox and POST …/start: the API holds
// them up to 30 s while the sandbox starts (sandbox.controller.ts,
// waitForSandboxStarted), so they get at least 60 s.
func (p *Provider) lifecycleTimeout() reqOpts {
	return reqOpts{timeout: max(p.cfg.Timeout, 60*time.Second)}
}

// Create makes the named sandbox (from Config.Snapshot when set) or adopts
// it: a 400 or 409 is probed with GET by name, and an existing healthy
// sandbox is adopted. When the probe finds nothing (or fails), the original
// create error is returned — an unregistered snapshot answers 400 and the
// caller must see Invalid, not ErrNotFound. A sandbox in an error state is
// never adopted. Limits are refused: Daytona applies none of them per
// command, and they are never silently dropped.
func (p *Provider) Create(ctx context.Context, name string, opts sandbox.CreateOptions) (*sandbox.Handle, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if err := sandbox.CheckNoMounts(Name, opts); err != nil {
		return nil, err
	}
	if opts.Limits != (sandbox.Limits{}) {
		return nil, sandbox.Invalid("limits", "the daytona provider does not apply sandbox.Limits")
	}
	body := map[string]any{
		"name":                name,
		"labels":              map[string]string{labelKey: "1"},
		"autoStopInterval":    0,
		"autoArchiveInterval": autoArchiveInterval,
		"autoDeleteInterval":  -1,
	}
	if p.cfg.Snapshot != "" {
		body["snapshot"] = p.cfg.Snapshot
	}
	r, err := p.c.callWith(ctx, http.MethodPost, p.api(), body, p.lifecycleTimeout())
	if err != nil {
		st := statusOf(err)
		if r == nil || (st != http.StatusBadRequest && st != http.StatusConflict) {
			return nil, err
		}
		sb, _, perr := p.getSandbox(ctx, name)
		if perr != nil {
			return nil, err
		}
		if stateFailed(sb.State) {
			return nil, stateError(name, sb)
		}
		return sandbox.BuildHandle(Name, name), nil
	}
	var sb sandboxBody
	if json.Unmarshal(r.body, &sb) == nil && stateFailed(sb.State) {
		return nil, stateError(name, &sb)
	}
	return sandbox.BuildHandle(Name, name), nil
}

// Get maps Daytona's state: started/starting/resuming → running;
// stopped/stopping/archived/archiving/paused/pausing → suspended; anything
// else — error and build_failed included — unknown, with the body in Raw.
func (p *Provider) Get(ctx context.Context, h *sandbox.Handle) (sandbox.Info, error) {
	if err := checkHandle(h); err != nil {
		return sandbox.Info{}, err
	}
	sb, raw, err := p.getSandbox(ctx, h.Name)
	if err != nil {
		return sandbox.Info{}, err
	}
	st := sandbox.StatusUnknown
	switch {
	case stateRunning(sb.State):
		st = sandbox.StatusRunning
	case stateSuspended(sb.State):
		st = sandbox.StatusSuspended
	}
	return sandbox.Info{Status: st, Raw: json.RawMessage(raw)}, nil
}

// Destroy deletes by name (404 is success) and waits, within the request
// timeout, until a GET confirms the sandbox is gone, so that Get answers
// ErrNotFound afterwards. A 409 means a state change (a start, a stop) is
// in progress and nothing was deleted (apps/api sandbox.service.ts,
// destroy): Destroy waits and deletes again, for up to Config.StartTimeout.
// When absence is not confirmed in time it returns
// Unavailable{delete_unconfirmed}; DELETE is idempotent, so retrying is safe.
func (p *Provider) Destroy(ctx context.Context, h *sandbox.Handle) error {
	if err := checkHandle(h); err != nil {
		return err
	}
	busy := time.Time{}
	delay := 200 * time.Millisecond
	for {
		_, err := p.c.call(ctx, http.MethodDelete, p.api(h.Name), nil)
		if errors.Is(err, sandbox.ErrNotFound) {
			return nil
		}
		if err == nil {
			break
		}
		if statusOf(err) != http.StatusConflict {
			return err
		}
		if busy.IsZero() {
			busy = time.Now()
		} else if time.Since(busy) > p.cfg.StartTimeout {
			return conflictAsUnavailable(err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if delay *= 2; delay > 2*time.Second {
			delay = 2 * time.Second
		}
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	err := p.waitFor(wctx, h.Name, func(*sandboxBody) bool { return false }, false)
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return nil
	case ctx.Err() != nil:
		return ctx.Err()
	case err == nil || wctx.Err() != nil:
		return sandbox.Unavailable("delete_unconfirmed", err)
	}
	return err
}

// waitFor polls GET until done(record) holds (nil), the sandbox fails
// (its state error), or ctx ends (ctx's error). Other GET errors end it.
func (p *Provider) waitFor(ctx context.Context, name string, done func(*sandboxBody) bool, failFast bool) error {
	delay := 100 * time.Millisecond
	for {
		sb, _, err := p.getSandbox(ctx, name)
		if err != nil {
			if ctx.Err() != nil && !errors.Is(err, sandbox.ErrNotFound) {
				return ctx.Err()
			}
			if !sandbox.Transient(err) || errors.Is(err, sandbox.ErrNotFound) {
				return err
			}
		} else {
			if done(sb) {
				return nil
			}
			if failFast && stateFailed(sb.State) {
				return stateError(name, sb)
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		if delay *= 2; delay > 2*time.Second {
			delay = 2 * time.Second
		}
	}
}

// ListAllNames lists every sandbox this adapter labelled, following the
// cursor over every page; more than 40 pages is ErrTruncated, never a
// partial view.
func (p *Provider) ListAllNames(ctx context.Context) ([]string, error) {
	return p.listAllNames(ctx, maxListPages)
}

func (p *Provider) listAllNames(ctx context.Context, maxPages int) ([]string, error) {
	labels, _ := json.Marshal(map[string]string{labelKey: "1"})
	var names []string
	seen := map[string]bool{}
	cursor := ""
	for page := 0; ; page++ {
		if page >= maxPages {
			return nil, sandbox.ErrTruncated
		}
		q := url.Values{"labels": {string(labels)}, "limit": {fmt.Sprint(listPageLimit)}}
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		r, err := p.c.call(ctx, http.MethodGet, p.api()+"?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		items, next, err := parseListPage(r.body, cursor)
		if err != nil {
			return nil, err
		}
		for _, it := range items {
			if it.Name != "" && !it.deleted() && !seen[it.Name] {
				seen[it.Name] = true
				names = append(names, it.Name)
			}
		}
		if next == "" {
			return names, nil
		}
		cursor = next
	}
}

// parseListPage reads one page: a bare array (a single page), or
// {"items": [...], "nextCursor": C}. Where nextCursor is absent, a "cursor"
// field is taken as the next cursor only when it differs from the one
// sent: a server that echoes the request's cursor is not pointing onwards
// (the Elixir adapter paged on such an echo until it truncated).
func parseListPage(b []byte, sent string) ([]sandboxBody, string, error) {
	var arr []sandboxBody
	if json.Unmarshal(b, &arr) == nil {
		return arr, "", nil
	}
	var pg struct {
		Items      []sandboxBody `json:"items"`
		NextCursor *string       `json:"nextCursor"`
		Cursor     *string       `json:"cursor"`
	}
	if err := json.Unmarshal(b, &pg); err != nil {
		return nil, "", &sandbox.InvalidError{Reason: sandbox.ReasonHTTP, Msg: "sandbox list is neither an array nor a page",
			HTTP: &sandbox.HTTPDetail{Status: 200, Body: bodyText(b)}}
	}
	next := ""
	switch {
	case pg.NextCursor != nil:
		next = *pg.NextCursor
	case pg.Cursor != nil && *pg.Cursor != sent:
		next = *pg.Cursor
	}
	return pg.Items, next, nil
}

// Suspend stops the sandbox, keeping its disk. An already stopped,
// stopping or archived one is left alone; a 409 (mid-transition) is
// Unavailable.
func (p *Provider) Suspend(ctx context.Context, h *sandbox.Handle) error {
	if err := checkHandle(h); err != nil {
		return err
	}
	sb, _, err := p.getSandbox(ctx, h.Name)
	if err != nil {
		return err
	}
	if stateSuspended(sb.State) {
		return nil
	}
	if stateFailed(sb.State) {
		return stateError(h.Name, sb)
	}
	_, err = p.c.call(ctx, http.MethodPost, p.api(h.Name, "stop"), map[string]any{})
	return conflictAsUnavailable(err)
}

// Resume starts a stopped or archived sandbox (ensure-started); a 409 from
// start is Unavailable. It returns the same handle.
func (p *Provider) Resume(ctx context.Context, h *sandbox.Handle) (*sandbox.Handle, error) {
	if err := checkHandle(h); err != nil {
		return nil, err
	}
	if _, err := p.ensureStarted(ctx, h.Name); err != nil {
		return nil, err
	}
	return h, nil
}

// ensureStarted makes sure the sandbox serves its toolbox and returns the
// toolbox URL: a parked sandbox (stopped, archived, paused) is started —
// one that is still stopping, or is resizing, snapshotting, forking or in
// state unknown, is first waited for — and the wait then lasts
// until it reports "started" (the Elixir adapter returned at once, and the next
// toolbox call failed with "is the sandbox started?"). A failed sandbox is
// its state error.
func (p *Provider) ensureStarted(ctx context.Context, name string) (string, error) {
	sb, _, err := p.getSandbox(ctx, name)
	if err != nil {
		return "", err
	}
	if stateFailed(sb.State) {
		return "", stateError(name, sb)
	}
	if sb.State == "started" {
		return p.toolboxURL(ctx, sb)
	}
	wctx, cancel := context.WithTimeout(ctx, p.cfg.StartTimeout)
	defer cancel()
	wait := func(pred func(*sandboxBody) bool) error {
		var last *sandboxBody
		err := p.waitFor(wctx, name, func(b *sandboxBody) bool { last = b; return pred(b) }, true)
		if err != nil && ctx.Err() == nil && wctx.Err() != nil {
			state := ""
			if last != nil {
				state = last.State
			}
			return sandbox.Unavailable("start_timeout", fmt.Errorf("daytona sandbox %q still %q after %v", name, state, p.cfg.StartTimeout))
		}
		return err
	}
	if stateTransient(sb.State) || stateLeaving(sb.State) {
		if err := wait(func(b *sandboxBody) bool { return !stateTransient(b.State) && !stateLeaving(b.State) }); err != nil {
			return "", err
		}
		if sb, _, err = p.getSandbox(ctx, name); err != nil {
			return "", err
		}
	}
	if stateSuspended(sb.State) {
		if _, err := p.c.callWith(ctx, http.MethodPost, p.api(name, "start"), map[string]any{}, p.lifecycleTimeout()); err != nil {
			return "", conflictAsUnavailable(err)
		}
	}
	if sb.State != "started" && (stateSuspended(sb.State) || stateArriving(sb.State)) {
		if err := wait(func(b *sandboxBody) bool { return b.State == "started" }); err != nil {
			return "", err
		}
		if sb, _, err = p.getSandbox(ctx, name); err != nil {
			return "", err
		}
	}
	return p.toolboxURL(ctx, sb)
}

// toolboxURL is the sandbox's region's toolbox proxy URL (the record's
// toolboxProxyUrl, or GET /sandbox/{id}/toolbox-proxy-url answering
// {"url": U} or "U", cached per region — per record target; a record
// without one is never served from the cache) without its trailing slash,
// plus "/" and the id.
func (p *Provider) toolboxURL(ctx context.Context, sb *sandboxBody) (string, error) {
	if sb.ID == "" {
		return "", &sandbox.ProviderError{Provider: Name, Reason: "no_sandbox_id", Err: errors.New("sandbox record has no id")}
	}
	// The proxy is per region (apps/api sandbox.service.ts,
	// resolveToolboxProxyUrl): a cached one serves only its own region.
	proxy := sb.ToolboxProxyURL
	if proxy == "" && sb.Target != "" {
		p.mu.Lock()
		proxy = p.proxyURL[sb.Target]
		p.mu.Unlock()
	}
	if proxy == "" {
		r, err := p.c.call(ctx, http.MethodGet, p.api(sb.ID, "toolbox-proxy-url"), nil)
		if err != nil {
			return "", err
		}
		var obj struct {
			URL string `json:"url"`
		}
		if json.Unmarshal(r.body, &obj) != nil || obj.URL == "" {
			if json.Unmarshal(r.body, &obj.URL) != nil || obj.URL == "" {
				return "", &sandbox.ProviderError{Provider: Name, Reason: "no_toolbox_url", Err: errors.New("toolbox-proxy-url answered without a URL")}
			}
		}
		proxy = obj.URL
		if sb.Target != "" {
			p.mu.Lock()
			if p.proxyURL == nil {
				p.proxyURL = map[string]string{}
			}
			p.proxyURL[sb.Target] = proxy
			p.mu.Unlock()
		}
	}
	return strings.TrimRight(proxy, "/") + "/" + url.PathEscape(sb.ID), nil
}

// executeMargin is how much longer than the daemon's own timeout the HTTP
// request for /process/execute may take: the daemon answers 408 when its
// timeout kills the command, and that answer must be able to arrive.
const executeMargin = 10 * time.Second

// execute runs script through the toolbox's one-shot /process/execute
// (inside the envelope; see shim.go) and returns its result text and exit
// code. timeoutSec > 0 is sent as the daemon's timeout, and the HTTP
// request gets that plus executeMargin instead of Config.Timeout (the
// daemon holds the request for as long as the command runs); timeoutSec
// 0 sends none, and the request is bounded by ctx alone.
func (p *Provider) execute(ctx context.Context, tb, script string, timeoutSec int) (string, int, error) {
	cmd, err := envelope(script)
	if err != nil {
		return "", 0, err
	}
	body := map[string]any{"command": cmd}
	o := reqOpts{noTimeout: true}
	if timeoutSec > 0 {
		body["timeout"] = timeoutSec
		o = reqOpts{timeout: time.Duration(timeoutSec)*time.Second + executeMargin}
	}
	r, err := p.c.callWith(ctx, http.MethodPost, tb+"/process/execute", body, o)
	if err != nil {
		return "", 0, err
	}
	var m struct {
		Result   *string `json:"result"`
		Output   *string `json:"output"`
		ExitCode *int    `json:"exitCode"`
		Code     *int    `json:"code"`
	}
	if err := json.Unmarshal(r.body, &m); err != nil {
		return "", 0, &sandbox.ProviderError{Provider: Name, Reason: "execute_undecodable", Err: err}
	}
	res, code := "", 0
	switch {
	case m.Result != nil:
		res = *m.Result
	case m.Output != nil:
		res = *m.Output
	}
	switch {
	case m.ExitCode != nil:
		code = *m.ExitCode
	case m.Code != nil:
		code = *m.Code
	}
	return res, code, nil
}

// Exec runs c to completion through /process/execute, under one deadline
// (sandbox.ExecWithDeadline); the daemon gets the budget rounded up to
// whole seconds so the local deadline fires first. Env and Dir are applied
// once, in the rendered command line (the Elixir adapter applied them twice).
// Output is carried base64-encoded, so every byte survives; stderr is
// merged only with StderrToStdout and otherwise dropped (the Elixir adapter
// always merged it).
func (p *Provider) Exec(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.ExecOptions) (sandbox.ExecResult, error) {
	if err := checkHandle(h); err != nil {
		return sandbox.ExecResult{}, err
	}
	line, err := commandLine(c, opts.Env, opts.Dir)
	if err != nil {
		return sandbox.ExecResult{}, err
	}
	return sandbox.ExecWithDeadline(ctx, opts, func(ctx context.Context) (sandbox.ExecResult, error) {
		tb, err := p.ensureStarted(ctx, h.Name)
		if err != nil {
			return sandbox.ExecResult{}, err
		}
		secs := 0
		budget := opts.Timeout
		if dl, ok := ctx.Deadline(); ok {
			budget = time.Until(dl)
			secs = max(1, int(math.Ceil(budget.Seconds())))
		}
		res, code, err := p.execute(ctx, tb, execScript(line, opts.StderrToStdout), secs)
		if err != nil {
			if statusOf(err) == http.StatusRequestTimeout {
				if opts.Timeout > 0 {
					budget = opts.Timeout
				}
				if budget <= 0 {
					// No budget was asked: the daemon's own default limit
					// (360 s on older daemons) ended the command.
					return sandbox.ExecResult{}, sandbox.Unavailable(sandbox.ReasonTimeout, err)
				}
				return sandbox.ExecResult{}, sandbox.ExecTimeout(budget)
			}
			return sandbox.ExecResult{}, p.toolboxGone(ctx, h.Name, err)
		}
		out, derr := decodeExecResult(res)
		if derr != nil && code == -1 {
			// The daemon reports -1 when the script itself was killed: the
			// command never reported an exit, and none is made up.
			return sandbox.ExecResult{}, sandbox.ClosedBeforeExit()
		}
		if derr != nil {
			return sandbox.ExecResult{}, &sandbox.ProviderError{Provider: Name, Reason: "exec_output_undecodable",
				Err: fmt.Errorf("%w (exit %d): %s", derr, code, clip(res, 200))}
		}
		return sandbox.ExecResult{Output: out, ExitCode: code}, nil
	})
}

// cmdState is a Command's private state.
type cmdState struct {
	tb, session, cmdID, base string
	name                     string // the sandbox's name: a toolbox refusal is checked against it
	stdin                    bool   // false: spawned without stdin (attach: unknown, treated as wired)
	ls                       *logStream
}

func newTag() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return sessionPrefix + hex.EncodeToString(b[:])
}

// Spawn starts c in a fresh toolbox session (hence detachable; TTY and
// Detachable are ignored) under the shim of shim.go, and returns once the
// toolbox acknowledged the command. Its output is the session journal,
// polled by a LogStream.
func (p *Provider) Spawn(ctx context.Context, h *sandbox.Handle, c sandbox.Cmd, opts sandbox.SpawnOptions) (*sandbox.Command, error) {
	if err := checkHandle(h); err != nil {
		return nil, err
	}
	line, err := commandLine(c, opts.Env, opts.Dir)
	if err != nil {
		return nil, err
	}
	tag := newTag()
	base := shimBase(p.cfg.ShimDir, tag)
	wire, err := envelope(spawnScript(base, line, opts.Stdin), "managoat",
		base64Std(c.String()))
	if err != nil {
		return nil, err
	}
	tb, err := p.ensureStarted(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	_, err = p.c.call(ctx, http.MethodPost, tb+"/process/session", map[string]any{"sessionId": tag})
	if err != nil && statusOf(err) != http.StatusConflict {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	r, err := p.c.call(ctx, http.MethodPost, tb+"/process/session/"+url.PathEscape(tag)+"/exec",
		map[string]any{"command": wire, "runAsync": true, "suppressInputEcho": true})
	if err != nil {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	cid := commandID(r.body)
	if cid == "" {
		return nil, &sandbox.ProviderError{Provider: Name, Reason: "no_command_id", Err: fmt.Errorf("session exec answered %s", clip(string(r.body), 200))}
	}
	return p.stream(h.Name, tb, tag, cid, base, opts.Stdin, true), nil
}

func (p *Provider) stream(name, tb, session, cid, base string, stdin, files bool) *sandbox.Command {
	st := &cmdState{name: name, tb: tb, session: session, cmdID: cid, base: base, stdin: stdin}
	cmd, s := sandbox.NewCommand(p, "", st)
	cmd.SessionID = session
	st.ls = p.startLogStream(name, tb, session, cid, base, files, s)
	return cmd
}

func commandID(b []byte) string {
	var m map[string]any
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	for _, k := range []string{"cmdId", "commandId", "id"} {
		if s, ok := m[k].(string); ok && s != "" {
			return s
		}
	}
	return ""
}

func state(c *sandbox.Command) (*cmdState, error) {
	if err := sandbox.CheckCommand(c, Name); err != nil {
		return nil, err
	}
	st, ok := c.Private.(*cmdState)
	if !ok || st == nil {
		return nil, sandbox.Invalid(sandbox.ReasonHandle, "command carries no daytona session state")
	}
	return st, nil
}

// WriteStdin appends data to the command's stdin file in one round trip
// per 32 KiB (checking the exit sentinel first): ErrCommandExited once the
// command ended; ErrNotFound when the toolbox refuses the sandbox and a GET
// by name finds it gone (deleted under the command); WriteFailed for any
// other failure, or for a command spawned without stdin (the Elixir adapter let
// such writes land unread). No newline is added.
func (p *Provider) WriteStdin(ctx context.Context, c *sandbox.Command, data []byte) error {
	st, err := state(c)
	if err != nil {
		return err
	}
	if !st.stdin {
		return &sandbox.WriteFailedError{Err: errors.New("daytona: command was spawned without stdin")}
	}
	for len(data) > 0 {
		n := min(len(data), stdinChunk)
		res, code, err := p.execute(ctx, st.tb, stdinScript(st.base, data[:n]), 30)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if st.name != "" && p.refusedAsGone(ctx, st.name, err) {
				return sandbox.ErrNotFound
			}
			return &sandbox.WriteFailedError{Err: err}
		case code == 0 && strings.Contains(res, markExited):
			return sandbox.ErrCommandExited
		case code != 0 || !strings.Contains(res, markOK):
			return &sandbox.WriteFailedError{Err: fmt.Errorf("daytona: stdin append exited %d: %s", code, clip(strings.TrimSpace(res), 200))}
		}
		data = data[n:]
	}
	return nil
}

// CloseStdin delivers a real EOF (see closeScript): it is idempotent and
// nil after the command exited. Unlike the Elixir adapter, which answered Ok even
// when the toolbox failed, a failure is returned: the EOF was not
// delivered, and the command would wait for it forever. A toolbox refusal
// of a sandbox that a GET by name finds gone is ErrNotFound.
func (p *Provider) CloseStdin(ctx context.Context, c *sandbox.Command) error {
	st, err := state(c)
	if err != nil {
		return err
	}
	if !st.stdin {
		return nil
	}
	_, code, err := p.execute(ctx, st.tb, closeScript(st.base), 30)
	if err != nil {
		if st.name != "" {
			return p.toolboxGone(ctx, st.name, err)
		}
		return err
	}
	if code != 0 {
		return &sandbox.ProviderError{Provider: Name, Reason: "close_stdin_failed", Err: fmt.Errorf("close script exited %d", code)}
	}
	return nil
}

// StopCommand stops the local LogStream (at most 1 s); the remote command
// keeps running. It is total: nil for any command, including one without
// daytona state.
func (p *Provider) StopCommand(c *sandbox.Command) error {
	if c == nil {
		return nil
	}
	if st, ok := c.Private.(*cmdState); ok && st != nil {
		st.ls.stop()
	}
	return nil
}

type sessionRecord struct {
	SessionID string `json:"sessionId"`
	Commands  []struct {
		ID       string `json:"id"`
		CmdID    string `json:"cmdId"`
		Command  string `json:"command"`
		ExitCode *int   `json:"exitCode"`
	} `json:"commands"`
}

func (p *Provider) sessions(ctx context.Context, tb string) ([]sessionRecord, error) {
	r, err := p.c.call(ctx, http.MethodGet, tb+"/process/session", nil)
	if err != nil {
		return nil, err
	}
	var list []sessionRecord
	if json.Unmarshal(r.body, &list) == nil {
		return list, nil
	}
	var wrapped struct {
		Sessions []sessionRecord `json:"sessions"`
	}
	if err := json.Unmarshal(r.body, &wrapped); err != nil {
		return nil, &sandbox.ProviderError{Provider: Name, Reason: "sessions_undecodable", Err: err}
	}
	return wrapped.Sessions, nil
}

// ListSessions lists this adapter's sessions (ids starting "managoat-");
// Command is the user's command line of the session's last command.
func (p *Provider) ListSessions(ctx context.Context, h *sandbox.Handle) ([]sandbox.Session, error) {
	if err := checkHandle(h); err != nil {
		return nil, err
	}
	tb, err := p.ensureStarted(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	recs, err := p.sessions(ctx, tb)
	if err != nil {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	out := []sandbox.Session{}
	seen := map[string]bool{}
	for _, r := range recs {
		if !strings.HasPrefix(r.SessionID, sessionPrefix) {
			continue
		}
		s := sandbox.Session{ID: r.SessionID}
		if n := len(r.Commands); n > 0 {
			s.Command = displayCommand(r.Commands[n-1].Command)
		}
		seen[s.ID] = true
		out = append(out, s)
	}
	// Finished sessions whose daemon session was deleted live on in the
	// shim's files.
	res, code, err := p.execute(ctx, tb, listScript(shimDirExpr(p.cfg.ShimDir)), 30)
	if err != nil {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	if code != 0 {
		return nil, &sandbox.ProviderError{Provider: Name, Reason: "session_list_failed", Err: fmt.Errorf("exit %d: %s", code, clip(res, 200))}
	}
	for _, line := range strings.Split(res, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || sandbox.ValidateSessionID(f[0]) != nil {
			continue
		}
		id := f[0]
		if seen[id] {
			if f[2] == "done" {
				// Finished, and nobody watched it to its end: its shell
				// goes, its files stay.
				p.deleteSession(ctx, tb, id)
			}
			continue
		}
		s := sandbox.Session{ID: id}
		if b, err := base64.StdEncoding.DecodeString(f[1]); err == nil {
			s.Command = string(b)
		}
		seen[id] = true
		out = append(out, s)
	}
	return out, nil
}

// deleteSession deletes a toolbox session, best effort: each holds a shell
// in the sandbox (daemon pkg/session/create.go), and ending it ends its
// process group (pkg/session/delete.go).
func (p *Provider) deleteSession(ctx context.Context, tb, sid string) {
	_, _ = p.c.call(ctx, http.MethodDelete, tb+"/process/session/"+url.PathEscape(sid), nil)
}

// Attach replays the session's last command from byte zero through a fresh
// LogStream, then tails it. An unknown session, or one without a command,
// is ErrNotFound.
func (p *Provider) Attach(ctx context.Context, h *sandbox.Handle, sessionID string, opts sandbox.AttachOptions) (*sandbox.Command, error) {
	if err := checkHandle(h); err != nil {
		return nil, err
	}
	if err := sandbox.ValidateSessionID(sessionID); err != nil {
		return nil, err
	}
	tb, err := p.ensureStarted(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	base := shimBase(p.cfg.ShimDir, sessionID)
	res, code, err := p.execute(ctx, tb, hasFilesScript(base), 30)
	if err != nil {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	if code == 0 && strings.Contains(res, markOK) {
		return p.stream(h.Name, tb, sessionID, "", base, opts.Stdin, true), nil
	}
	// A session of an older shim: its output is only the daemon's log.
	recs, err := p.sessions(ctx, tb)
	if err != nil {
		return nil, p.toolboxGone(ctx, h.Name, err)
	}
	for _, r := range recs {
		if r.SessionID != sessionID {
			continue
		}
		if len(r.Commands) == 0 {
			return nil, sandbox.ErrNotFound
		}
		last := r.Commands[len(r.Commands)-1]
		cid := last.ID
		if cid == "" {
			cid = last.CmdID
		}
		if cid == "" {
			return nil, sandbox.ErrNotFound
		}
		return p.stream(h.Name, tb, sessionID, cid, base, opts.Stdin, false), nil
	}
	return nil, sandbox.ErrNotFound
}

// WriteFile uploads data through the toolbox's multipart POST
// /files/upload-v2 (query path, field file), the current service's route;
// where that answers 404 or 405 before any upload-v2 has succeeded, it
// uploads at POST /files/upload, the public daemon's (v0.190.0 has no
// upload-v2), and keeps to the route that worked for the provider's life,
// so the choice is made once per provider, not per call. It creates an
// absolute path's parent directories first. A 404 is ErrNotFound only when
// the sandbox is gone. Mode, when set, is applied afterwards with chmod
// (the Elixir adapter ignored it).
func (p *Provider) WriteFile(ctx context.Context, h *sandbox.Handle, file string, data []byte, opts sandbox.WriteFileOptions) error {
	if err := checkHandle(h); err != nil {
		return err
	}
	if file == "" || strings.ContainsRune(file, 0) {
		return sandbox.Invalid("path", "empty path or NUL byte in path")
	}
	tb, err := p.ensureStarted(ctx, h.Name)
	if err != nil {
		return err
	}
	if dir := path.Dir(file); strings.HasPrefix(file, "/") && dir != "/" {
		if err := p.shell(ctx, tb, "mkdir -p -- "+quote(dir)); err != nil {
			return p.toolboxGone(ctx, h.Name, err)
		}
	}
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, err := mw.CreateFormFile("file", path.Base(file))
	if err != nil {
		return sandbox.Invalid("path", err.Error())
	}
	_, _ = fw.Write(data)
	_ = mw.Close()
	body, ctype := buf.Bytes(), mw.FormDataContentType()
	query := "?" + url.Values{"path": {file}}.Encode()
	route := p.upload.Load()
	if route == uploadV1 {
		r, err := p.c.do(ctx, http.MethodPost, tb+"/files/upload"+query, bytes.NewReader(body), ctype)
		if err != nil {
			return err
		}
		return p.uploaded(ctx, h.Name, tb, file, opts, r)
	}
	r, err := p.c.do(ctx, http.MethodPost, tb+"/files/upload-v2"+query, bytes.NewReader(body), ctype)
	if err != nil {
		return err
	}
	if route == uploadUnknown && (r.status == http.StatusNotFound || r.status == http.StatusMethodNotAllowed) {
		r1, err := p.c.do(ctx, http.MethodPost, tb+"/files/upload"+query, bytes.NewReader(body), ctype)
		if err != nil {
			return err
		}
		if r1.status >= 200 && r1.status <= 299 {
			p.upload.CompareAndSwap(uploadUnknown, uploadV1)
		}
		if r1.status != http.StatusNotFound && r1.status != http.StatusMethodNotAllowed {
			r = r1
		}
	} else if r.status >= 200 && r.status <= 299 {
		p.upload.CompareAndSwap(uploadUnknown, uploadV2)
	}
	return p.uploaded(ctx, h.Name, tb, file, opts, r)
}

// uploaded reads an upload's answer r.
func (p *Provider) uploaded(ctx context.Context, name, tb, file string, opts sandbox.WriteFileOptions, r *response) error {
	switch {
	case r.status == http.StatusNotFound:
		return p.routeNotFound(ctx, name, "upload", r)
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		return p.toolboxGone(ctx, name, httpError(r))
	case r.status < 200 || r.status > 299:
		return httpError(r)
	}
	if opts.Mode != 0 {
		return p.shell(ctx, tb, fmt.Sprintf("chmod %o -- %s", opts.Mode.Perm(), quote(file)))
	}
	return nil
}

// routeNotFound reads a toolbox 404: the proxy's answer for a sandbox
// that is gone (ErrNotFound, confirmed by GET), or else a route this
// daemon does not have — a ProviderError, never the sandbox's ErrNotFound.
func (p *Provider) routeNotFound(ctx context.Context, name, op string, r *response) error {
	if _, _, err := p.getSandbox(ctx, name); errors.Is(err, sandbox.ErrNotFound) {
		return err
	}
	return &sandbox.ProviderError{Provider: Name, Reason: op + "_route_not_found",
		Err: fmt.Errorf("toolbox answered 404 to %s: %s", op, bodyText(r.body))}
}

// toolboxGone re-reads a toolbox refusal of the sandbox itself: the
// toolbox proxy checks the bearer's access first and answers 401 for a
// sandbox that does not exist — one deleted since ensureStarted included —
// (apps/proxy pkg/proxy/auth.go, Authenticate; auth_callback.go,
// hasSandboxAccess), and 403 or 404 may come from elsewhere on the way. A
// GET by name that finds the sandbox gone makes it ErrNotFound; otherwise
// err stands.
func (p *Provider) toolboxGone(ctx context.Context, name string, err error) error {
	if p.refusedAsGone(ctx, name, err) {
		return sandbox.ErrNotFound
	}
	return err
}

// refusedAsGone reports whether err is a toolbox refusal (401, 403, 404)
// of a sandbox that a GET by name then finds gone.
func (p *Provider) refusedAsGone(ctx context.Context, name string, err error) bool {
	switch statusOf(err) {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound:
	default:
		return false
	}
	if ctx.Err() != nil {
		return false
	}
	_, _, gerr := p.getSandbox(ctx, name)
	return errors.Is(gerr, sandbox.ErrNotFound)
}

// ReadFile downloads a file through the toolbox (GET /files/download).
func (p *Provider) ReadFile(ctx context.Context, h *sandbox.Handle, file string) ([]byte, error) {
	if err := checkHandle(h); err != nil {
		return nil, err
	}
	if file == "" || strings.ContainsRune(file, 0) {
		return nil, sandbox.Invalid("path", "empty path or NUL byte in path")
	}
	tb, err := p.ensureStarted(ctx, h.Name)
	if err != nil {
		return nil, err
	}
	r, err := p.c.do(ctx, http.MethodGet, tb+"/files/download?"+url.Values{"path": {file}}.Encode(), nil, "")
	if err != nil {
		return nil, err
	}
	switch {
	case r.status == http.StatusUnauthorized || r.status == http.StatusForbidden:
		return nil, p.toolboxGone(ctx, h.Name, httpError(r))
	case r.status < 200 || r.status > 299:
		return nil, httpError(r) // 404: the daemon's "file not found"
	}
	return r.body, nil
}

// shell runs a small script that must exit 0.
func (p *Provider) shell(ctx context.Context, tb, script string) error {
	res, code, err := p.execute(ctx, tb, script+" 2>&1", 30)
	if err != nil {
		return err
	}
	if code != 0 {
		return &sandbox.ProviderError{Provider: Name, Reason: "shell_failed", Err: fmt.Errorf("exit %d: %s", code, clip(strings.TrimSpace(res), 200))}
	}
	return nil
}

// maxAllowDomains is the most domains the API accepts in a
// domainAllowList (apps/api network-validation.util.ts).
const maxAllowDomains = 10

// validDomain is the API's domain check, as a loop: dot-separated labels of
// [A-Za-z0-9-] (1–63 bytes, no '-' at either end), at least two, the last
// of two or more letters, optionally behind one "*.".
func validDomain(d string) bool {
	d = strings.TrimPrefix(d, "*.")
	labels := strings.Split(d, ".")
	if len(labels) < 2 {
		return false
	}
	for i, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		last := i == len(labels)-1
		if last && len(l) < 2 {
			return false
		}
		for k := 0; k < len(l); k++ {
			c := l[k]
			letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
			if !letter && (last || !('0' <= c && c <= '9' || c == '-')) {
				return false
			}
		}
	}
	return true
}

// networkRecord is the part of the network-settings answer (the sandbox
// record) that says what the API stored.
type networkRecord struct {
	NetworkBlockAll *bool  `json:"networkBlockAll"`
	DomainAllowList string `json:"domainAllowList"`
}

func (p *Provider) networkSettings(ctx context.Context, name string, body map[string]any) (networkRecord, error) {
	var rec networkRecord
	r, err := p.c.call(ctx, http.MethodPost, p.api(name, "network-settings"), body)
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(r.body, &rec); err != nil {
		return rec, &sandbox.ProviderError{Provider: Name, Reason: "policy_unconfirmed", Err: fmt.Errorf("network-settings answered %s", clip(string(r.body), 200))}
	}
	return rec, nil
}

func (p *Provider) enforcesDomains() bool {
	return p.cfg.DomainAllowListEnforced || p.cfg.APIURL == DefaultAPIURL
}

// ApplyNetworkPolicy sets the sandbox's egress. Allow: [] sends
// networkBlockAll: true (the runner then blocks everything). An allow-list
// is sent as domainAllowList alone — block-all takes precedence over every
// list on the runner, so the Elixir adapter's block-all-plus-list blocked
// everything — and only where it is enforced (Config.DomainAllowListEnforced;
// the public-source runner ignores the list, and the network would stay
// open): the answer must echo the list, and a sandbox still blocked is
// unblocked only after that, so the network is never open in between.
// Domains are checked as the API checks them (at most 10, host names with
// an optional "*." prefix) before anything is sent. It does not start the
// sandbox.
func (p *Provider) ApplyNetworkPolicy(ctx context.Context, h *sandbox.Handle, pol sandbox.NetworkPolicy) error {
	if err := checkHandle(h); err != nil {
		return err
	}
	if len(pol.Allow) == 0 {
		rec, err := p.networkSettings(ctx, h.Name, map[string]any{"networkBlockAll": true, "domainAllowList": ""})
		if err != nil {
			return err
		}
		if rec.NetworkBlockAll == nil || !*rec.NetworkBlockAll {
			return &sandbox.ProviderError{Provider: Name, Reason: "policy_not_applied", Err: errors.New("network-settings did not confirm networkBlockAll")}
		}
		return nil
	}
	if len(pol.Allow) > maxAllowDomains {
		return sandbox.Invalid("policy", fmt.Sprintf("%d domains; Daytona accepts at most %d", len(pol.Allow), maxAllowDomains))
	}
	for _, d := range pol.Allow {
		if !validDomain(d) {
			return sandbox.Invalid("policy", fmt.Sprintf("domain %q is not a host name Daytona accepts (labels of letters, digits and '-', optionally behind \"*.\")", clip(d, 60)))
		}
	}
	if !p.enforcesDomains() {
		return sandbox.Invalid("policy", "this Daytona installation is not known to enforce domainAllowList (the public-source runner ignores it); "+
			"set Config.DomainAllowListEnforced if its runners do")
	}
	list := strings.Join(pol.Allow, ",")
	rec, err := p.networkSettings(ctx, h.Name, map[string]any{"domainAllowList": list})
	if err != nil {
		return err
	}
	if rec.DomainAllowList != list {
		return &sandbox.ProviderError{Provider: Name, Reason: "policy_not_applied",
			Err: fmt.Errorf("network-settings kept domainAllowList %q, not %q", rec.DomainAllowList, list)}
	}
	if rec.NetworkBlockAll == nil || !*rec.NetworkBlockAll {
		return nil
	}
	rec, err = p.networkSettings(ctx, h.Name, map[string]any{"networkBlockAll": false})
	if err != nil {
		return err
	}
	if rec.NetworkBlockAll == nil || *rec.NetworkBlockAll || rec.DomainAllowList != list {
		return &sandbox.ProviderError{Provider: Name, Reason: "policy_not_applied", Err: errors.New("network-settings did not lift networkBlockAll")}
	}
	return nil
}
