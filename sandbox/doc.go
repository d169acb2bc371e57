// Package sandbox is managoat's contract for the machine an AI agent runs
// in: one Provider interface with every way to get such a machine behind it
// (hosted providers, local kernel-isolated sandboxes, a self-hosted runner).
//
// A host calls the facade, a Registry: creation-side calls take a provider
// name, everything else dispatches on the Handle's provider.
//
//	reg := sandbox.NewRegistry(fake.New())
//	h, err := reg.Create(ctx, "fake", "agent-1", sandbox.CreateOptions{})
//	res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi"}}, sandbox.ExecOptions{})
//
// The rules every provider keeps, checked by the conformance suite in
// sandbox/sandboxtest:
//
//   - Create is name-keyed and adopts an existing name; CreateNew (optional)
//     never adopts.
//   - Get returns ErrNotFound only when the sandbox is surely gone; anything
//     transient is a different error. Destroy of a gone sandbox is nil.
//   - ListAllNames is the whole view or ErrTruncated, never a partial view
//     that looks whole.
//   - Exec blocks until exit; a nonzero exit is a result, not an error. One
//     monotonic deadline bounds it and output never renews it; a timeout is
//     Unavailable{exec_timeout}.
//   - A Command's events are output, then exactly one terminal event (Exit
//     with the real code, or Error), then the channel closes. A stream that
//     closes without an exit is Unavailable{closed_before_exit}, never exit 0.
//     Stop is a local detach only, and idempotent.
//   - Attach replays a session from byte zero, then tails.
//   - NetworkPolicy{Allow: nil or []} denies all egress.
//   - A capability is advertised only where the suite observed the promise.
//
// Errors form one closed taxonomy: the sentinels ErrNotFound, ErrTruncated,
// ErrNotSupported, ErrAlreadyExists and ErrCommandExited (errors.Is), and
// the typed RateLimitedError, UnavailableError, DeniedError, InvalidError,
// RestoreFailedError, WriteFailedError and ProviderError (errors.As).
// Transient classifies them and Retry backs off for idempotent calls only,
// honouring a RateLimitedError's RetryAfter (the Elixir library ignored it).
//
// A Handle never prints its Private data: every fmt verb, JSON and slog show
// only the provider and the name (JSON adds the instance id).
package sandbox
