// Package supervisor is the small per-sandbox process behind
// provider/local's sessions: the same binary re-executed (the
// containerd-shim pattern), detached in its own session (setsid) so a
// Ctrl-C or the exit of its caller does not reach it.
//
// A supervisor owns its sessions' pipes. For each session it moves the
// command's stdout and stderr into the session's journal (package journal)
// with splice(2), in the order it reads them, then appends the exit
// status; the journal, not the supervisor's memory, is the record. A
// record holds what a pipe held when the supervisor woke (up to 1 MiB),
// moved first into a private staging pipe so the command can keep writing
// while the kernel copies the batch into the file; no timer holds output
// back. Clients
// talk to it over a unix socket in the sandbox's directory (sup.sock), one
// JSON request and answer per line: spawn, wait (a long poll on a
// session's journal size), at (a follower's position), stdin,
// close_stdin, signal, resize, terminate, suspend, resume, policy,
// shutdown. Client.Follow reads a journal from byte zero straight
// from disk and asks the supervisor only when it has caught up, so any
// number of followers each get every record exactly once, and a follower
// whose supervisor died (kill -9) still gets every byte written before the
// death, then Outcome.Lost, never a made-up exit. A follower also says
// where it is (at, from its start and every few MiB it reads): the
// journal's cap (Retention.MaxSessionBytes) drops nothing a follower has
// not read, and while the slowest has more than the cap unread the
// supervisor stops reading the command's pipes, so a slow follower slows
// the command, as a pipe would, and loses no byte (readers.go). This is
// the one place output waits for its reader on the local path: the
// Command a provider hands out is fed from Follow only as fast as its
// reader takes it (sandbox.Stream.WaitRoom), and every layer above (the
// runner daemon, the platform's API, the Go client) passes that on.
//
// Durability (a host crash, not just a kill): every state file (a
// session's meta.json and exit mark, the suspended marker, the retention
// and pruned marks) is written to a temporary file, synced, renamed over
// the old and its directory synced (writeFileAtomic), so after a crash it
// is the old content or the new, never torn or empty; a session's
// directory is synced into sessions/ when it starts. A session's journal
// is synced after its exit record and before its exit mark, at a suspend
// (a checkpoint), and, for the sessions a killed supervisor left, by its
// successor before it marks them lost: not per record (journal's package
// doc says what that costs). TestStateSurvivesCrash proves it on an ext4
// image shut down without a flush, as a power cut leaves it.
//
// Liveness is the kernel's: a supervisor holds an exclusive flock on
// sup.lock and listens on sup.sock; a refused connection means none runs.
// A new supervisor kills the processes its dead predecessor left (matched
// by pid and start time), since their output can no longer be journaled.
// A supervisor exits when asked (shutdown), on SIGTERM (after stopping its
// sessions), or by itself once its sandbox directory is gone or replaced
// (the sandbox was destroyed): a directory notification on its directory
// (F_NOTIFY) wakes it when an entry there is removed, as removing the
// directory does first, so an idle supervisor runs no timer and is not
// woken (where F_NOTIFY is refused, it polls every two seconds). A
// directory renamed away is not noticed: Destroy tells the supervisor.
//
// Launch starts a supervisor through two re-executions (the first exits at
// once, so the supervisor is never a zombie of a long-lived caller) and
// returns when it accepts connections; MaybeRun is the hook the binary's
// main calls first. The protocol is hand-written JSON lines over a unix
// socket rather than gRPC or similar: it is a dozen operations between
// two processes of the same binary, and a dependency would add more than
// it saves.
package supervisor
