// Package e2b is the sandbox.Provider for E2B (e2b.dev).
//
// E2B publishes no Go SDK, so the provider speaks both of E2B's planes
// itself: the control plane (REST with X-API-Key: create, list, kill,
// pause, connect, timeout, network) and envd, the daemon inside every
// sandbox (its process service over the Connect protocol, its files API
// over plain HTTP).
//
// # Generations of the control plane
//
// Create and connect use the current routes, POST /v2/sandboxes and POST
// /v2/sandboxes/{id}/connect (what E2B's SDK 2.x sends), with POST
// /sandboxes and POST /sandboxes/{id}/connect as the fallback for a
// service from before them (an older or self-hosted cluster). The choice
// is made once per Provider, from the service's answers: until the first
// create or connect succeeds, a 404 or 405 from the v2 route sends the
// same request to the v1 route, and the route that succeeds first is used
// from then on, without probing again. A 404 from both (an unknown
// template or sandbox, which either generation reports alike) decides
// nothing; a request that got no answer is never sent again to the other
// route. Sandboxes made through v2 are secure: envd wants the
// sandbox's envdAccessToken in X-Access-Token. The token comes from the
// create or connect answer, or, for a sandbox this Provider neither
// created nor connected, once from GET /sandboxes/{id}; it is kept only in
// the Provider (never in a Handle) and removed from every record the
// Provider hands out (Info.Raw).
//
// # Connect codec
//
// envd's process service is spoken with a small hand-written Connect JSON
// codec (connect.go: 1 flag byte, a 4-byte big-endian length, JSON; unary
// calls are plain JSON POSTs) rather than connectrpc.com/connect. That
// library needs protobuf message types generated from envd's .proto files
// (no protoc here) or a custom codec, and, more importantly, it folds HTTP
// statuses into Connect codes (429 becomes "unavailable", 404
// "unimplemented"), which would lose the contract's status table and a
// 429's Retry-After header. The surface needed is one server stream and
// four unary methods, so the codec is a hundred lines and keeps every
// status and byte visible.
//
// # Behaviour of the real service
//
// These follow E2B's public sources (spec/openapi.yml of e2b-dev/E2B and
// the API handlers of e2b-dev/infra), and package e2btest models them:
//
//   - A sandbox's envd lives at 49983-<id>.<domain>, the domain being the
//     one its create or connect answer names ("domain", set for a team on
//     its own cluster, null on the default one), else Config.Domain
//     (E2B_DOMAIN, which also makes the control plane https://api.<domain>).
//     A sandbox this process did not create or connect is looked up once
//     with GET /sandboxes/{id}.
//   - A 429 carries its wait in the Retry-After header (seconds or an
//     HTTP-date); nothing in the body is read as a hint.
//   - A 409 means the sandbox is changing state (pausing, resuming,
//     snapshotting, being killed), from the control plane and from the
//     envd proxy alike: Unavailable{sandbox_transitioning}, transient.
//     Connect, timeout, network and envd's List, ListDir, file reads and
//     file uploads (which replace a file whole) are idempotent and are
//     retried while it lasts (Config.TransitionBackoff).
//     Pause waits out a snapshot or a pause in progress and answers 409
//     when the sandbox is already paused or is being killed, so Suspend is
//     success only when the sandbox's own record (GET /sandboxes/{id})
//     says paused; otherwise it may be running and billing, and Suspend
//     says so.
//   - The listing (GET /v2/sandboxes) holds the live sandboxes that are
//     running or pausing (a pausing one shown paused) and the paused ones
//     from their snapshot records, which outlive a resume. A sandbox being
//     snapshotted or killed is in neither: it is listed paused when an
//     earlier pause left a record, else not at all. So Suspend and Get
//     take the listing's "paused" only once the record agrees (an
//     operation that needs envd connects, which waits a change out), and
//     an operation whose handle carries the sandbox's id (h.Private, set
//     by Create and Resume in this process) falls back to the record when
//     the listing shows no sandbox of the name.
//   - An unknown template is a 404 on create ("template '<id>' not found",
//     or "tag '<tag>' does not exist for template '<id>'"), a malformed
//     reference a 400 ("Invalid template reference: ..."): each is
//     Invalid{template} with E2B's message, never ErrNotFound.
//   - envd starts a command without a process group of its own and
//     SendSignal signals the pid alone (e2b-dev/infra packages/envd/
//     internal/services/process/handler), so an Exec that outlives its
//     deadline, or whose caller cancels it, is killed with its whole
//     process tree (KillTreeScript, run through envd), not just its top
//     process. The kill runs in the background, bounded by
//     Config.KillTimeout, with its outcome logged: Exec answers
//     exec_timeout, or its context's error, at once, and Close waits for
//     kills still running. A process that exits right after Exec without
//     calling Close sets Config.ExecWaitsForKill, or the kill dies with it.
//   - E2B caps every TTL at the plan's maximum instance length (Hobby: 1 h)
//     without saying so, and once it has passed refuses the heartbeat (400
//     "Max instance length exceeded"). Each heartbeat reads the sandbox's
//     endAt; a command whose stream dies at a capped end ends with
//     Unavailable{max_instance_length}, not closed_before_exit. A connect
//     of a sandbox still running past it answers the same 400, which an
//     operation reports as Unavailable{max_instance_length} too. A resume
//     starts a new instance.
//   - envd before 0.3.0 ignores Start's stdin field and before 0.5.2 has
//     no CloseStdin (E2B's SDK, envd/versions.ts). The envdVersion of the
//     listing, create and connect answers is kept per sandbox: on an older
//     envd a command without stdin is run as sh -c 'exec "$@" </dev/null'
//     (argv, environment and status its own), and CloseStdin is
//     ErrNotSupported rather than a nil that never delivers the EOF. An
//     unknown version takes the workaround.
//   - A sandbox being resumed (a connect of a paused one, from this
//     process or another) is not yet among E2B's live sandboxes: the
//     listing and its record show it paused (from its snapshot), envd
//     answers 502, and a connect joins the resume under way (the start
//     reservation; e2b-dev/infra packages/api/internal/handlers/
//     sandbox_connect.go, orchestrator/create_instance.go) and answers
//     201 once it has started, without a second resume. So Get says
//     suspended until the resume completes, and Exec and Resume (which
//     connect a sandbox listed paused) wait for that resume rather than
//     start another; the routing entry is written before the resume
//     answers (sandbox/store.go), so envd serves it from then on.
//   - The listing's metadata filter is encoded as the API decodes it
//     (the parameter, then the whole value, then each key and value). With
//     names limited to letters, digits, '.', '_' and '-' no decoding changes
//     them, so this matters only for the exact form on the wire.
//   - Create (the server answers once the VM has started from its
//     template; E2B's SDK gives every request 60 s), pause and connect
//     (which snapshot or restore a whole VM) get Config.LongRequestTimeout
//     (2 min), not the 30 s of other requests.
//
// Where the sources leave it open, or the service cannot say, the
// provider takes the safe side: a handle without an id (read back by
// another process) finds a sandbox only through the listing, so while a
// never-paused sandbox is being snapshotted it is ErrNotFound by name, and
// a Create of its name then makes a second sandbox, which operations leave
// alone once the first is listed again (the oldest stamp is canonical) and
// Destroy removes with it; an envd of unknown version gets the
// stdin workaround; a command
// stream that dies at a capped end is reported as the cap only when the
// heartbeat saw the cap; and the process-tree kill cannot find a process
// that left the tree (a daemon reparented to init). While a sandbox is
// being resumed nothing tells it from a paused one, so two things are
// left open: Suspend succeeds (pause answers "already paused" and the
// record says paused) and the sandbox then runs; and Destroy's kill finds
// no live sandbox, deletes its snapshot record and answers 204 while the
// resume goes on (sandbox_kill.go), so the sandbox may come back running,
// to be listed (ListAllNames) and destroyed again.
//
// # Identity, TTL and suspend
//
// E2B has no names: each sandbox is stamped with metadata
// fountain_name=<name>, fountain=1 and its creation time fountain_created,
// and every operation re-resolves the name through the listing (running
// and paused, every page). Create adopts a running or
// paused sandbox that carries the name; when a race made two, every racer
// converges on the canonical one (oldest by fountain_created, not by
// startedAt, which a resume resets; then smallest id): the extras of the
// race are killed, and Destroy removes every sandbox carrying the name.
// Sandboxes start with a TTL (Config.SandboxTimeout) and autoPause, so a
// missed heartbeat pauses instead of killing; every live command renews the
// TTL at once and then every Config.Heartbeat, and every operation that
// needs envd resumes (connects) a paused sandbox first, and connects a
// running one whose listed endAt is near (within two requests plus clock
// slack), so the TTL cannot pause it before the command's first
// heartbeat. Suspend is pause, Resume is connect.
//
// # Commands and sessions
//
// Exec and Spawn use envd's Start stream with exactly one terminal event:
// a stream that ends without envd's end event is Unavailable{closed_before_exit},
// never exit 0; a stream silent for Config.StallTimeout (not even a
// keepalive) is Unavailable{stream_stalled}. Spawn returns after envd's
// start event. Stdin is addressed by pid, falling back from a tag that envd
// refuses (after a pause and resume) to the pid List shows. A Detachable
// spawn runs under a journaling shim (ShimScript) that copies its output to
// /tmp/fountain/<tag>.out and .err and its status to .exit; Attach runs a
// replayer over those journals (ReplayScript), so it replays from byte zero,
// then tails, and takes the real exit code from the exit file. The session
// id is the process tag.
//
// # Where this does better than the Elixir library's adapter
//
//   - Attaching to an unknown session, or to a spawn that was not journaled,
//     is ErrNotFound instead of a replayer that waits forever (§9.10); a
//     replayer's own exit code is never reported as the session's.
//   - Spawn and attach owners receive normalized errors, not raw reasons
//     (§9.11).
//   - WriteStdin, CloseStdin and StopCommand are total on a command without
//     private state (§9.17).
//   - Tags are random, so two processes (two CLI runs) never share a tag or
//     a journal; exec processes and replayers are not listed as sessions.
//   - The shim waits for its copies before it writes the exit file, and the
//     replayer drains its journals with tail --pid instead of a grace sleep,
//     so attach loses no final bytes.
//   - A 404 from an id-addressed call is ErrNotFound only when the listing
//     agrees the sandbox is gone; an exec that outlives its deadline or is
//     cancelled is killed (SIGKILL), not left running; the first heartbeat
//     is sent when a command starts.
//
// The shim and the replayer need bash, mkfifo and GNU tail (for --pid) in
// the sandbox's template, as E2B's Debian-based templates have.
//
// Package e2btest is a fake of both planes that runs commands as real
// processes; the conformance suite runs against it.
package e2b
