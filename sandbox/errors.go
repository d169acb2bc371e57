package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The sentinel errors of the closed taxonomy. Match them with errors.Is.
var (
	// ErrNotFound means the sandbox or session definitively does not exist.
	// It is never returned for a transient failure: hosts use it as the only
	// licence to give up a parked disk.
	ErrNotFound = errors.New("sandbox: not found")
	// ErrTruncated means a listing refused to return a partial view.
	ErrTruncated = errors.New("sandbox: listing truncated")
	// ErrNotSupported means the provider does not implement the operation.
	ErrNotSupported = errors.New("sandbox: operation not supported")
	// ErrAlreadyExists means a fresh creation refused an existing name.
	ErrAlreadyExists = errors.New("sandbox: already exists")
	// ErrCommandExited means a stdin write or close raced the command's exit,
	// or the command handle was stopped (detached) locally.
	ErrCommandExited = errors.New("sandbox: command exited")
	// ErrUnsupported is ErrNotSupported: PublicURL's "this provider has no
	// URL to give" is the operation not supported, with one sentinel and
	// one kind (not_supported) for it. The kind "unsupported" that older
	// peers send is read as ErrNotSupported. The name is kept so that code
	// written against it compiles; new code uses ErrNotSupported.
	ErrUnsupported = ErrNotSupported
)

// Reasons carried by UnavailableError and InvalidError. Providers may use
// others; these are the ones the contract names.
const (
	ReasonHTTP                 = "http"
	ReasonTimeout              = "timeout"
	ReasonExecTimeout          = "exec_timeout"
	ReasonClosedBeforeExit     = "closed_before_exit"
	ReasonTransport            = "transport"
	ReasonTerminationRequest   = "termination_request"
	ReasonTerminationUnconfirm = "termination_unconfirmed"
	ReasonName                 = "name"
	ReasonHandle               = "handle"
	ReasonProvider             = "provider"
)

// HTTPDetail is the {http, status, body} detail of an error derived from an
// HTTP answer. Body is empty for the bounded operations, which never pass
// provider prose through.
type HTTPDetail struct {
	Status int
	Body   string
}

