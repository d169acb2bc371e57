package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/managoat/managoat/sandbox"
)

// Sandbox is a sandbox as the API shows it.
type Sandbox struct {
	Name         string            `json:"name"`
	Provider     string            `json:"provider"`
	State        string            `json:"state"`            // the record's: creating, running, suspended, parking, parked, unknown
	Status       string            `json:"status,omitempty"` // the provider's, on a single get: running, suspended, unknown
	URL          string            `json:"url,omitempty"`    // only where the provider has a real one (or the platform proxies one)
	InstanceID   string            `json:"instance_id,omitempty"`
	Limits       *Limits           `json:"limits,omitempty"`
	CreatedAt    time.Time         `json:"created_at"`
	LastActivity time.Time         `json:"last_activity_at"`
	ParkedAt     *time.Time        `json:"parked_at,omitempty"`
	ParkedBy     string            `json:"parked_by,omitempty"` // suspend or destroy
	Image        string            `json:"image,omitempty"`     // the OCI image it was created from
	Labels       map[string]string `json:"labels,omitempty"`    // its user's key=value pairs
	Capabilities []string          `json:"capabilities,omitempty"`
	Raw          json.RawMessage   `json:"raw,omitempty"`
}

// Limits are a create's resource limits.
type Limits struct {
	MemoryBytes int64 `json:"memory_bytes,omitempty"`
	Pids        int   `json:"pids,omitempty"`
	CPUMillis   int   `json:"cpu_millis,omitempty"`
	WallClockMS int64 `json:"wall_clock_ms,omitempty"`
	DiskBytes   int64 `json:"disk_bytes,omitempty"`
}

// ToSandbox converts to the contract's Limits.
func (l *Limits) ToSandbox() sandbox.Limits {
	if l == nil {
		return sandbox.Limits{}
	}
	return sandbox.Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUMillis: l.CPUMillis, WallClock: time.Duration(l.WallClockMS) * time.Millisecond,
		DiskBytes: l.DiskBytes}
}

// validate refuses a negative limit, naming its field (limits.pids).
func (l *Limits) validate() error {
	if l == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    int64
	}{{"memory_bytes", l.MemoryBytes}, {"pids", int64(l.Pids)}, {"cpu_millis", int64(l.CPUMillis)}, {"wall_clock_ms", l.WallClockMS}, {"disk_bytes", l.DiskBytes}} {
		if f.v < 0 {
			return fieldErr("limits."+f.name, sandbox.Invalid("limits", fmt.Sprintf("limits.%s is negative (%d): a limit is 0 (none) or more", f.name, f.v)))
		}
	}
	return nil
}

// fieldErr names the request field an Invalid error is about (the
// answer's "field"), keeping its kind and reason; any other error is
// returned as it is.
func fieldErr(field string, err error) error {
	var iv *sandbox.InvalidError
	if !errors.As(err, &iv) {
		return err
	}
	_, e := ErrorOf(err)
	e.Field = field
	if !strings.Contains(e.Message, field) {
		// After the contract's "sandbox: invalid REASON: ", so that the
		// Go client's error reads as the provider's would.
		p := "sandbox: invalid " + e.Reason + ": "
		rest, _ := strings.CutPrefix(e.Message, p)
		e.Message = p + field + ": " + rest
	}
	return &apiError{http.StatusBadRequest, e}
}

// FromLimits converts from the contract's Limits; nil for none. A wall
// clock is rounded up to a whole millisecond (one under a millisecond
// would otherwise become no limit at all).
func FromLimits(l sandbox.Limits) *Limits {
	if l == (sandbox.Limits{}) {
		return nil
	}
	wc := (l.WallClock + time.Millisecond - 1) / time.Millisecond
	return &Limits{MemoryBytes: l.MemoryBytes, Pids: l.Pids, CPUMillis: l.CPUMillis, WallClockMS: int64(wc), DiskBytes: l.DiskBytes}
}

