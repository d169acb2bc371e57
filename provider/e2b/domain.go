package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// rememberDomain records the domain a create or connect answer gave for
// sandbox id; null (the default cluster) is recorded as "", which means
// Config.Domain.
func (p *Provider) rememberDomain(id string, domain *string) {
	d := ""
	if domain != nil {
		d = *domain
	}
	p.domains.Store(id, d)
}

// sandboxDomain is the envd domain of sandbox id. A sandbox this provider
// neither created nor connected (one made by another process, a CLI run
// before this one) is looked up once with GET /sandboxes/{id}, whose
// answer names the domain of a running sandbox; the listing does not. A
// paused sandbox's answer names none, so it is not remembered: the
// connect that resumes it will.
func (p *Provider) sandboxDomain(ctx context.Context, id string) (string, error) {
	if p.cfg.SandboxURL != "" {
		return "", nil
	}
	if d, ok := p.domains.Load(id); ok {
		return d.(string), nil
	}
	l, err := p.detail(ctx, id)
	if err != nil {
		return "", err
	}
	if l.State == "running" {
		p.rememberDomain(id, l.Domain)
	}
	if l.Domain != nil {
		return *l.Domain, nil
	}
	return "", nil
}

// detail is GET /sandboxes/{id}: the sandbox's own record. Unlike the
// listing it says paused only for a sandbox that is paused or pausing, and
// running for one being snapshotted (which runs again after); one being
// killed is ErrNotFound (e2b-dev/infra packages/api/internal/handlers/
// sandbox_get.go).
func (p *Provider) detail(ctx context.Context, id string) (listed, error) {
	_, b, err := p.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return listed{}, err
	}
	var l listed
	if err := json.Unmarshal(b, &l); err != nil || l.id() == "" {
		if err == nil {
			err = errors.New("no sandboxID")
		}
		return listed{}, &sandbox.ProviderError{Provider: Name, Reason: "bad_sandbox_detail", Err: err}
	}
	p.rememberToken(id, l.EnvdAccessToken)
	l.raw = withoutSecrets(b)
	return l, nil
}

// rememberToken records sandbox id's envdAccessToken ("" for a sandbox
// that is not secure).
func (p *Provider) rememberToken(id, token string) { p.tokens.Store(id, token) }

// envdToken is sandbox id's envdAccessToken, which envd wants in
// X-Access-Token when the sandbox is secure (every sandbox made through
// POST /v2/sandboxes is): "" for one that is not. A sandbox this provider
// neither created nor connected is read once with GET /sandboxes/{id}.
func (p *Provider) envdToken(ctx context.Context, id string) (string, error) {
	if t, ok := p.tokens.Load(id); ok {
		return t.(string), nil
	}
	l, err := p.detail(ctx, id)
	if err != nil {
		return "", err
	}
	return l.EnvdAccessToken, nil
}

// secretFields are the fields of E2B's sandbox records that grant access
// to the sandbox: they never reach Info.Raw.
var secretFields = []string{"envdAccessToken", "trafficAccessToken"}

// withoutSecrets is a JSON object without its secretFields (nil when it
// is not an object).
func withoutSecrets(b []byte) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil || m == nil {
		return nil
	}
	for _, k := range secretFields {
		delete(m, k)
	}
	out, err := json.Marshal(m)
	if err != nil {
		return nil
	}
	return out
}

// retryTransition runs an idempotent call again while E2B answers 409
// (the sandbox is changing state), a few times over a few seconds; any
// other outcome is returned at once.
func (p *Provider) retryTransition(ctx context.Context, label string, fn func(context.Context) error) error {
	return sandbox.Retry(ctx, p.transitionBackoff(label), fn)
}

func (p *Provider) transitionBackoff(label string) sandbox.Backoff {
	b := p.cfg.TransitionBackoff
	b.Label, b.Retriable, b.Logger = "e2b "+label, isTransitioning, p.cfg.Logger
	return b
}

// sandboxEnd is when E2B will end sandbox id (its endAt), from GET
// /sandboxes/{id}.
func (p *Provider) sandboxEnd(ctx context.Context, id string) (time.Time, error) {
	l, err := p.detail(ctx, id)
	if err != nil {
		return time.Time{}, err
	}
	end, err := time.Parse(time.RFC3339Nano, l.EndAt)
	if err != nil {
		return time.Time{}, &sandbox.ProviderError{Provider: Name, Reason: "bad_sandbox_detail", Err: err}
	}
	return end, nil
}