func (d *HTTPDetail) String() string {
	if d == nil {
		return ""
	}
	if d.Body == "" {
		return "http " + strconv.Itoa(d.Status)
	}
	return fmt.Sprintf("http %d: %s", d.Status, clip(d.Body, 200))
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// RateLimitedError means the provider throttled the call. RetryAfter is the
// provider's hint, zero when none was given. Retry honours it.
type RateLimitedError struct {
	RetryAfter time.Duration
}

func (e *RateLimitedError) Error() string {
	if e.RetryAfter > 0 {
		return "sandbox: rate limited (retry after " + e.RetryAfter.String() + ")"
	}
	return "sandbox: rate limited"
}

// UnavailableError is a 5xx, a timeout, a transport failure, or an outcome
// that could not be confirmed. It is transient.
type UnavailableError struct {
	Reason  string        // e.g. "http", "exec_timeout", "closed_before_exit", "create_unconfirmed"
	HTTP    *HTTPDetail   // set when Reason is "http"
	Timeout time.Duration // the original budget, for exec_timeout
	Err     error         // the underlying cause, if any
}

func (e *UnavailableError) Error() string {
	s := "sandbox: unavailable: " + e.Reason
	switch {
	case e.HTTP != nil:
		s += " (" + e.HTTP.String() + ")"
	case e.Reason == ReasonExecTimeout:
		s += " (" + e.Timeout.String() + ")"
	}
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *UnavailableError) Unwrap() error { return e.Err }

// DeniedError is a credential problem (HTTP 401 or 403). Not transient.
type DeniedError struct {
	Reason string
	HTTP   *HTTPDetail
}

func (e *DeniedError) Error() string {
	s := "sandbox: denied"
	if e.Reason != "" {
		s += ": " + e.Reason
	}
	if e.HTTP != nil {
		s += " (" + e.HTTP.String() + ")"
	}
	return s
}

// InvalidError is the caller's fault: bad input, or an HTTP answer outside
// the other classes (other 4xx, 3xx, unexpected 2xx). Not transient.
type InvalidError struct {
	Reason string // e.g. "name", "handle", "termination_request", "http"
	Msg    string // a human explanation, never provider prose
	HTTP   *HTTPDetail
}

func (e *InvalidError) Error() string {
	s := "sandbox: invalid " + e.Reason
	if e.Msg != "" {
		s += ": " + e.Msg
	}
	if e.HTTP != nil {
		s += " (" + e.HTTP.String() + ")"
	}
	return s
}

// RestoreFailedError means a checkpoint restore reported failure. A failed
// restore is never reported as success. Not transient.
type RestoreFailedError struct {
	Detail string
}

func (e *RestoreFailedError) Error() string { return "sandbox: restore failed: " + e.Detail }

// WriteFailedError means a stdin write failed for a reason other than the
// command's exit.
type WriteFailedError struct {
	Err error
}

func (e *WriteFailedError) Error() string {
	if e.Err == nil {
		return "sandbox: stdin write failed"
	}
	return "sandbox: stdin write failed: " + e.Err.Error()
}

func (e *WriteFailedError) Unwrap() error { return e.Err }

// ProviderError is the escape hatch for failures of a shape the taxonomy
// does not name. It is treated as transient.
type ProviderError struct {
	Provider string
	Reason   string
	Err      error
}

func (e *ProviderError) Error() string {
	s := "sandbox: " + e.Provider + ": " + e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *ProviderError) Unwrap() error { return e.Err }

// Unavailable returns an UnavailableError with the given reason.
func Unavailable(reason string, cause error) error {
	return &UnavailableError{Reason: reason, Err: cause}
}

// Invalid returns an InvalidError.
func Invalid(reason, msg string) error { return &InvalidError{Reason: reason, Msg: msg} }

// ClosedBeforeExit is the error of a stream that closed without an exit:
// Unavailable{closed_before_exit}. It is transient, so an idempotent caller
// re-runs; it is never reported as exit 0.
func ClosedBeforeExit() error { return &UnavailableError{Reason: ReasonClosedBeforeExit} }

// ExecTimeout is the error of an exec whose single deadline passed.
func ExecTimeout(d time.Duration) error {
	return &UnavailableError{Reason: ReasonExecTimeout, Timeout: d}
}

// IsClosedBeforeExit reports whether err is Unavailable{closed_before_exit}.
func IsClosedBeforeExit(err error) bool { return hasReason(err, ReasonClosedBeforeExit) }

// IsExecTimeout reports whether err is Unavailable{exec_timeout}.
func IsExecTimeout(err error) bool { return hasReason(err, ReasonExecTimeout) }

func hasReason(err error, reason string) bool {
	var u *UnavailableError
	return errors.As(err, &u) && u.Reason == reason
}

// FromHTTPStatus maps an HTTP status to the taxonomy, in the order of the
// contract: 404 → ErrNotFound; 401/403 → Denied; 429 → RateLimited (with
// retryAfter, zero when unknown); ≥500 → Unavailable; anything else (other
// 4xx, 3xx, an unexpected 2xx) → Invalid. body becomes the error's detail;
// pass "" where provider prose must not be passed through.
func FromHTTPStatus(status int, body string, retryAfter time.Duration) error {
	d := &HTTPDetail{Status: status, Body: body}
	switch {
	case status == 404:
		return ErrNotFound
	case status == 401 || status == 403:
		return &DeniedError{Reason: ReasonHTTP, HTTP: d}
	case status == 429:
		return &RateLimitedError{RetryAfter: retryAfter}
	case status >= 500:
		return &UnavailableError{Reason: ReasonHTTP, HTTP: d}
	default:
		return &InvalidError{Reason: ReasonHTTP, HTTP: d}
	}
}

// RetryAfterFromJSON extracts a retry-after hint from a decoded JSON value
// (a 429 body's field): only a non-negative integer counts, in seconds.
func RetryAfterFromJSON(v any) time.Duration {
	switch n := v.(type) {
	case float64:
		if n >= 0 && n == float64(int64(n)) {
			return time.Duration(n) * time.Second
		}
	case int:
		if n >= 0 {
			return time.Duration(n) * time.Second
		}
	case int64:
		if n >= 0 {
			return time.Duration(n) * time.Second
		}
	}
	return 0
}

// Transient reports whether err is worth retrying for an idempotent call.
// Unavailable and RateLimited are transient; ErrNotFound, ErrTruncated,
// ErrNotSupported, ErrAlreadyExists, Denied, Invalid and RestoreFailed are
// not; a context cancelled by the caller is not; everything else (provider
// escape hatches, unknown errors, ErrCommandExited, WriteFailed) is, because
// unknown defaults to retry.
func Transient(err error) bool {
	if err == nil {
		return false
	}
	var (
		d *DeniedError
		i *InvalidError
		r *RestoreFailedError
		u *UnavailableError
		l *RateLimitedError
	)
	switch {
	case errors.As(err, &u), errors.As(err, &l):
		return true
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrTruncated),
		errors.Is(err, ErrNotSupported), errors.Is(err, ErrAlreadyExists),
		errors.Is(err, context.Canceled),
		errors.As(err, &d), errors.As(err, &i), errors.As(err, &r):
		return false
	}
	return true
}

// Kind names err's class in the taxonomy: "not_found", "truncated",
// "not_supported", "already_exists", "command_exited", "rate_limited",
// "unavailable", "denied", "invalid", "restore_failed", "write_failed",
// "provider", "canceled", or "unknown". CLIs print it.
func Kind(err error) string {
	var (
		d *DeniedError
		i *InvalidError
		r *RestoreFailedError
		u *UnavailableError
		l *RateLimitedError
		w *WriteFailedError
		p *ProviderError
	)
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrTruncated):
		return "truncated"
	case errors.Is(err, ErrNotSupported):
		return "not_supported"
	case errors.Is(err, ErrAlreadyExists):
		return "already_exists"
	case errors.Is(err, ErrCommandExited):
		return "command_exited"
	case errors.As(err, &l):
		return "rate_limited"
	case errors.As(err, &u):
		return "unavailable"
	case errors.As(err, &d):
		return "denied"
	case errors.As(err, &i):
		return "invalid"
	case errors.As(err, &r):
		return "restore_failed"
	case errors.As(err, &w):
		return "write_failed"
	case errors.As(err, &p):
		return "provider"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "unavailable"
	}
	return "unknown"
}
