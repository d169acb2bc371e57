package daytona

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// maxBody caps every response body read into memory (a session journal is
// the largest; it is fetched whole on every poll).
const maxBody = 256 << 20

// errBodyTooLarge is returned when a response exceeds maxBody.
var errBodyTooLarge = errors.New("daytona: response body over 256 MiB")

type client struct {
	hc      *http.Client
	key     string
	timeout time.Duration
}

// response is one HTTP answer, read whole.
type response struct {
	status int
	body   []byte
	header http.Header
}

// do sends one request under the per-request timeout. Its error is already
// in the taxonomy: the caller's own cancellation is returned as ctx.Err();
// the request timeout is Unavailable{timeout}; any other transport failure
// (including a body cut short) is Unavailable{transport}.
func (c *client) do(ctx context.Context, method, url string, body io.Reader, contentType string) (*response, error) {
	return c.doWith(ctx, method, url, body, contentType, reqOpts{})
}

// reqOpts adjusts one request: timeout replaces the per-request timeout
// (noTimeout: none but ctx's), header adds headers.
type reqOpts struct {
	timeout   time.Duration
	noTimeout bool
	header    http.Header
}

func (c *client) doWith(ctx context.Context, method, url string, body io.Reader, contentType string, o reqOpts) (*response, error) {
	rctx := ctx
	timeout := c.timeout
	if o.timeout > 0 {
		timeout = o.timeout
	}
	if timeout > 0 && !o.noTimeout {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(rctx, method, url, body)
	if err != nil {
		return nil, sandbox.Invalid("request", err.Error())
	}
	req.Header.Set("Authorization", "Bearer "+c.key)
	req.Header.Set("Accept", "application/json")
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for k, v := range o.header {
		req.Header[k] = v
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, transportError(ctx, rctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, transportError(ctx, rctx, err)
	}
	if len(b) > maxBody {
		return nil, sandbox.Unavailable(sandbox.ReasonTransport, errBodyTooLarge)
	}
	return &response{status: resp.StatusCode, body: b, header: resp.Header}, nil
}

func transportError(ctx, rctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if rctx.Err() != nil {
		return &sandbox.UnavailableError{Reason: sandbox.ReasonTimeout, Err: err}
	}
	return &sandbox.UnavailableError{Reason: sandbox.ReasonTransport, Err: err}
}

// call sends a JSON request (in may be nil) and returns the 2xx answer, or
// the answer normalized per §3.2 / §6.3.8.
func (c *client) call(ctx context.Context, method, url string, in any) (*response, error) {
	return c.callWith(ctx, method, url, in, reqOpts{})
}

func (c *client) callWith(ctx context.Context, method, url string, in any, o reqOpts) (*response, error) {
	var body io.Reader
	ctype := ""
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, sandbox.Invalid("request", err.Error())
		}
		body = bytes.NewReader(b)
		ctype = "application/json"
	}
	r, err := c.doWith(ctx, method, url, body, ctype, o)
	if err != nil {
		return nil, err
	}
	if r.status < 200 || r.status > 299 {
		return r, httpError(r)
	}
	return r, nil
}

// httpError maps a non-2xx answer through the §3.2 table: 404 not found,
// 401/403 denied, 429 rate limited (retry-after from the body's retryAfter,
// or else the Retry-After header), ≥500 unavailable, anything else invalid.
func httpError(r *response) error {
	var ra time.Duration
	if r.status == http.StatusTooManyRequests {
		ra = retryAfter(r.body, r.header)
	}
	return sandbox.FromHTTPStatus(r.status, bodyText(r.body), ra)
}

// retryAfter reads a 429's wait. Daytona's API names one header per
// throttler that refused, Retry-After-<throttler> in seconds (NestJS named
// throttlers: authenticated, sandbox-create, sandbox-lifecycle, …; apps/docs
// limits.mdx): the longest of them is the wait, as every one must clear.
// Without them, the standard Retry-After (seconds or an HTTP date), then a
// retryAfter body field (the contract's original shape; Daytona's API sends
// none).
func retryAfter(body []byte, h http.Header) time.Duration {
	var named time.Duration
	for k, vs := range h {
		if !strings.HasPrefix(strings.ToLower(k), "retry-after-") {
			continue
		}
		for _, v := range vs {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
				named = max(named, time.Duration(n)*time.Second)
			}
		}
	}
	if named > 0 {
		return named
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if n, err := strconv.Atoi(v); err == nil {
			if n > 0 {
				return time.Duration(n) * time.Second
			}
		} else if t, err := http.ParseTime(v); err == nil {
			if d := time.Until(t); d > 0 {
				return d.Round(time.Second)
			}
		}
	}
	var m map[string]any
	if json.Unmarshal(body, &m) == nil {
		return sandbox.RetryAfterFromJSON(m["retryAfter"])
	}
	return 0
}

// bodyText is the detail kept in an HTTP-derived error: the provider's
// message when the body is Daytona's JSON error shape, else the body text.
func bodyText(b []byte) string {
	var m struct {
		Message any    `json:"message"`
		Error   string `json:"error"`
	}
	if json.Unmarshal(b, &m) == nil {
		switch v := m.Message.(type) {
		case string:
			if v != "" {
				return v
			}
		case []any:
			parts := make([]string, 0, len(v))
			for _, p := range v {
				parts = append(parts, fmt.Sprint(p))
			}
			return strings.Join(parts, "; ")
		}
		if m.Error != "" {
			return m.Error
		}
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 512 {
		s = s[:512]
	}
	return s
}

// statusOf returns the HTTP status behind an error made by httpError.
func statusOf(err error) int {
	var inv *sandbox.InvalidError
	if errors.As(err, &inv) && inv.HTTP != nil {
		return inv.HTTP.Status
	}
	var un *sandbox.UnavailableError
	if errors.As(err, &un) && un.HTTP != nil {
		return un.HTTP.Status
	}
	var den *sandbox.DeniedError
	if errors.As(err, &den) && den.HTTP != nil {
		return den.HTTP.Status
	}
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return http.StatusNotFound
	}
	var rl *sandbox.RateLimitedError
	if errors.As(err, &rl) {
		return http.StatusTooManyRequests
	}
	return 0
}

// conflictAsUnavailable re-tags a 409 (a sandbox mid-transition) as
// Unavailable: it is weather, worth retrying, not the caller's fault.
func conflictAsUnavailable(err error) error {
	var inv *sandbox.InvalidError
	if errors.As(err, &inv) && inv.HTTP != nil && inv.HTTP.Status == http.StatusConflict {
		return &sandbox.UnavailableError{Reason: sandbox.ReasonHTTP, HTTP: inv.HTTP}
	}
	return err
}
