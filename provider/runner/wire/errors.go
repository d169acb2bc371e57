package wire

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// ProviderName is the provider tag of errors synthesised from the wire.
const ProviderName = "runner"

// ErrorCode maps a sandbox error to a reply's error code and detail (the
// daemon's side). Unknown errors are CodeProvider with the error text.
func ErrorCode(err error) (code, detail string) {
	var (
		inv *sandbox.InvalidError
		una *sandbox.UnavailableError
		wf  *sandbox.WriteFailedError
		den *sandbox.DeniedError
		rl  *sandbox.RateLimitedError
		rf  *sandbox.RestoreFailedError
	)
	switch {
	case errors.Is(err, sandbox.ErrNotFound):
		return CodeNotFound, ""
	case errors.Is(err, sandbox.ErrCommandExited):
		return CodeCommandExited, ""
	case errors.Is(err, sandbox.ErrNotSupported):
		return CodeNotSupported, ""
	case errors.Is(err, sandbox.ErrAlreadyExists):
		return CodeAlreadyExists, ""
	case errors.Is(err, sandbox.ErrTruncated):
		return CodeTruncated, ""
	case errors.Is(err, sandbox.ErrUnsupported):
		return CodeUnsupported, ""
	case errors.As(err, &inv):
		return CodeInvalid, joinDetail(inv.Reason, inv.Msg)
	case errors.As(err, &una):
		d := una.Reason
		switch {
		case una.Reason == sandbox.ReasonExecTimeout:
			d = joinDetail(d, strconv.FormatInt(una.Timeout.Milliseconds(), 10))
		case una.Err != nil:
			d = joinDetail(d, una.Err.Error())
		case una.HTTP != nil:
			d = joinDetail(d, una.HTTP.String())
		}
		return CodeUnavailable, d
	case errors.As(err, &wf):
		if wf.Err == nil {
			return CodeWriteFailed, ""
		}
		return CodeWriteFailed, wf.Err.Error()
	case errors.As(err, &den):
		return CodeDenied, den.Reason
	case errors.As(err, &rl):
		return CodeRateLimited, strconv.FormatInt(int64(rl.RetryAfter/time.Second), 10)
	case errors.As(err, &rf):
		return CodeRestoreFailed, rf.Detail
	case errors.Is(err, context.DeadlineExceeded):
		return CodeUnavailable, sandbox.ReasonTimeout
	}
	return CodeProvider, err.Error()
}

func joinDetail(reason, msg string) string {
	if msg == "" {
		return reason
	}
	return reason + ": " + msg
}

// splitDetail splits "reason: message" when reason is a word.
func splitDetail(d string) (reason, msg string) {
	r, m, ok := strings.Cut(d, ": ")
	if !ok {
		r, m = d, ""
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !(c >= 'a' && c <= 'z' || c == '_' || c >= '0' && c <= '9') {
			return "runner", d
		}
	}
	if r == "" {
		return "runner", d
	}
	return r, m
}

// ErrorFrom maps a failure reply's code and detail onto the sandbox error
// taxonomy (the platform's side, spec §1.6): not_found, command_exited and
// not_supported drop the detail; invalid, unavailable and write_failed keep
// it; anything else is a ProviderError{runner, code}.
func ErrorFrom(code, detail string) error {
	switch code {
	case CodeNotFound:
		return sandbox.ErrNotFound
	case CodeCommandExited:
		return sandbox.ErrCommandExited
	case CodeNotSupported:
		return sandbox.ErrNotSupported
	case CodeAlreadyExists:
		return sandbox.ErrAlreadyExists
	case CodeTruncated:
		return sandbox.ErrTruncated
	case CodeUnsupported:
		return sandbox.ErrUnsupported
	case CodeInvalid:
		r, m := splitDetail(detail)
		return &sandbox.InvalidError{Reason: r, Msg: m}
	case CodeUnavailable:
		r, m := splitDetail(detail)
		if r == sandbox.ReasonExecTimeout {
			ms, _ := strconv.ParseInt(m, 10, 64)
			return sandbox.ExecTimeout(time.Duration(ms) * time.Millisecond)
		}
		var cause error
		if m != "" {
			cause = errors.New(m)
		}
		return &sandbox.UnavailableError{Reason: r, Err: cause}
	case CodeWriteFailed:
		var cause error
		if detail != "" {
			cause = errors.New(detail)
		}
		return &sandbox.WriteFailedError{Err: cause}
	case CodeDenied:
		return &sandbox.DeniedError{Reason: detail}
	case CodeRateLimited:
		n, _ := strconv.ParseInt(detail, 10, 64)
		return &sandbox.RateLimitedError{RetryAfter: time.Duration(n) * time.Second}
	case CodeRestoreFailed:
		return &sandbox.RestoreFailedError{Detail: detail}
	}
	var cause error
	if detail != "" {
		cause = errors.New(detail)
	}
	return &sandbox.ProviderError{Provider: ProviderName, Reason: code, Err: cause}
}

// Err returns the reply's error, nil for a success reply.
func (r *Reply) Err() error {
	switch {
	case r.Malformed:
		return &sandbox.ProviderError{Provider: ProviderName, Reason: "malformed_reply", Err: errors.New(clip(string(r.Raw), 200))}
	case r.OK:
		return nil
	}
	return ErrorFrom(r.Error, r.Detail)
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
