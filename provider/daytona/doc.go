// Package daytona is the sandbox.Provider for Daytona — the hosted service
// or a self-hosted installation (Config.APIURL, or DAYTONA_API_URL). It
// speaks Daytona's REST API directly: the control plane for sandboxes, and
// each sandbox's toolbox (the in-sandbox API, reached through the account's
// toolbox proxy) for commands, sessions and files. Daytona's Go SDK is not
// served by this project's module proxy, so the client is hand-written; it
// is small (JSON over net/http).
//
// Start with New (a Config) or NewFromEnv (DAYTONA_API_KEY, DAYTONA_API_URL,
// DAYTONA_SNAPSHOT, DAYTONA_DOMAIN_ALLOWLIST_ENFORCED). daytonatest is a
// fake of both APIs that runs real processes, for tests.
//
// # How the contract maps onto Daytona
//
//   - Sandboxes are addressed by name. Create posts the name with the label
//     managoat=1 (ListAllNames lists by that label), no auto-stop and no
//     auto-delete, and a 7-day auto-archive; a 400 or 409 is probed by name
//     and an existing sandbox adopted; when the probe finds nothing the
//     original error is returned (an unregistered snapshot is Invalid).
//     Names the API refuses ("www." anywhere) or routes elsewhere
//     ("paginated", "for-runner") are Invalid before any request.
//   - Create and start get at least 60 s: the API holds them up to 30 s
//     while the sandbox starts (apps/api sandbox.controller.ts).
//   - Destroy: a 409 means a state change is in progress and nothing was
//     deleted (sandbox.service.ts destroy), so it waits and deletes again.
//     A deleted sandbox is renamed DESTROYED_<name>_<ms> with desiredState
//     destroyed at once and stays listed, in its former state until the
//     runner begins, then "destroying" (sandbox.entity.ts,
//     getSoftDeleteUpdate; the list leaves out only state destroyed):
//     ListAllNames and Get skip a record with desiredState destroyed or
//     state destroying or destroyed.
//   - Suspend is stop and Resume is start: the disk is kept; an archived
//     sandbox is still startable (slower). A 409 from start (mid-transition)
//     is Unavailable.
//   - Every operation that needs the toolbox first ensures the sandbox is
//     started (§6.3.3 of the contract spec), waiting out the passing
//     states resizing, snapshotting, forking and unknown. The toolbox proxy
//     URL is per region, and cached per region.
//   - Exec is one /process/execute, whose timeout field is the budget in
//     whole seconds (the daemon kills the process group and answers 408,
//     apps/daemon pkg/toolbox/process/execute.go); the HTTP request gets
//     that plus 10 s rather than Config.Timeout, and without a budget or a
//     deadline none but the caller's context. Spawn creates a toolbox session
//     (managoat-<random hex>) and runs the command in it asynchronously
//     under a shim that sends the command's stdout and stderr into files of
//     its own (<ShimDir>/<session>.out and .err) and its status into a
//     sentinel. A LogStream reads those files by offset, with the shim's
//     liveness and sentinel, in one /process/execute per poll, and replays
//     from byte zero — which is also all Attach needs; every spawn is
//     therefore detachable. The files, not the daemon's log of the session
//     command, because the daemon labels that log line by line with a shell
//     read loop (daemon pkg/session/execute.go): a partial line (a prompt)
//     would show only when its newline comes, the last line would gain a
//     newline, and NUL bytes would be lost. Each stream is byte-exact; the
//     order between stdout and stderr is kept only to within one poll.
//   - A finished spawn's toolbox session is deleted once its output is
//     drained (each session holds a shell in the sandbox); ListSessions and
//     Attach go on finding it through the shim's files. Deleting the
//     session ends its process group (daemon pkg/session/delete.go): a
//     process the command left running in the background ends with it.
//     A LogStream that sees the end deletes it; so does ListSessions for a
//     finished command nobody watched to its end. Replay lasts as long as
//     the shim's files do (ShimDir, under the sandbox's TMPDIR by default).
//   - A session left by an older shim, without those files, is attached
//     through the daemon's log, read with X-Daytona-Split-Output: true —
//     without it the daemon strips the stdout/stderr markers and stderr
//     would arrive as stdout (daemon pkg/session/common.go,
//     IsCombinedOutput).
//   - Stdin is a FIFO fed by `tail -f` of a file that WriteStdin appends
//     to; CloseStdin is a real EOF. The exit code comes from the shim's
//     sentinel file; the daemon's command record decides only for a shim
//     that never ran (and, for an older shim's session, when it has one).
//   - ApplyNetworkPolicy: Allow: [] sets networkBlockAll (deny all). An
//     allow-list is sent as domainAllowList alone (block-all takes
//     precedence on the runner), its echo checked, and block-all lifted
//     only afterwards. The public-source runner (v0.190.0) ignores
//     domainAllowList (apps/runner pkg/docker/network.go), so a non-empty
//     list is refused with Invalid unless the installation is the hosted
//     service — whose private runners are documented to enforce it
//     (https://www.daytona.io/docs/network-limits/) — or
//     Config.DomainAllowListEnforced (or DAYTONA_DOMAIN_ALLOWLIST_ENFORCED=1)
//     is set. The hosted service refuses sandbox-level lists for
//     organizations on tiers 1 and 2 with a 400, which is Invalid.
//   - PublicURL is ErrUnsupported; checkpoints are ErrNotSupported.
//
// Errors follow the contract's HTTP table: 404 ErrNotFound, 401/403
// Denied, 429 RateLimited, ≥500 Unavailable, anything else Invalid. A 429's
// wait is the longest of its Retry-After-<throttler> headers (one per named
// throttler that refused: authenticated, sandbox-create, sandbox-lifecycle),
// else Retry-After, else a retryAfter body field. The toolbox proxy checks
// the bearer's access to the sandbox first and answers 401 for one that no
// longer exists (apps/proxy pkg/proxy/auth.go): a toolbox 401, 403 or 404
// in Exec, Spawn, ListSessions, Attach, WriteFile, ReadFile, WriteStdin,
// CloseStdin or a command's output stream (a Command carries its sandbox's
// name from Spawn or Attach) is confirmed with a GET by name and is
// ErrNotFound when the sandbox is gone — WriteStdin and CloseStdin return
// it, the stream ends with it at once instead of
// Unavailable{log_stream_unreachable} after its tolerated failures — and
// the original error otherwise (WriteFailed for WriteStdin). WriteFile's
// 404 of a sandbox that exists is a ProviderError (upload_route_not_found:
// a daemon without that route), never ErrNotFound.
//
// WriteFile uploads at POST /files/upload-v2, the current service's
// single-file route (the only one the 0.218 toolbox client defines); the
// public daemon at v0.190.0 has only POST /files/upload. Until an upload
// has succeeded, a 404 or 405 from upload-v2 makes WriteFile try
// /files/upload at once, and the route that worked is kept for the
// Provider's life: the choice is made once per provider, not per call,
// and a later 404 of the known route is read as above, not as a reason to
// switch.
//
// # What the public sources do not settle
//
// The facts above come from Daytona's public release v0.190.0 (apps/api,
// apps/daemon, apps/runner). The hosted service runs private builds; where
// they may differ this package takes the safe side:
//
//   - Domain allow-lists: refused unless enforced (see ApplyNetworkPolicy
//     above); the hosted runners' enforcement is taken from the hosted
//     documentation, not from source.
//   - /process/execute: v0.190.0 runs the command through the sandbox's
//     shell; older daemons split it on spaces. The envelope survives both.
//   - Long requests: /process/execute is held for as long as the command
//     runs (its budget plus 10 s here). The public toolbox proxy sets no
//     write timeout (apps/proxy, libs/common-go/pkg/proxy/server_config.go:
//     idle and read-header timeouts only); whether the hosted front end cuts
//     long requests of its own is not in the public sources.
//   - Session command records: v0.190.0 reads the exit code from the
//     wrapper's file; a hosted daemon was measured without it (v0.204.0).
//     The shim's own sentinel decides either way.
//
// # Where this does better than the Elixir library's adapter
//
//   - Command lines travel base64-encoded inside a fixed envelope, because
//     older daemons' /process/execute does not run a shell (it splits on
//     spaces, quotes toggle, no escapes; v0.190.0 pipes the command into
//     the shell) and JSON mangles non-UTF-8 bytes: quotes, newlines
//     and arbitrary bytes reach the process intact. Exec output comes back
//     base64-encoded too, so every byte survives, and StderrToStdout is
//     honoured (the Elixir adapter always merged stderr). Env and Dir are applied
//     once, not twice.
//   - The shims' paths default to "${TMPDIR:-/tmp}/managoat" (configurable
//     with Config.ShimDir) and their session tags are random, so two
//     processes never pick the same tag.
//   - CloseStdin never loses a write that came before it: where tail has
//     --pid (GNU), the tail follows a holder process and the close kills the
//     holder, so tail drains the file before the EOF. A close that races
//     the shim's start is not lost either. A toolbox failure during close is
//     returned (the Elixir adapter answered Ok, leaving the command waiting for an
//     EOF that never came).
//   - WriteStdin chunks large writes (one argument is capped at 128 KiB)
//     and refuses a command spawned without stdin instead of writing into a
//     file nobody reads.
//   - The LogStream polls adaptively (Config.PollMin after new output,
//     backing off to Config.PollMax), reads only new bytes (by offset, at
//     most 512 KiB a stream a poll) and delivers a verdict only from a read
//     that saw it together with the output's end. A shim that died without
//     writing its sentinel ends the stream with ClosedBeforeExit instead of
//     polling forever. (For an older shim's session, read through the
//     daemon's log, a cut or short final read cannot drop the tail: the log
//     is read until two reads agree.)
//   - A sandbox in the error or build_failed state is reported by Get as
//     StatusUnknown with its body, and is never adopted or used as healthy:
//     Create and the toolbox operations return a ProviderError naming the
//     state and Daytona's errorReason.
//   - ensure-started waits (up to Config.StartTimeout) for the sandbox to
//     report "started" after a start, and for a stopping one to stop before
//     starting it; the Elixir adapter returned at once and the next toolbox call
//     failed. Destroy waits until the sandbox is gone, so Get answers
//     ErrNotFound right after it.
//   - Operations on a Command without daytona state are total: WriteStdin
//     and CloseStdin return Invalid, StopCommand nil (the Elixir adapter crashed).
//   - ListAllNames does not follow a "cursor" that merely echoes the one
//     sent (the Elixir adapter paged on it until it truncated).
//   - WriteFile honours Mode with a chmod after the upload; ReadFile is
//     provided (sandbox.FileReader).
//
// Limits in CreateOptions are refused with Invalid: Daytona applies none of
// them per sandbox here, and a limit is never silently dropped.
package daytona
