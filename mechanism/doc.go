// Package mechanism is the isolation contract under every local sandbox:
// the Mechanism interface, the capability vocabulary, the host probe and the
// capability gate.
//
// A Mechanism turns an ID and a Spec into an isolated place to run commands.
// The lifecycle is
//
//	absent --Provision--> provisioned --Start--> running --Stop--> stopped --Start--> running
//	any --Destroy--> absent   (Destroy is idempotent)
//
// Status reports what is observed now (StatusAbsent and StatusUnknown never
// collapse: absent means "surely not there", unknown means "could not tell").
// ListRunning reads the mechanism's on-disk state and live processes, so it is
// right after the managing process restarts.
//
// # Provision: the caller's id is the reference
//
// The Elixir library's provision(spec, owner_ref) returned a sandbox
// reference the host kept. Here the caller names the sandbox: the id it
// passes to Provision (ValidateID: a name safe as one path element) is the
// reference, and every later call (Start, Execute, Usage, Destroy) takes
// the same id; there is no handle to keep or lose. The id is what the
// mechanism's on-disk state is keyed by, so a restarted managing process
// finds its sandboxes by id again (ListRunning), and Provision of an id
// that exists with the same Spec adopts it. An owner reference, where a
// host needs one, is the host's own: it maps its references to ids
// (provider/local keeps a record per sandbox name).
//
// # Usage
//
// Usage is the current consumption of a sandbox, the usage map of the
// Elixir library (cpu_millicores, memory_mb, disk_mb) as a struct in
// bytes: CPUMillicores is a rate over UsageWindow (so a call on a running
// sandbox takes about that long), next to the cumulative CPUTime;
// MemoryBytes the current charge; DiskBytes what the sandbox holds on the
// host's disk. A figure the mechanism has no counter for is 0 (trusted
// has no cgroup: disk only); mechanismtest checks that the figures move
// with the workload where the mechanism claims the cgroup caps.
//
// # Running commands
//
// Execute runs argv inside a running sandbox and waits. It has exactly three
// outcomes:
//
//   - (Completion, nil): the command ran; a non-zero ExitStatus is a result.
//   - (_, *CouldNotRunError): the command did not run (no such sandbox, not
//     running, binary missing). Never reported as an exit status. Match with
//     errors.Is(err, ErrCouldNotRun). One that also matches ErrNotRunning
//     says the command never started because the sandbox was not running,
//     so a caller may start it and try once more (provider/local does).
//     A sandbox that stopped under a command that started, or may have,
//     is ErrInterrupted instead: never to be retried blindly.
//   - (Completion, *LimitExceededError): a limit the sandbox was launched
//     under stopped it (memory, pids, cpu, wall_clock), attributed from the
//     kernel's own counters. The returned Completion holds the partial output.
//     Match with errors.Is(err, ErrLimitExceeded) or errors.As.
//
// Stdout and stderr stay separate; each is capped (ExecOptions.LimitBytes,
// DefaultLimitBytes = 1 MiB by default) and Completion.Truncated says when
// either was cut. The command keeps running after the cap is hit; the rest is
// drained and discarded. ExecOptions.OnOutput receives raw chunks as they are
// read, never split or joined into lines.
//
// StartProcess starts a long-lived process inside a running sandbox with the
// caller's own stdin/stdout/stderr and returns a Process to Wait on or Signal,
// in the shape of os/exec: if Stdin/Stdout/Stderr are *os.File they are handed
// to the process directly, otherwise the mechanism copies through pipes, and
// Wait returns after the process exited and the copies finished. The process
// lives inside the sandbox's namespaces, cgroup, Landlock domain and seccomp
// filter exactly like an Execute command; the sandbox's WallClock budget does
// not apply to it (it is meant for sessions). The ctx of StartProcess bounds
// only the start; stop a process with Signal, or stop the sandbox.
//
//	p, err := m.StartProcess(ctx, id, mechanism.ProcessSpec{
//		Argv:   []string{"bash", "-l"},
//		Stdin:  stdinReader,
//		Stdout: journal, Stderr: journal,
//	})
//	...
//	exit, err := p.Wait()
//
// # Files
//
// Every sandbox has a home directory, seen inside as Home (/home/sprite).
// HostPath maps a sandbox path under Home (or a path relative to it) to the
// host directory that backs it, so a caller can write files the sandbox will
// see; a path that escapes Home is rejected with ErrInvalid.
//
// # Capabilities and the gate
//
// Capabilities are named guarantees (memory_cap, network_restriction, ...).
// A mechanism declares, through optional interfaces:
//
//   - RequiredCapabilities: what the host must provide. A mechanism that does
//     not say requires every host-probeable name (DefaultRequired).
//   - ConstructedCapabilities: what it builds itself whatever the host can do.
//     Not probed. A mechanism that does not say constructs nothing.
//   - GuaranteedCapabilities: what it enforces when its requirements are met.
//     A Spec limit whose capability is not guaranteed is refused, never
//     silently dropped. A mechanism that does not say guarantees nothing.
//
// Gate runs at Provision and at Start (mechanisms in this module call it
// themselves). It probes every missing name on the live host through a
// Prober, and a refusal is an *UnavailableError listing every missing
// capability with the reason on this host. NewHostProber performs the real
// operation each time: it creates a cgroup and writes a limit, builds a
// mount namespace and pivots into it, loads a seccomp filter, ... (about
// 8 ms for all of them here). HostProber, the default, asks it once per
// process and keeps the verdicts of available for the rest of the boot in
// a BootCache, so a short-lived process (one `managoat run`) does not
// probe again; an unavailable capability is always probed again, and a
// mechanism whose start fails on the host forgets the cache (ForgetProbes).
//
// Where this contract differs from ExSandbox's, the Elixir library it was modelled on: limits
// include pids (a fork bomb cap), the gate also refuses a limit the mechanism
// does not guarantee (ExSandbox passed such a Spec and dropped the cap),
// and Execute's third outcome carries the partial output.
package mechanism
