package mechanism

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors, matched with errors.Is.
var (
	ErrNotFound              = errors.New("mechanism: sandbox not found")
	ErrExists                = errors.New("mechanism: sandbox exists with a different spec")
	ErrNotRunning            = errors.New("mechanism: sandbox not running")
	ErrInterrupted           = errors.New("mechanism: sandbox stopped under the command")
	ErrInvalid               = errors.New("mechanism: invalid input")
	ErrNotSupported          = errors.New("mechanism: not supported")
	ErrCouldNotRun           = errors.New("mechanism: could not run")
	ErrLimitExceeded         = errors.New("mechanism: limit exceeded")
	ErrCapabilityUnavailable = errors.New("mechanism: capability unavailable")
)

// InvalidError is bad input. errors.Is(err, ErrInvalid) is true.
type InvalidError struct {
	Field  string
	Reason string
}

// Invalid returns an *InvalidError.
func Invalid(field, reason string) error { return &InvalidError{Field: field, Reason: reason} }

func (e *InvalidError) Error() string {
	return "mechanism: invalid " + e.Field + ": " + e.Reason
}

// Is reports whether target is ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// CouldNotRunError says the command did not run. It is never an exit status.
// errors.Is(err, ErrCouldNotRun) is true; Err (when set) is also matched,
// e.g. ErrNotRunning, ErrNotFound, context.DeadlineExceeded.
type CouldNotRunError struct {
	Reason string
	Err    error
}

func (e *CouldNotRunError) Error() string {
	s := "mechanism: could not run: " + e.Reason
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is reports whether target is ErrCouldNotRun.
func (e *CouldNotRunError) Is(target error) bool { return target == ErrCouldNotRun }

// Unwrap returns the cause.
func (e *CouldNotRunError) Unwrap() error { return e.Err }

// CouldNotRun returns a *CouldNotRunError.
func CouldNotRun(reason string, err error) error { return &CouldNotRunError{Reason: reason, Err: err} }

// Limit names a resource limit a command can be stopped by.
type Limit string

// The limits.
const (
	LimitMemory    Limit = "memory"
	LimitPids      Limit = "pids"
	LimitCPU       Limit = "cpu"
	LimitWallClock Limit = "wall_clock"
)

// LimitExceededError says a limit the sandbox was launched under stopped the
// command, attributed from Evidence (the kernel counter that moved, or the
// budget that elapsed). errors.Is(err, ErrLimitExceeded) is true.
type LimitExceededError struct {
	Limit    Limit
	Evidence string
}

func (e *LimitExceededError) Error() string {
	s := "mechanism: limit exceeded: " + string(e.Limit)
	if e.Evidence != "" {
		s += " (" + e.Evidence + ")"
	}
	return s
}

// Is reports whether target is ErrLimitExceeded.
func (e *LimitExceededError) Is(target error) bool { return target == ErrLimitExceeded }

// UnavailableError is a capability refusal: every missing capability, each
// with the reason on this host. errors.Is(err, ErrCapabilityUnavailable).
type UnavailableError struct {
	Mechanism string
	Missing   []Report
}

func (e *UnavailableError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "mechanism %s: capability unavailable:", e.Mechanism)
	for i, r := range e.Missing {
		if i > 0 {
			b.WriteString(";")
		}
		fmt.Fprintf(&b, " %s (%s)", r.Name, r.Detail)
	}
	return b.String()
}

// Is reports whether target is ErrCapabilityUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrCapabilityUnavailable }
