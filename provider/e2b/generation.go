package e2b

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Generations of E2B's create and connect routes. The current service
// (and e2b@2.x) creates with POST /v2/sandboxes and connects with POST
// /v2/sandboxes/{id}/connect; a service from before them (an older or
// self-hosted cluster) has only POST /sandboxes and POST
// /sandboxes/{id}/connect. The bodies this provider sends are the same
// for both.
const (
	genUnknown int32 = iota
	genV1
	genV2
)

func createPath(gen int32) string {
	if gen == genV1 {
		return "/sandboxes"
	}
	return "/v2/sandboxes"
}

func connectPath(id string) func(int32) string {
	return func(gen int32) string {
		if gen == genV1 {
			return "/sandboxes/" + url.PathEscape(id) + "/connect"
		}
		return "/v2/sandboxes/" + url.PathEscape(id) + "/connect"
	}
}

// routeMissing is a status with which a service that lacks a route
// answers it: 404, or 405 where the path exists for another method (GET
// /v2/sandboxes, the listing, is older than POST /v2/sandboxes).
func routeMissing(status int) bool {
	return status == http.StatusNotFound || status == http.StatusMethodNotAllowed
}

// postGen sends a create or connect (path gives the route of each
// generation) in the provider's generation. Until that is known it sends
// the v2 route and, when that answers 404 or 405, the v1 route; the first
// success decides the generation for the provider's lifetime, so a
// provider probes at most until its first successful create or connect
// and never after. A 404 on both (an unknown template, an unknown sandbox:
// each generation says so alike) decides nothing and is returned as the v1
// route answered it; an answer that did not come (a transport error, a
// timeout) is never retried on the other route, since the server may have
// acted on it.
func (p *Provider) postGen(ctx context.Context, timeout time.Duration, path func(int32) string, body any) (http.Header, []byte, error) {
	if gen := p.gen.Load(); gen != genUnknown {
		return p.doTimeout(ctx, timeout, http.MethodPost, path(gen), body)
	}
	status, h, b, err := p.send(ctx, timeout, http.MethodPost, path(genV2), body)
	if !routeMissing(status) {
		if err == nil {
			p.gen.CompareAndSwap(genUnknown, genV2)
		}
		return h, b, err
	}
	_, h, b, err = p.send(ctx, timeout, http.MethodPost, path(genV1), body)
	if err == nil && p.gen.CompareAndSwap(genUnknown, genV1) {
		p.cfg.Logger.Info("e2b: the service has no v2 create and connect routes (answered " +
			http.StatusText(status) + "); using POST /sandboxes and /sandboxes/{id}/connect")
	}
	return h, b, err
}
