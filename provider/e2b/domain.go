package e2b

import (
	"context"
	"encoding/json"
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
	_, b, err := p.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return "", err
	}
	var l listed
	if err := json.Unmarshal(b, &l); err != nil {
		return "", &sandbox.ProviderError{Provider: Name, Reason: "bad_sandbox_detail", Err: err}
	}
	if l.State == "running" {
		p.rememberDomain(id, l.Domain)
	}
	if l.Domain != nil {
		return *l.Domain, nil
	}
	return "", nil
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
	_, b, err := p.do(ctx, http.MethodGet, "/sandboxes/"+url.PathEscape(id), nil)
	if err != nil {
		return time.Time{}, err
	}
	var d struct {
		EndAt time.Time `json:"endAt"`
	}
	if err := json.Unmarshal(b, &d); err != nil || d.EndAt.IsZero() {
		return time.Time{}, &sandbox.ProviderError{Provider: Name, Reason: "bad_sandbox_detail", Err: err}
	}
	return d.EndAt, nil
}