// CreateRequest is POST /v1/sandboxes.
type CreateRequest struct {
	Name     string  `json:"name"`
	Provider string  `json:"provider,omitempty"` // pin; "" takes the platform's default
	Limits   *Limits `json:"limits,omitempty"`
	// CreateNew asks for one creation attempt that never adopts.
	CreateNew bool  `json:"create_new,omitempty"`
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Publish are ports of the sandbox the platform proxies, at
	// /v1/sandboxes/{name}/ports/{port}/ (a provider that publishes:
	// local); url is the first's.
	Publish []int `json:"publish,omitempty"`
	// RunnerSelector and PreferLastRunner place a sandbox of the runner
	// provider (fleet.go): a label selector ("gpu=h100", "zone in
	// (eu,us)"), and the runner of the account's latest sandbox first
	// when it fits.
	RunnerSelector   string `json:"runner_selector,omitempty"`
	PreferLastRunner bool   `json:"prefer_last_runner,omitempty"`
	// Image is an OCI image reference the sandbox runs on, on a provider
	// that runs images (local); any other refuses it. A wake from a park
	// by destroy creates it from the same image.
	Image string `json:"image,omitempty"`
	// Labels are key=value pairs kept with the record (at most MaxLabels,
	// keys of 1 to MaxLabelKey bytes of letters, digits and "._-/",
	// values of at most MaxLabelValue bytes); GET /v1/sandboxes?label=k=v
	// lists the records that have them.
	Labels map[string]string `json:"labels,omitempty"`
}

// Bounds of a create's labels.
const (
	MaxLabels     = 32
	MaxLabelKey   = 63
	MaxLabelValue = 256
	maxImageRef   = 512
)

// ValidateLabels refuses labels past the bounds, naming the label.
func ValidateLabels(l map[string]string) error {
	if len(l) > MaxLabels {
		return fieldErr("labels", sandbox.Invalid("labels", fmt.Sprintf("labels: %d labels, at most %d", len(l), MaxLabels)))
	}
	for k, v := range l {
		if err := labelKey(k); err != nil {
			return fieldErr("labels", sandbox.Invalid("labels", "labels: "+err.Error()))
		}
		if len(v) > MaxLabelValue || !utf8.ValidString(v) {
			return fieldErr("labels", sandbox.Invalid("labels", fmt.Sprintf("labels: the value of %q is %d bytes or not UTF-8; at most %d bytes of UTF-8", k, len(v), MaxLabelValue)))
		}
	}
	return nil
}

func labelKey(k string) error {
	if k == "" || len(k) > MaxLabelKey {
		return fmt.Errorf("key %q is %d bytes; 1 to %d", k, len(k), MaxLabelKey)
	}
	for _, c := range []byte(k) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' || c == '/') {
			return fmt.Errorf("key %q has %q; letters, digits and ._-/ only", k, c)
		}
	}
	return nil
}

// validateImage refuses an image reference no registry could name.
func validateImage(ref string) error {
	if len(ref) > maxImageRef || strings.ContainsFunc(ref, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fieldErr("image", sandbox.Invalid("image", fmt.Sprintf("image: %q is not an image reference (at most %d bytes, no spaces or control characters)", ref, maxImageRef)))
	}
	return nil
}

// ExecRequest is POST /v1/sandboxes/{name}/exec.
type ExecRequest struct {
	Cmd            string   `json:"cmd"`
	Args           []string `json:"args,omitempty"`
	Env            []string `json:"env,omitempty"`
	Dir            string   `json:"dir,omitempty"`
	TimeoutMS      int64    `json:"timeout_ms,omitempty"`
	StderrToStdout bool     `json:"stderr_to_stdout,omitempty"`
	MaxOutput      int      `json:"max_output,omitempty"`
}

// ExecResult is exec's answer.
type ExecResult struct {
	Output    []byte `json:"output"` // base64 in JSON
	ExitCode  int    `json:"exit_code"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Session is one entry of GET /v1/sandboxes/{name}/sessions.
type Session struct {
	ID             string     `json:"id"`
	Command        string     `json:"command,omitempty"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	LastActivityAt *time.Time `json:"last_activity_at,omitempty"`
	TTY            bool       `json:"tty,omitempty"`
	// State is running, exited or lost, absent where the provider does not
	// say (sandbox.Session.State).
	State string `json:"state,omitempty"`
	// ExitCode is an exited session's exit code (state exited).
	ExitCode *int `json:"exit_code,omitempty"`
}

