// Package sprites is the sandbox.Provider for Sprites (sprites.dev): each
// sandbox is a sprite, addressed by name.
//
//	p, err := sprites.NewFromEnv() // SPRITES_TOKEN, SPRITES_API_URL
//	h, err := p.Create(ctx, "agent-1", sandbox.CreateOptions{})
//	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hi"}}, sandbox.ExecOptions{})
//
// It speaks the Sprites API directly: REST with net/http, and command
// execution over the exec WebSocket (github.com/coder/websocket) with its
// byte-prefixed frames (0 stdin, 1 stdout, 2 stderr, 3 exit plus one byte,
// 4 stdin EOF) and JSON control messages. There is no maintained Go SDK
// this module can depend on, so the client is written here; it is small
// and every bounded behaviour below needs control over the transport that
// an SDK would hide anyway. The package spritestest next to it is a fake of
// the API for tests.
//
// Capabilities: suspend (a sprite parks by itself after about 30 s idle,
// so Suspend is a no-op), network_policy, attach (Sprites replays a
// session's scrollback from byte zero), tty, public_url, terminate_session,
// force_terminate_session, create_new and destroy_once; checkpoint and
// create_checkpoint_once only when Config.CheckpointCreationEnabled.
// Only detachable spawns survive their WebSocket; pass
// SpawnOptions.Detachable for a session you mean to attach to later. Such a
// spawn asks for max_run_after_disconnect=0 (forever); without it Sprites
// keeps a non-TTY process 10 s after its socket goes, and a TTY process
// forever (the exec API reference; the detachable parameter older clients
// sent is no longer documented).
//
// A session's id is the one Sprites announces in the session_info message
// that opens every exec socket (it is the process's PID): Spawn waits for
// it (at most 10 s) and sets Command.SessionID, and Attach sets the id it
// was given, as sprites-go's wsCmd.SessionID does. Nothing finds its
// session by listing, which shows a session only once its process exists.
// A socket that ends before announcing one returns a Command without an id
// whose stream says how it ended; a detachable spawn whose socket stays
// silent past the bound fails Unavailable{no_session_info}. A Spawn whose
// caller gives up first still waits (within the bound) for the id and
// terminates the process it started. An Exec past
// its deadline is terminated (SIGKILL) through its session, rather than
// left to run out the 10 s Sprites gives a non-TTY process after its
// socket closes. Two things the API reference leaves open are taken on the
// safe side: whether an attach stops the max_run_after_disconnect clock
// (a session that must outlive its client asks for forever, so it never
// matters), and whether a socket can carry output before session_info
// (output that comes first is delivered; only the id is waited for).
//
// The four bounded operations — CreateNew, DestroyOnce, TerminateSession
// and CreateCheckpointOnce — follow the contract's algorithms exactly: one
// request (two for DestroyOnce's confirming GET and the checkpoint's
// listing), no retries, no redirects, HTTP/1 only on a connection of their
// own, bounded time and bytes, and a result that is either confirmed or an
// UnavailableError naming the uncertainty (create_unconfirmed,
// delete_unconfirmed, termination_unconfirmed, checkpoint_unconfirmed, or
// a *_timeout / *_transport_failed). Provider text never reaches their
// errors. Their request runs in a goroutine with its own deadline, so it is
// torn down at that deadline even when the caller has gone; a caller whose
// context ends first gets the timeout verdict at once.
//
// Where the Elixir library's adapter (over the sprites SDK) left a shape
// un-normalised, this package does better:
//
//   - A refused exec upgrade is mapped through the HTTP table: 401/403 is
//     Denied (the Elixir adapter reported a transient provider error, so a bad
//     token was retried), 404 ErrNotFound, 429 RateLimited, 5xx Unavailable
//     (a fresh sprite's 503 stays transient), anything else Invalid.
//   - A stdin write on a socket that is gone is ErrCommandExited when the
//     command ended or was stopped, and WriteFailed otherwise (the Elixir adapter
//     returned a bare not_connected outside the taxonomy).
//   - The {"type":"port"} notification is dropped rather than delivered as
//     a non-contract event.
//   - A 400 from the network-policy endpoint is Invalid (the Elixir adapter: a
//     transient provider error).
//   - A socket that ends without an exit — a close frame or a dropped
//     connection — is always Unavailable{closed_before_exit}, never exit 0
//     and never a partial exec result; an exit already queued before the
//     close still wins.
//   - A 429's hint is read from retry_after_seconds and, failing that, from
//     a Retry-After header (the Elixir adapter ignored headers). The bounded
//     operations keep the contract's RateLimited without a hint.
//   - An ordinary response body over 8 MiB is Unavailable{body_too_large}
//     and no more of it is read; WebSocket frames are capped at 8 MiB.
//   - DestroyOnce's confirming GET gets only the time left, like the
//     checkpoint's listing (the Elixir adapter gave it the full timeout again).
//   - A listing page that says has_more without a continuation token is
//     ErrTruncated: the names so far are a part that would look whole.
//   - Attach tries the path form /exec/{id} and falls back once to ?id= on
//     a 404, so both server generations work.
//   - Config, Provider and the handles' private state never print the
//     token, under any fmt verb, JSON or slog.
//
// Options the Elixir adapter validated as keyword lists (unknown keys, wrong
// types) are Go struct fields here, so only their ranges are checked:
// timeouts 1 ms–120 s (zero takes the default), the checkpoint operation id
// ^[A-Za-z0-9_-]{1,128}$, and the termination request per
// sandbox.ValidateTermination. All are checked before any request.
package sprites
