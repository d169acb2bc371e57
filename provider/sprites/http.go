package sprites

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// maxBody caps what an ordinary REST call reads from one response. A body
// over it is Unavailable{body_too_large}, and no more of it is read.
const maxBody = 8 << 20

// noRedirect keeps every client on the first answer: a 3xx is classified,
// never followed (so the bearer token is never replayed elsewhere either).
func noRedirect(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// newTransport is an HTTP/1-only transport. bounded additionally disables
// keep-alives, so each bounded operation owns its connection and an abort
// closes the socket, and nothing is ever retried on a reused connection.
func newTransport(bounded bool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ForceAttemptHTTP2 = false
	t.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	t.DisableCompression = true
	if bounded {
		t.DisableKeepAlives = true
		t.MaxIdleConns = 0
	}
	return t
}

// escapeSegment percent-encodes s with the RFC 3986 unreserved set only, so
// "owned worker/x" becomes "owned%20worker%2Fx".
func escapeSegment(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

func (p *Provider) spritePath(name string, rest ...string) string {
	s := "/v1/sprites/" + escapeSegment(name)
	for _, r := range rest {
		s += "/" + r
	}
	return s
}

// request is one ordinary REST call.
type request struct {
	method  string
	path    string // already escaped
	query   url.Values
	body    []byte
	ctype   string
	timeout time.Duration // zero: Config.Timeout
}

// response is an answer to an ordinary call.
type response struct {
	status int
	body   []byte
	header http.Header
}

// err maps a non-success answer through the §3.2 table.
func (r response) err() error { return statusError(r.status, r.body, r.header) }

// do runs r and returns the answer, its body read to at most maxBody bytes.
// Its error is already in the taxonomy: a deadline is Unavailable{timeout},
// a transport failure Unavailable{transport}, an oversized body
// Unavailable{body_too_large}; the caller's cancellation is ctx.Err().
func (p *Provider) do(ctx context.Context, r request) (response, error) {
	timeout := r.timeout
	if timeout <= 0 {
		timeout = p.cfg.Timeout
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	u := p.cfg.BaseURL + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var body io.Reader
	if r.body != nil {
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(rctx, r.method, u, body)
	if err != nil {
		return response{}, sandbox.Invalid("request", "cannot build request: "+err.Error())
	}
	p.authorize(req)
	if r.ctype != "" {
		req.Header.Set("Content-Type", r.ctype)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return response{}, p.transportError(ctx, rctx, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return response{}, p.transportError(ctx, rctx, err)
	}
	if len(b) > maxBody {
		return response{}, sandbox.Unavailable("body_too_large", nil)
	}
	return response{status: resp.StatusCode, body: b, header: resp.Header}, nil
}

func (p *Provider) authorize(req *http.Request) {
	req.Header.Set("Authorization", "Bearer "+p.cfg.Token)
	req.Header.Set("User-Agent", "managoat-sprites")
}

// transportError classifies a failed round trip. The token never appears
// in a net/http error (it lives in a header), so the cause is kept.
func (p *Provider) transportError(caller, rctx context.Context, err error) error {
	if caller.Err() != nil && !errors.Is(caller.Err(), context.DeadlineExceeded) {
		return caller.Err()
	}
	var ne net.Error
	if rctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return sandbox.Unavailable(sandbox.ReasonTimeout, nil)
	}
	return sandbox.Unavailable(sandbox.ReasonTransport, err)
}

// statusError maps a non-success answer through the §3.2 table, carrying
// the body as detail and, for a 429, the retry-after hint: the body's
// retry_after_seconds, else a Retry-After header of whole seconds.
func statusError(status int, body []byte, header http.Header) error {
	return sandbox.FromHTTPStatus(status, string(body), retryAfter(status, body, header))
}

func retryAfter(status int, body []byte, header http.Header) time.Duration {
	if status != http.StatusTooManyRequests {
		return 0
	}
	var m map[string]any
	if json.Unmarshal(body, &m) == nil {
		if d := sandbox.RetryAfterFromJSON(m["retry_after_seconds"]); d > 0 {
			return d
		}
	}
	if header != nil {
		if n, err := strconv.Atoi(strings.TrimSpace(header.Get("Retry-After"))); err == nil && n >= 0 {
			return time.Duration(n) * time.Second
		}
	}
	return 0
}

func is2xx(s int) bool { return s >= 200 && s < 300 }