// TerminateRequest is POST .../sessions/{id}/terminate.
type TerminateRequest struct {
	Mode      string `json:"mode,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// PolicyRequest is PUT .../network-policy. Allow empty or absent denies all egress.
type PolicyRequest struct {
	Allow []string `json:"allow"`
}

// CheckpointRequest is POST .../checkpoints.
type CheckpointRequest struct {
	Comment     string `json:"comment,omitempty"`
	OperationID string `json:"operation_id,omitempty"` // bounded, once
	TimeoutMS   int64  `json:"timeout_ms,omitempty"`
}

// ProviderInfo is one entry of GET /v1/providers.
type ProviderInfo struct {
	Name         string   `json:"name"`
	Enabled      bool     `json:"enabled"`
	Default      bool     `json:"default,omitempty"`
	Capabilities []string `json:"capabilities,omitempty"`
	Why          string   `json:"why_disabled,omitempty"`
}

// StreamStart is the first message a client sends on the stream socket.
type StreamStart struct {
	Op         string   `json:"op"` // spawn or attach
	Cmd        string   `json:"cmd,omitempty"`
	Args       []string `json:"args,omitempty"`
	Env        []string `json:"env,omitempty"`
	Dir        string   `json:"dir,omitempty"`
	Stdin      bool     `json:"stdin,omitempty"`
	TTY        bool     `json:"tty,omitempty"`
	Rows       int      `json:"rows,omitempty"`
	Cols       int      `json:"cols,omitempty"`
	Detachable bool     `json:"detachable,omitempty"`
	SessionID  string   `json:"session_id,omitempty"`
	// Offset is an attach's resume point: the number of output bytes
	// (stdout and stderr together, in the order the session's journal
	// replays them) the client already has. The server skips them as it
	// reads the journal from byte zero, holding none of them, and says so
	// in started's offset; output past the offset follows as usual. 0
	// replays everything; a spawn takes none.
	Offset int64 `json:"offset,omitempty"`
}

// StreamMsg is every text message of the stream after the start: the
// server's started, exit, error and stdin acknowledgements; the client's
// stdin, stdin_close and signal (Signal, a Linux signal number, sent to
// the command's process group: a CLI's Ctrl-C). Output travels as binary
// messages: one byte (1 stdout, 2 stderr) then the bytes.
type StreamMsg struct {
	Type      string `json:"type"`
	ID        int64  `json:"id,omitempty"`
	SessionID string `json:"session_id,omitempty"`
	Code      *int   `json:"code,omitempty"`
	Data      []byte `json:"data,omitempty"`
	Signal    int    `json:"signal,omitempty"`
	// Rows and Cols are a resize's new window size (a command spawned
	// with tty; not_supported where the provider cannot resize).
	Rows int `json:"rows,omitempty"`
	Cols int `json:"cols,omitempty"`
	// Offset, on started, is the attach's offset the server skips (a
	// server that predates offsets leaves it out, and replays from 0).
	Offset int64  `json:"offset,omitempty"`
	Error  *Error `json:"error,omitempty"`
}

// Stream message types and output tags.
const (
	MsgStarted    = "started"
	MsgExit       = "exit"
	MsgError      = "error"
	MsgStdin      = "stdin"
	MsgStdinClose = "stdin_close"
	MsgSignal     = "signal"
	MsgResize     = "resize"
	MsgAck        = "ack"

	TagStdout byte = 1
	TagStderr byte = 2
)

// Error is the body of every error answer, {"error": {...}}: the sandbox
// taxonomy's kind, its reason, and a message that never carries a key.
type Error struct {
	Kind         string `json:"kind"`
	Reason       string `json:"reason,omitempty"`
	Field        string `json:"field,omitempty"`
	Message      string `json:"message"`
	TimeoutMS    int64  `json:"timeout_ms,omitempty"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	HTTPStatus   int    `json:"http_status,omitempty"` // the provider's, when the error came from one
}

type errorBody struct {
	Error *Error `json:"error"`
}

// kinds the API adds to the taxonomy's.
const (
	KindUnauthorized = "unauthorized"
	KindTooLarge     = "too_large"
	KindNotAllowed   = "method_not_allowed"
)

