// Package runner is the platform end of the self-hosted runner: a daemon on
// a user's machine (package github.com/managoat/managoat/runner) dials out to
// the platform over one WebSocket, and the platform turns sandbox operations
// into requests over that socket. The wire format is package wire.
//
// The pieces, and the one-line calls a host makes:
//
//		srv := runner.NewServer(runner.ServerConfig{Auth: runner.StaticToken(tok)}) // http.Handler + Caller
//		mux.Handle("/api/runners", srv); mux.Handle("/api/runners/", srv)
//		p := srv.Provider()                                  // the sandbox.Provider "runner", in-process
//		p := runner.NewProvider(runner.NewClient(url, tok), runner.ProviderOptions{}) // from another process
//
//	  - Server serves GET /api/runners/ws (the daemon's socket), GET
//	    /api/runners (the online runners, JSON) and GET /api/runners/proxy (the
//	    proxy a CLI process uses). For the daemon's socket it checks, in the
//	    original's order, the Bearer key (an Authenticator: 401, 403), whether
//	    runners are disabled (404), the Upgrade header (400), the identity in
//	    the query string (400), and registers with the Host before upgrading
//	    (409 for a second connection), so every refusal is an HTTP status.
//	  - Conn is one runner's socket: Call multiplexes requests by id (from 1
//	    per connection; id 0 is the fire-and-forget detach), installs a
//	    spawn's or attach's subscription before the reply reaches the caller,
//	    fans replayed frames out to their requester only and live frames to
//	    every subscriber, and sends detach only when the session's last local
//	    listener leaves. When the socket closes every waiting call gets
//	    Unavailable{runner_disconnected} and every subscriber an Error event
//	    of the same, never an exit. Close codes: 1003 for a non-JSON frame
//	    or a binary one on a connection without wire.CapBinaryStream, 1007
//	    for a malformed binary stream frame, 1009 for one over
//	    wire.MaxBinaryFrame, 4404 for a runner deleted by the host (LocalHost.Delete), 4409
//	    for a duplicate (Conn.Close). It pings every HeartbeatInterval (20 s,
//	    also calling Host.Heartbeat) and closes a socket idle for IdleTimeout
//	    (120 s); both are configurable.
//	  - Host (register, unregister, whereis, online, heartbeat, presence) is
//	    what the application provides; LocalHost is the single-process one.
//	  - Names: For mints runner-<32 hex>-<8 hex> on a runner id; Parse reads
//	    the id back. Provider "runner" routes every call by the name.
//	  - Client reaches runners from another process through the platform's
//	    proxy: the same protocol, with the platform relaying each request to
//	    the runner its name carries and tagging each forwarded frame with the
//	    client's request id. It is how `managoat --provider runner` works
//	    against a `managoat serve`.
//
// The output path. A byte a sandboxed command writes on a runner takes
// one path to every client, with one record of it, the supervisor's
// journal on the runner's disk:
//
//  1. provider/local/supervisor (pump.go) moves the command's pipe into
//     the session's journal (package provider/local/journal) with
//     splice(2): a record [kind][length][data] per batch the pipe held.
//  2. provider/local's Command follows the journal from disk
//     (supervisor.Client.Follow) into a sandbox.Stream, as fast as its
//     reader takes it; a follower far behind holds the command (the
//     supervisor stops reading its pipes), it is never cut off.
//  3. The runner daemon (package runner, sessions.go) reads that Command,
//     keeps at most 8 MiB of it for replays while a listener is attached,
//     and writes each chunk (at most wire.MaxChunk) as a stream frame:
//     a binary frame of the raw bytes (wire.AppendBinaryStream) where
//     both ends negotiated wire.CapBinaryStream in the handshake (the
//     daemon reports it, the platform takes it in the upgrade's
//     wire.HeaderAccept, unless ServerConfig.TextStreamsOnly), else JSON
//     text with the data in base64 (wire.AppendStream), as with
//     Fountain's daemon or platform.
//  4. Here, Conn reads the frame (wire.DecodeBinaryStream, bounded, or
//     wire.Decode), routes it to the
//     session's subscriptions (live) or its requester's (replay_for), and
//     a Subscription feeds its Command's sandbox.Stream; the reader that
//     falls behind resumes by offset (above), from the daemon's replay,
//     which reads the supervisor's journal again.
//  5. platform/api serves the Command's events to its clients, and the Go
//     client (platform/client) reads them.
//
// What is not one path yet (issue 31): the daemon's own 8 MiB replay
// buffer is a second copy; the provider's Attach replays from byte zero
// (sandbox.AttachOptions has no offset), so an attach at an offset still
// reads the bytes before it from the journal on the runner's host.
//
// Offline, disconnected and timed out are all Unavailable (runner_offline,
// runner_disconnected, runner_timeout): transient, so a switched-off
// machine's sandbox is never taken for gone.
//
// Where this end does better than Fountain's platform:
//   - A replayed exit ends only its requester's subscription; Fountain's platform
//     dropped every subscription of the session, stranding a concurrent
//     attacher whose own replay had not arrived yet. A live exit ends all.
//   - A caller that gives up (timeout, cancel) leaves no subscription behind:
//     a late spawn or attach reply installs nothing and the daemon is told
//     to detach; Fountain's platform installed it for a caller that was gone.
//   - An exit frame whose code is not an integer is a ProviderError
//     {malformed_exit}, never read as exit 0.
//   - The runner id is kept, so a runner keeps routing its sandboxes
//     across reconnects, a platform restart and a forget (Fountain's platform
//     minted a new id and orphaned them), and it is not derivable: an
//     enrolment (Enroll, RunnerFile) makes it at random and keeps it with
//     the credential, across rotations; a RunnerIdentifier names it at each
//     connection (the platform's records do, platform/api.RunnerAuth), and
//     only without one is it StableID of the account and name.
//   - A runner's metadata is its application's (ServerConfig.Meta, Info.Meta):
//     opaque here, returned untouched by Online, Presence and the list.
//   - A Server given no Host warns that it runs as a single node.
//   - The daemon's capabilities travel in the handshake (caps), so
//     network_policy and terminate_session are advertised when the runner's
//     provider offers them (Fountain's platform could not, ADR 0036).
//   - Replies may carry the rest of the sandbox taxonomy (already_exists,
//     truncated, denied, rate_limited, restore_failed), and a terminal
//     "error" stream frame carries a transport failure behind the daemon
//     (closed_before_exit) instead of a made-up exit.
//   - A slow reader loses nothing and holds up nobody: one socket carries
//     every session of a runner, so a Command's reader that has more than
//     half its Stream's bound (sandbox.StreamLimit) queued is not fed
//     further; its subscription is dropped, and once the reader has
//     drained, the Command attaches again and resumes at the output offset
//     it reached: a daemon that reports attach_offset (wire.CapAttachOffset)
//     is asked to start there and drops the bytes before it itself; from
//     one without (Fountain's) the replay comes from byte zero and the
//     bytes before the offset are dropped here. Either way they are checked
//     against the checksum of what was delivered: a replay that differs,
//     as when the journal's cap dropped output the reader had not read, is
//     Unavailable{replay_mismatch}, never misplaced bytes. Fountain's platform dropped nothing and queued
//     without bound; the Stream's own rule would cut the reader off
//     (slow_reader).
//   - ListSessions gives each session its state: the daemon's "state"
//     extension field, else (Fountain's daemon) exited with its code when
//     the entry has exit_code and running when it has none. Fountain's platform
//     platform read no state, so a quiet running session looked idle.
//   - Placement (placement.go, whose comment is the policy): runners send
//     labels in the handshake and report capacity (CPUs, memory, the
//     homes' disk, load, sandboxes running and idle) when asked at
//     connection and at each heartbeat, before Host.Heartbeat, so a
//     cluster Host stores it with the presence and every replica places
//     by the same report. Place orders the eligible runners that fit,
//     least loaded first, with selectors ("gpu=h100", "zone in (eu,us)"),
//     cordons and a preferred runner; Mint takes its first. Fountain's platform
//     placed every sandbox on the most recently connected runner.
package runner
