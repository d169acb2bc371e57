package e2b

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// httpError maps a non-success HTTP answer to the taxonomy (§3.2): 404 →
// ErrNotFound, 401/403 → Denied, 429 → RateLimited with the Retry-After
// header's hint (whole seconds or an HTTP-date; E2B's rate limiter sets
// the header and puts nothing of the kind in the body), 409 → Unavailable
// {sandbox_transitioning} (E2B answers 409 while a sandbox is pausing,
// resuming, snapshotting or being killed: a state that passes, not a bad
// request), ≥500 → Unavailable, anything else → Invalid. The body
// (clipped) becomes the error's detail.
func httpError(status int, header http.Header, body []byte) error {
	if status == http.StatusConflict {
		return &sandbox.UnavailableError{Reason: ReasonTransitioning,
			HTTP: &sandbox.HTTPDetail{Status: status, Body: clip(string(body), 512)}}
	}
	return sandbox.FromHTTPStatus(status, clip(string(body), 512), retryAfter(header, time.Now()))
}

// ReasonTransitioning is the UnavailableError reason of E2B's 409: the
// sandbox is changing state (pausing, resuming, snapshotting, killing).
const ReasonTransitioning = "sandbox_transitioning"

// isTransitioning reports whether err is E2B's 409.
func isTransitioning(err error) bool {
	var u *sandbox.UnavailableError
	return errors.As(err, &u) && u.Reason == ReasonTransitioning
}

// retryAfter reads a Retry-After header (RFC 9110 §10.2.3): a
// non-negative number of seconds, or an HTTP-date, taken relative to now
// (a date in the past is no wait). Anything else is no hint.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 || n > 1<<31 {
			return 0
		}
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d.Round(time.Second)
		}
	}
	return 0
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// transportError classifies an error of the HTTP client itself. A caller's
// cancellation stays a context error; everything else (connection refused,
// reset, DNS, a request timeout) is Unavailable.
func transportError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil && errors.Is(err, context.Canceled) {
		return ctx.Err()
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
		return sandbox.Unavailable(sandbox.ReasonTimeout, err)
	}
	return sandbox.Unavailable(sandbox.ReasonTransport, err)
}

// connectError maps the error of a Connect end-of-stream envelope (or a
// unary Connect error body) to the taxonomy by its code, the way the
// status table would have mapped the HTTP status the code stands for.
func connectError(code, msg string) error {
	detail := &sandbox.HTTPDetail{Status: connectCodeStatus(code), Body: clip(code+": "+msg, 512)}
	switch code {
	case "unauthenticated", "permission_denied":
		return &sandbox.DeniedError{Reason: "connect_" + code, HTTP: detail}
	case "resource_exhausted":
		return &sandbox.RateLimitedError{}
	case "invalid_argument", "failed_precondition", "out_of_range", "unimplemented", "already_exists":
		return &sandbox.InvalidError{Reason: "connect_" + code, Msg: clip(msg, 200), HTTP: detail}
	case "not_found":
		// The process or file a stream was about is gone; the sandbox is
		// not known to be gone, so this is not ErrNotFound.
		return &sandbox.ProviderError{Provider: Name, Reason: "connect_not_found", Err: errors.New(clip(msg, 200))}
	}
	if code == "" {
		code = "unknown"
	}
	return &sandbox.UnavailableError{Reason: "connect_" + code, HTTP: detail}
}

func connectCodeStatus(code string) int {
	switch code {
	case "canceled":
		return 499
	case "invalid_argument", "failed_precondition", "out_of_range":
		return 400
	case "deadline_exceeded":
		return 504
	case "not_found":
		return 404
	case "already_exists", "aborted":
		return 409
	case "permission_denied":
		return 403
	case "resource_exhausted":
		return 429
	case "unimplemented":
		return 501
	case "unavailable":
		return 503
	case "unauthenticated":
		return 401
	}
	return 500
}

// normalize passes the taxonomy through and wraps anything else in the
// provider escape hatch.
func normalize(err error) error {
	if err == nil {
		return nil
	}
	var (
		u *sandbox.UnavailableError
		d *sandbox.DeniedError
		i *sandbox.InvalidError
		l *sandbox.RateLimitedError
		w *sandbox.WriteFailedError
		p *sandbox.ProviderError
	)
	switch {
	case errors.Is(err, sandbox.ErrNotFound), errors.Is(err, sandbox.ErrTruncated),
		errors.Is(err, sandbox.ErrCommandExited), errors.Is(err, sandbox.ErrNotSupported),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &u), errors.As(err, &d), errors.As(err, &i), errors.As(err, &l),
		errors.As(err, &w), errors.As(err, &p):
		return err
	}
	if strings.Contains(err.Error(), "closed_before_exit") {
		return sandbox.ClosedBeforeExit()
	}
	return &sandbox.ProviderError{Provider: Name, Reason: "error", Err: err}
}
