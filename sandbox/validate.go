package sandbox

import (
	"fmt"
	"time"
)

// MaxNameLen is the longest sandbox name the contract accepts, in bytes.
const MaxNameLen = 63

// ValidateName refuses a name no provider could route: empty, longer than
// 63 bytes, or with anything but ASCII letters, digits, '-', '_' and '.'
// (so no path separator, NUL, space or control byte), or starting with '.'
// or '-'. The error is an InvalidError with Reason "name".
func ValidateName(name string) error {
	switch {
	case name == "":
		return Invalid(ReasonName, "empty sandbox name")
	case len(name) > MaxNameLen:
		return Invalid(ReasonName, fmt.Sprintf("sandbox name is %d bytes, over %d", len(name), MaxNameLen))
	case name[0] == '.' || name[0] == '-':
		return Invalid(ReasonName, fmt.Sprintf("sandbox name %q starts with %q", name, name[0]))
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			continue
		}
		return Invalid(ReasonName, fmt.Sprintf("sandbox name %q has byte %q at %d; allowed: letters, digits, '-', '_', '.'", name, c, i))
	}
	return nil
}

// CheckHandle is for Provider implementations: it refuses a nil handle, a
// handle of another provider, and a handle with an invalid name, each with
// an InvalidError.
func CheckHandle(h *Handle, provider string) error {
	if h == nil {
		return Invalid(ReasonHandle, "nil handle")
	}
	if h.Provider != provider {
		return Invalid(ReasonHandle, fmt.Sprintf("handle of provider %q given to provider %q", h.Provider, provider))
	}
	return ValidateName(h.Name)
}

// CheckCommand refuses a nil command or one of another provider.
func CheckCommand(c *Command, provider string) error {
	if c == nil {
		return Invalid(ReasonHandle, "nil command")
	}
	if c.Provider != provider {
		return Invalid(ReasonHandle, fmt.Sprintf("command of provider %q given to provider %q", c.Provider, provider))
	}
	return nil
}

// validID reports whether s is 1–max bytes of [A-Za-z0-9_-]. (A regexp
// with {1,256} compiles to a 256-state program at init; this is a loop.)
func validID(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// DefaultTerminateTimeout is the stop allowance when TerminateOptions.Timeout
// is zero.
const DefaultTerminateTimeout = 10 * time.Second

// ValidateTermination is the one predicate shared by the facade and every
// SessionTerminator: the session id is 1–256 bytes of [A-Za-z0-9_-], the
// mode is graceful or force, and the timeout is between 1 ms and 30 s (zero
// means the default, 10 s). It returns the options with defaults filled in,
// or Invalid{termination_request}.
func ValidateTermination(sessionID string, opts TerminateOptions) (TerminateOptions, error) {
	bad := func(msg string) (TerminateOptions, error) {
		return opts, &InvalidError{Reason: ReasonTerminationRequest, Msg: msg}
	}
	if !validID(sessionID, 256) {
		return bad(fmt.Sprintf("session id %q must be 1-256 bytes of [A-Za-z0-9_-]", clip(sessionID, 40)))
	}
	switch opts.Mode {
	case "":
		opts.Mode = Graceful
	case Graceful, Force:
	default:
		return bad(fmt.Sprintf("mode %q is neither graceful nor force", clip(string(opts.Mode), 40)))
	}
	switch {
	case opts.Timeout == 0:
		opts.Timeout = DefaultTerminateTimeout
	case opts.Timeout < time.Millisecond || opts.Timeout > 30*time.Second:
		return bad(fmt.Sprintf("timeout %v is outside 1ms..30s", opts.Timeout))
	}
	return opts, nil
}

// ValidateSessionID refuses a session id no provider could route.
func ValidateSessionID(id string) error {
	if !validID(id, 256) {
		return Invalid("session_id", fmt.Sprintf("session id %q must be 1-256 bytes of [A-Za-z0-9_-]", clip(id, 40)))
	}
	return nil
}
