package e2b

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Metadata keys stamped on every sandbox this provider creates: the name is
// the identity E2B lacks, the marker scopes list_all_names to our sandboxes.
const (
	MetaName   = "fountain_name"
	MetaMarker = "fountain"
	// MetaCreated is the creation time this provider stamps (RFC 3339,
	// UTC, nanoseconds). Duplicates are ordered by it, not by the
	// listing's startedAt, which a resume resets.
	MetaCreated = "fountain_created"
)

const maxBody = 1 << 20

// listed is one element of GET /v2/sandboxes.
type listed struct {
	SandboxID string `json:"sandboxID"`
	AltID     string `json:"sandboxId"`
	State     string `json:"state"`
	StartedAt string `json:"startedAt"`
	// EndAt is when the sandbox's TTL ends (it auto-pauses then).
	EndAt string `json:"endAt"`
	// EnvdVersion is the version of the sandbox's envd.
	EnvdVersion string            `json:"envdVersion"`
	Metadata    map[string]string `json:"metadata"`
	// Domain is the sandbox's base domain, given by create, connect and
	// GET /sandboxes/{id} (null for the default cluster), never by the
	// listing.
	Domain *string `json:"domain"`
	// EnvdAccessToken is a secure sandbox's envd token, given by create,
	// connect and GET /sandboxes/{id} (never kept in raw).
	EnvdAccessToken string `json:"envdAccessToken"`
	raw             json.RawMessage
}

func (l listed) id() string {
	if l.SandboxID != "" {
		return l.SandboxID
	}
	return l.AltID
}

func itoa(n int) string { return strconv.Itoa(n) }

// do sends one control-plane request and returns the body of a 2xx answer.
// Everything else is an error of the taxonomy.
func (p *Provider) do(ctx context.Context, method, path string, body any) (http.Header, []byte, error) {
	return p.doTimeout(ctx, p.cfg.RequestTimeout, method, path, body)
}

// doTimeout is do bounded by timeout instead of RequestTimeout.
func (p *Provider) doTimeout(ctx context.Context, timeout time.Duration, method, path string, body any) (http.Header, []byte, error) {
	_, h, b, err := p.send(ctx, timeout, method, path, body)
	return h, b, err
}

