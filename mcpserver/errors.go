package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/sandbox"
)

// The kinds a tool error carries (ToolError.Kind), each the agent's cue
// for what to do next.
const (
	KindNotFound     = "not_found"     // the sandbox, session or file is not there
	KindInvalid      = "invalid"       // the arguments are wrong: fix them
	KindLimit        = "limit"         // a bound was reached (size, count, rate, quota): smaller, fewer or later
	KindPolicy       = "policy"        // refused by policy or credentials: not retryable as is
	KindTimeout      = "timeout"       // the budget ran out
	KindNotSupported = "not_supported" // this provider cannot do it
	KindUnavailable  = "unavailable"   // transient: try again
	KindInternal     = "internal"      // anything else
)

// ToolError is the structured form of a failed tool call: the result has
// isError set, its text content is this object as JSON, and its _meta
// holds it under MetaError.
type ToolError struct {
	Kind string `json:"kind"`
	// Taxonomy is sandbox.Kind of the underlying error ("" for a refusal
	// of this server's own), Reason its reason where it has one.
	Taxonomy     string `json:"taxonomy,omitempty"`
	Reason       string `json:"reason,omitempty"`
	Message      string `json:"message"`
	RetryAfterMS int64  `json:"retry_after_ms,omitempty"`
	// Stdout and Stderr are what a command printed before it timed out.
	Stdout string `json:"stdout,omitempty"`
	Stderr string `json:"stderr,omitempty"`
}

// MetaError is the _meta key of a failed call's ToolError.
const MetaError = "managoat/error"

func (e *ToolError) Error() string { return e.Kind + ": " + e.Message }

// refuse is a refusal of this server's own.
func refuse(kind, reason, format string, args ...any) *ToolError {
	return &ToolError{Kind: kind, Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// toolError maps err (the sandbox taxonomy's, or a ToolError) to a
// ToolError with a message an agent can act on.
func toolError(err error, what string) *ToolError {
	var te *ToolError
	if errors.As(err, &te) {
		return te
	}
	e := &ToolError{Taxonomy: sandbox.Kind(err), Message: err.Error()}
	if what != "" {
		e.Message = what + ": " + e.Message
	}
	var (
		inv *sandbox.InvalidError
		den *sandbox.DeniedError
		una *sandbox.UnavailableError
		rl  *sandbox.RateLimitedError
	)
	switch {
	case sandbox.IsExecTimeout(err), errors.Is(err, context.DeadlineExceeded):
		e.Kind, e.Reason = KindTimeout, sandbox.ReasonExecTimeout
		e.Message += " (give a larger timeout_seconds, or run it with detach and follow it with session_read)"
	case errors.Is(err, sandbox.ErrNotFound):
		e.Kind = KindNotFound
	case errors.Is(err, sandbox.ErrNotSupported), errors.Is(err, sandbox.ErrUnsupported):
		e.Kind = KindNotSupported
		e.Message += " (this provider cannot do it)"
	case errors.As(err, &rl):
		e.Kind, e.RetryAfterMS = KindLimit, rl.RetryAfter.Milliseconds()
		e.Message += " (wait and try again)"
	case errors.As(err, &den):
		e.Reason = den.Reason
		e.Kind = KindPolicy
		if strings.Contains(den.Reason, "resource_exhausted") || (den.HTTP != nil && strings.Contains(den.HTTP.Body, "resource_exhausted")) {
			e.Kind = KindLimit
			e.Message += " (destroy a sandbox you no longer need)"
		}
	case errors.As(err, &inv):
		e.Reason = inv.Reason
		switch {
		case strings.Contains(inv.Reason, "too_large"), inv.Reason == "limits":
			e.Kind = KindLimit
		case inv.Reason == "capability_unavailable", inv.Reason == sandbox.ReasonProvider:
			e.Kind = KindPolicy
		default:
			e.Kind = KindInvalid
		}
	case errors.As(err, &una):
		e.Reason = una.Reason
		e.Kind = KindUnavailable
		e.Message += " (transient: try again)"
	case errors.Is(err, sandbox.ErrAlreadyExists):
		e.Kind = KindInvalid
	case errors.Is(err, context.Canceled):
		e.Kind = KindUnavailable
	default:
		e.Kind = KindInternal
	}
	return e
}

// errorResult is the isError result of e: text content holding e as JSON
// (what an agent reads) and _meta[MetaError] the same object. No
// structuredContent: clients check it against the tool's output schema
// even on an error.
func errorResult(e *ToolError) *mcp.CallToolResult {
	b, _ := json.Marshal(map[string]*ToolError{"error": e})
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: string(b)}},
		Meta: mcp.Meta{MetaError: e}}
}