// ErrorOf describes err for the wire, and the HTTP status it is answered with.
func ErrorOf(err error) (int, *Error) {
	e := &Error{Kind: sandbox.Kind(err), Message: err.Error()}
	var (
		iv *sandbox.InvalidError
		un *sandbox.UnavailableError
		dn *sandbox.DeniedError
		rl *sandbox.RateLimitedError
		pe *sandbox.ProviderError
		ae *apiError
	)
	switch {
	case errors.As(err, &ae):
		return ae.status, ae.e
	case errors.As(err, &iv):
		e.Reason = iv.Reason
		if iv.HTTP != nil {
			e.HTTPStatus = iv.HTTP.Status
		}
	case errors.As(err, &un):
		e.Reason, e.TimeoutMS = un.Reason, un.Timeout.Milliseconds()
		if un.HTTP != nil {
			e.HTTPStatus = un.HTTP.Status
		}
	case errors.As(err, &dn):
		e.Reason = dn.Reason
	case errors.As(err, &rl):
		e.RetryAfterMS = rl.RetryAfter.Milliseconds()
	case errors.As(err, &pe):
		e.Reason = pe.Reason
	}
	status := http.StatusBadGateway
	switch e.Kind {
	case "not_found":
		status = http.StatusNotFound
	case "invalid":
		status = http.StatusBadRequest
	case "denied":
		status = http.StatusForbidden
	case "already_exists", "command_exited":
		status = http.StatusConflict
	case "not_supported", "unsupported":
		status = http.StatusNotImplemented
	case "rate_limited":
		status = http.StatusTooManyRequests
	case "unavailable", "canceled":
		status = http.StatusServiceUnavailable
	case "restore_failed":
		status = http.StatusUnprocessableEntity
	}
	return status, e
}

// apiError is an error of the API itself (auth, limits, bad JSON).
type apiError struct {
	status int
	e      *Error
}

func (a *apiError) Error() string { return a.e.Message }

// Err turns a wire error back into the sandbox taxonomy: what the
// provider behind the platform answered is what the client sees.
func (e *Error) Err() error {
	if e == nil {
		return nil
	}
	var detail *sandbox.HTTPDetail
	if e.HTTPStatus != 0 {
		detail = &sandbox.HTTPDetail{Status: e.HTTPStatus}
	}
	msg := e.Message
	switch e.Kind {
	case "not_found":
		return sandbox.ErrNotFound
	case "truncated":
		return sandbox.ErrTruncated
	case "not_supported":
		return sandbox.ErrNotSupported
	case "already_exists":
		return sandbox.ErrAlreadyExists
	case "command_exited":
		return sandbox.ErrCommandExited
	case "unsupported":
		return sandbox.ErrUnsupported
	case "rate_limited":
		return &sandbox.RateLimitedError{RetryAfter: time.Duration(e.RetryAfterMS) * time.Millisecond}
	case "unavailable", "canceled":
		r := e.Reason
		if r == "" {
			r = "platform"
		}
		return &sandbox.UnavailableError{Reason: r, HTTP: detail, Timeout: time.Duration(e.TimeoutMS) * time.Millisecond, Err: remote(r, msg)}
	case "denied", KindUnauthorized:
		r := e.Reason
		if r == "" {
			r = e.Kind
		}
		return &sandbox.DeniedError{Reason: r + ": " + strings.TrimPrefix(msg, "sandbox: denied: "), HTTP: detail}
	case "invalid", KindTooLarge, KindNotAllowed:
		r := e.Reason
		if r == "" {
			r = e.Kind
		}
		return &sandbox.InvalidError{Reason: r, Msg: strings.TrimPrefix(msg, "sandbox: invalid "+r+": "), HTTP: detail}
	case "restore_failed":
		return &sandbox.RestoreFailedError{Detail: msg}
	case "write_failed":
		return &sandbox.WriteFailedError{Err: errors.New(msg)}
	}
	return &sandbox.ProviderError{Provider: "platform", Reason: e.Kind + ":" + e.Reason, Err: errors.New(msg)}
}

// remote carries the platform's message unless it only repeats the reason.
func remote(reason, msg string) error {
	if msg == "" || msg == "sandbox: unavailable: "+reason {
		return nil
	}
	return errors.New("platform: " + msg)
}

// RetryAfterHeader renders a Retry-After value in whole seconds, at least 1.
func RetryAfterHeader(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	if s < 1 {
		s = 1
	}
	return strconv.FormatInt(s, 10)
}

// DecodeError reads an error answer; a body that is not one is described
// by its status.
func DecodeError(status int, body []byte, retryAfter string) error {
	var b errorBody
	if json.Unmarshal(body, &b) == nil && b.Error != nil && b.Error.Kind != "" {
		if b.Error.Kind == "rate_limited" && b.Error.RetryAfterMS == 0 {
			if s, err := strconv.Atoi(retryAfter); err == nil {
				b.Error.RetryAfterMS = int64(s) * 1000
			}
		}
		return b.Error.Err()
	}
	ra := time.Duration(0)
	if s, err := strconv.Atoi(retryAfter); err == nil {
		ra = time.Duration(s) * time.Second
	}
	return fmt.Errorf("platform: %w", sandbox.FromHTTPStatus(status, "", ra))
}