// send is doTimeout that also returns the answer's status (0 when there
// was none).
func (p *Provider) send(ctx context.Context, timeout time.Duration, method, path string, body any) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, nil, sandbox.Invalid("request", err.Error())
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, p.cfg.APIURL+path, rd)
	if err != nil {
		return 0, nil, nil, sandbox.Invalid("request", err.Error())
	}
	req.Header.Set("X-API-Key", p.cfg.APIKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.cfg.HTTPClient.Do(req)
	if err != nil {
		return 0, nil, nil, transportError(ctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, nil, transportError(ctx, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, resp.Header, b, httpError(resp.StatusCode, resp.Header, b)
	}
	return resp.StatusCode, resp.Header, b, nil
}

// metadataFilter renders a metadata filter the way E2B's API decodes it:
// after the query parameter's own decoding, the server unescapes the whole
// value, splits it on '&' and '=', and unescapes each key and value again
// (parseFilters in e2b-dev/infra packages/api/internal/utils). So each key
// and value is escaped, the joined string escaped once more, and
// url.Values escapes the parameter a third time.
func metadataFilter(meta url.Values) string {
	keys := make([]string, 0, len(meta))
	for k := range meta {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var pairs []string
	for _, k := range keys {
		for _, v := range meta[k] {
			pairs = append(pairs, url.QueryEscape(k)+"="+url.QueryEscape(v))
		}
	}
	return url.QueryEscape(strings.Join(pairs, "&"))
}

// list pages through GET /v2/sandboxes with the given metadata filter over
// running and paused sandboxes. It stops after MaxPages pages with
// ErrTruncated when more remain.
func (p *Provider) list(ctx context.Context, meta url.Values) ([]listed, error) {
	var all []listed
	token := ""
	for page := 0; ; page++ {
		if page >= p.cfg.MaxPages {
			return nil, sandbox.ErrTruncated
		}
		q := url.Values{}
		q.Set("state", "running,paused")
		q.Set("metadata", metadataFilter(meta))
		q.Set("limit", "100")
		if token != "" {
			q.Set("nextToken", token)
		}
		h, b, err := p.do(ctx, http.MethodGet, "/v2/sandboxes?"+q.Encode(), nil)
		if err != nil {
			return nil, err
		}
		var raws []json.RawMessage
		if err := json.Unmarshal(b, &raws); err != nil {
			return nil, &sandbox.InvalidError{Reason: sandbox.ReasonHTTP, Msg: "listing is not a JSON array",
				HTTP: &sandbox.HTTPDetail{Status: 200, Body: clip(string(b), 200)}}
		}
		for _, r := range raws {
			var l listed
			if json.Unmarshal(r, &l) != nil {
				continue
			}
			l.raw = withoutSecrets(r)
			all = append(all, l)
		}
		token = h.Get("X-Next-Token")
		if token == "" {
			return all, nil
		}
	}
}

// findAll lists every sandbox that carries name, canonical first (see
// compareCanonical), so every caller that sees the same set picks the
// same one.
func (p *Provider) findAll(ctx context.Context, name string) ([]listed, error) {
	ls, err := p.list(ctx, url.Values{MetaName: {name}})
	if err != nil {
		return nil, err
	}
	out := ls[:0]
	for _, l := range ls {
		if l.Metadata[MetaName] == name && l.id() != "" {
			out = append(out, l)
		}
	}
	slices.SortStableFunc(out, compareCanonical)
	return out, nil
}

// compareCanonical orders the sandboxes of one name, canonical first: by
// the creation stamp this provider writes (MetaCreated); a sandbox without
// one (made by an older version) comes before every stamped one and, among
// themselves, by startedAt; ties by id. startedAt alone would let a resume
// (which resets it) change which sandbox is canonical.
func compareCanonical(a, b listed) int {
	ca, ea := time.Parse(time.RFC3339Nano, a.Metadata[MetaCreated])
	cb, eb := time.Parse(time.RFC3339Nano, b.Metadata[MetaCreated])
	switch {
	case ea == nil && eb == nil:
		if c := ca.Compare(cb); c != 0 {
			return c
		}
	case ea == nil:
		return 1
	case eb == nil:
		return -1
	default:
		if c := compareStart(a.StartedAt, b.StartedAt); c != 0 {
			return c
		}
	}
	return strings.Compare(a.id(), b.id())
}

// find returns the canonical sandbox carrying name, or ErrNotFound.
func (p *Provider) find(ctx context.Context, name string) (listed, error) {
	ls, err := p.findAll(ctx, name)
	if err != nil {
		return listed{}, err
	}
	if len(ls) == 0 {
		return listed{}, sandbox.ErrNotFound
	}
	return ls[0], nil
}

// lookup resolves h to its sandbox: the canonical one the listing shows
// for h.Name or, when the listing shows none, the sandbox h was made or
// resumed with (h.Private), as GET /sandboxes/{id} describes it, if it
// still carries h.Name. E2B's listing has the live sandboxes that are
// running or pausing and the paused ones from their snapshots, so a
// sandbox being snapshotted that was never paused is in neither; its own
// record says running (e2b-dev/infra packages/api/internal/handlers/
// sandboxes_list.go, sandbox_get.go). A handle read back from outside the
// process has no id, and for it the listing alone decides.
func (p *Provider) lookup(ctx context.Context, h *sandbox.Handle) (listed, error) {
	l, err := p.find(ctx, h.Name)
	id, _ := h.Private.(string)
	if !errors.Is(err, sandbox.ErrNotFound) || id == "" {
		return l, err
	}
	d, derr := p.detail(ctx, id)
	switch {
	case isNotFound(derr):
		return listed{}, sandbox.ErrNotFound
	case derr != nil:
		return listed{}, derr
	case d.Metadata[MetaName] != h.Name:
		return listed{}, sandbox.ErrNotFound
	}
	return d, nil
}

// resolveRunning finds h's sandbox and resumes it when it is paused
// (auto-paused by its TTL, or suspended): the self-healing step every
// operation that needs envd takes first. A running sandbox whose TTL ends
// soon is renewed first (connect, which only ever extends a running one's
// TTL): otherwise the TTL could pause it between this listing and the
// operation (a command's first heartbeat comes only once its stream is
// open), and the operation would fail on a sandbox the listing said ran.
func (p *Provider) resolveRunning(ctx context.Context, h *sandbox.Handle) (string, error) {
	l, err := p.lookup(ctx, h)
	if err != nil {
		return "", err
	}
	p.rememberVersion(l.id(), l.EnvdVersion)
	if l.State == "paused" || p.endsSoon(l) {
		if err := p.connect(ctx, h.Name, l.id()); err != nil {
			return "", err
		}
	}
	return l.id(), nil
}

// endsSoon reports whether l's TTL may end before an operation started
// now has its first heartbeat in: within two requests (the operation's
// own, then the heartbeat) plus the slack for clock skew. An endAt that is
// missing or does not parse counts as soon.
func (p *Provider) endsSoon(l listed) bool {
	end, err := time.Parse(time.RFC3339Nano, l.EndAt)
	if err != nil {
		return true
	}
	margin := 2*p.cfg.RequestTimeout + capSlack(p.cfg.SandboxTimeout)
	return time.Until(end) < margin
}

// byID runs a control-plane call addressed by sandbox id. A 404 there is
// ErrNotFound only when the listing agrees that name is gone; otherwise the
// sandbox exists and the call failed, which is Unavailable.
func (p *Provider) byID(ctx context.Context, name, method, path string, body any) error {
	_, b, err := p.do(ctx, method, path, body)
	return p.confirmGone(ctx, name, err, b)
}

func (p *Provider) confirmGone(ctx context.Context, name string, err error, body []byte) error {
	if err == nil || !isNotFound(err) {
		return err
	}
	if _, ferr := p.find(ctx, name); ferr != nil {
		return ferr
	}
	return &sandbox.UnavailableError{Reason: sandbox.ReasonHTTP,
		HTTP: &sandbox.HTTPDetail{Status: 404, Body: clip(string(body), 200)}}
}

// connect resumes a paused sandbox (or extends a running one's TTL) and
// remembers the domain its answer names. A 409 (the sandbox is changing
// state) is retried: connect is idempotent.
func (p *Provider) connect(ctx context.Context, name, id string) error {
	var b []byte
	err := p.retryTransition(ctx, "connect", func(ctx context.Context) error {
		var err error
		_, b, err = p.postGen(ctx, p.cfg.LongRequestTimeout, connectPath(id),
			map[string]int{"timeout": seconds(p.cfg.SandboxTimeout)})
		return err
	})
	if isMaxInstanceLength(err) {
		// Running past its plan's maximum instance length, the sandbox is
		// about to be paused (or killed) and cannot be kept alive; once it
		// is paused, a connect resumes it as a new instance.
		return &sandbox.UnavailableError{Reason: ReasonMaxInstanceLength, Err: errors.New(
			"the sandbox reached its plan's maximum instance length and E2B would not keep it running (" +
				clip(string(b), 200) + "); retry once it is paused: a resume starts a new instance")}
	}
	if err != nil {
		return p.confirmGone(ctx, name, err, b)
	}
	var l listed
	if json.Unmarshal(b, &l) == nil {
		p.rememberDomain(id, l.Domain)
		p.rememberVersion(id, l.EnvdVersion) // a resume may bring a new envd
		p.rememberToken(id, l.EnvdAccessToken)
	}
	return nil
}

// heartbeat renews id's TTL; a 409 (changing state) is retried.
func (p *Provider) heartbeat(ctx context.Context, id string) error {
	return p.retryTransition(ctx, "heartbeat", func(ctx context.Context) error {
		_, _, err := p.do(ctx, http.MethodPost, "/sandboxes/"+url.PathEscape(id)+"/timeout",
			map[string]int{"timeout": seconds(p.cfg.SandboxTimeout)})
		return err
	})
}

func (p *Provider) kill(ctx context.Context, id string) error {
	_, _, err := p.do(ctx, http.MethodDelete, "/sandboxes/"+url.PathEscape(id), nil)
	if isNotFound(err) {
		err = nil
	}
	if err == nil {
		p.domains.Delete(id)
		p.versions.Delete(id)
		p.tokens.Delete(id)
	}
	return err
}

func (p *Provider) createRaw(ctx context.Context, name string, stamp time.Time) (string, error) {
	body := map[string]any{
		"templateID": p.cfg.Template,
		"timeout":    seconds(p.cfg.SandboxTimeout),
		"autoPause":  true,
		"metadata": map[string]string{MetaName: name, MetaMarker: "1",
			MetaCreated: stamp.UTC().Format(time.RFC3339Nano)},
	}
	// The server answers a create once the sandbox has started from its
	// template, which can take longer than an ordinary request (E2B's SDK
	// allows 60 s): a create cut short at RequestTimeout may still make a
	// sandbox, which the next Create of the name then adopts.
	_, b, err := p.postGen(ctx, p.cfg.LongRequestTimeout, createPath, body)
	if isNotFound(err) || isBadTemplateRef(err) {
		// E2B answers an unknown template with 404 "template '<id>' not
		// found", an unknown tag of one with 404 "tag '<tag>' does not
		// exist for template '<id>'" and a malformed reference with 400
		// "Invalid template reference: ...": a bad argument, never a
		// missing sandbox.
		msg := "template " + strconv.Quote(p.cfg.Template) + " not found"
		var e struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			msg = clip(e.Message, 200)
		}
		status := http.StatusNotFound
		if !isNotFound(err) {
			status = http.StatusBadRequest
		}
		return "", &sandbox.InvalidError{Reason: "template", Msg: msg,
			HTTP: &sandbox.HTTPDetail{Status: status, Body: clip(string(b), 200)}}
	}
	if err != nil {
		return "", err
	}
	var s listed
	if json.Unmarshal(b, &s) != nil || s.id() == "" {
		return "", &sandbox.UnavailableError{Reason: "create_unconfirmed",
			HTTP: &sandbox.HTTPDetail{Status: 201, Body: clip(string(b), 200)}}
	}
	p.rememberDomain(s.id(), s.Domain)
	p.rememberVersion(s.id(), s.EnvdVersion)
	p.rememberToken(s.id(), s.EnvdAccessToken)
	return s.id(), nil
}

func isNotFound(err error) bool { return errors.Is(err, sandbox.ErrNotFound) }

// isBadTemplateRef reports whether err is create's 400 for a malformed
// template reference (e2b-dev/infra packages/api/internal/handlers/
// sandbox_create.go).
func isBadTemplateRef(err error) bool {
	var inv *sandbox.InvalidError
	return errors.As(err, &inv) && inv.HTTP != nil && inv.HTTP.Status == http.StatusBadRequest &&
		strings.Contains(inv.HTTP.Body, "Invalid template reference")
}

// compareStart orders two startedAt stamps by time (RFC 3339), falling back
// to the strings when either does not parse.
func compareStart(a, b string) int {
	ta, ea := time.Parse(time.RFC3339Nano, a)
	tb, eb := time.Parse(time.RFC3339Nano, b)
	if ea != nil || eb != nil {
		return strings.Compare(a, b)
	}
	return ta.Compare(tb)
}
