// Package oci is the container mechanism: a mechanism.Mechanism that runs
// each sandbox as a container of an OCI runtime, driven through the
// runtime's standard command line (create, start, exec, state, kill,
// delete, list). The runtime is runc (the default), runsc (gVisor, on its
// ptrace platform), or any runtime binary with runc's command line.
//
//	m, err := oci.New(oci.Config{Runtime: "runsc", StateDir: "/var/lib/managoat/oci"})
//
// The CLI names are "oci" (runc) and "oci:runsc" (ParseName); Available and
// Doctor say whether each can run on this host, with the evidence.
//
// # What a sandbox is
//
// Provision writes a bundle and has the runtime create the container (not
// started); Start starts it; Stop kills and deletes the container, keeping
// the bundle and the home directory, so Start creates it again from the same
// bundle; Destroy removes everything. The runtime's --root is a directory
// under StateDir, so the runtime's own list holds only this mechanism's
// containers and survives a restart of the managing process; ListRunning
// and Status ask the runtime, never a record. A container the runtime
// reports in a state this package does not know, or a runtime that cannot
// answer, is StatusUnknown, never absent.
//
// Spec.Mounts are bind mounts of the bundle (mounts.go): nosuid, nodev,
// recursive, read-only for :ro (on runc every submount too, "rro"),
// sources resolved once at Provision; before each create the mechanism
// walks every target itself with no symbolic link followed, so a link the
// workload left in its home refuses the start rather than moving the
// mount (the runtime would resolve it inside the container's root).
//
// The root is built like the jail's, with no image: a skeleton directory
// shared by every sandbox of the mechanism (built once per host layout, so
// Provision writes only a config.json), read-only binds of the
// host's /usr, /bin, /lib* and /opt (the merged-/usr symlinks recreated as
// symlinks), a generated /etc (passwd, group, hosts, resolv.conf, ...) plus
// read-only binds of harmless host /etc entries and nothing secret, a
// writable home at /home/sprite (nosuid), a private tmpfs /tmp, /proc with
// the usual masked and read-only paths, and a read-only root. The workload
// runs as uid/gid 1000 without capabilities, under no_new_privs and a
// seccomp deny-list (mounts, namespaces, tracing, keyrings, bpf, ...), in
// fresh pid, mount, network (only lo), ipc and uts namespaces. Those are
// the ConstructedCapabilities (plus the wall-clock budget the mechanism
// keeps), so the gate probes the host only for the cgroup controllers a
// Spec's limits need. As root a container's network is egress by
// default, on runc and on runsc (network.go, mechanism/egress: the
// outside world through a proxy of the process that started it, under
// an allow list UpdateEgress puts in force; never the host's loopback or
// addresses, link-local or private ranges); Spec.Network none keeps only
// lo. Without root there is no egress (nothing to enter the container's
// namespace with). Spec.Publish ports are published on the host's
// loopback while the container runs (address.go, Address: 127.0.0.1:PORT,
// never an address another machine reaches; egress.PublishPorts, as the
// jail's): on runc whatever its network, on runsc only with an egress
// network (with none its loopback is gVisor's own stack), as root.
//
// Limits are the launch's, written in the OCI config (memory with no swap,
// pids, CPU quota). After start the mechanism finds the container's cgroup
// from its init's /proc/<pid>/cgroup (v1, v2 or hybrid) and reads every
// requested limit back, and checks that the init's net, mnt and pid
// namespaces are not the managing process's; anything not in force deletes
// the container and refuses the start.
//
// A Spec with Image (an image unpacked by package image) gets the image
// as its bundle's rootfs instead: an overlay of the image's shared
// read-only directory under the sandbox's own upper layer, mounted at the
// sandbox's rootfs before the runtime creates the container and
// unmounted at Destroy (a copy of the image where there is no overlayfs);
// the host's runtime binds are left out, the rest of the root is the
// same, and the workload still runs as uid 1000 (the image's User is the
// jail's to honour). See image.go.
//
// # Running commands
//
// Execute and StartProcess enter the running container with the runtime's
// exec (a process.json carrying argv, the merged environment, the working
// directory, uid 1000, no capabilities, no_new_privs). A short sh prelude
// inside resolves the executable against PATH and prints a per-call random
// marker with its pid on stderr before exec'ing the command in place, so
// the three outcomes stay apart: a missing binary, a stopped container or a
// bad directory never prints the marker and is a *CouldNotRunError; a
// command that ran is a Completion whatever its exit status; a command
// stopped by a limit is a *LimitExceededError attributed from the kernel's
// counters (memory.oom_control / memory.events oom_kill, pids.events max)
// compared before and after, or from the mechanism's wall-clock budget
// (Spec.WallClock and ExecOptions.Timeout, the smaller wins), which kills
// the command's process group. Streams stay separate, are capped per
// stream with Truncated set, and OnOutput gets the raw chunks as read.
// The exit status is the runtime's: 128+n when a signal ended the command;
// Signal is set only when the mechanism knows the signal (its own wall-clock
// kill, or a memory kill the counters prove).
//
// # gVisor (runsc)
//
// runsc runs with --platform=ptrace (KVM is not usable everywhere),
// --network=none (a loopback-only netstack) for a container whose network
// is none, --network=host for an egress one (the sentry's sockets are the
// host kernel's, in the container's own network namespace, where the
// egress proxy's packet filter catches them as runc's; see network.go for
// why not gVisor's own stack, what the workload cannot change there, and
// the blocking read(2)/write(2) this runsc's host network gets wrong),
// and --oci-seccomp (the bundle's filter applies inside the sandbox too). On a hybrid cgroup layout runsc
// applies the v1 limits itself; no --ignore-cgroups is needed. Two limits
// are not guaranteed on runsc and a Spec asking for them is refused with
// the reason: memory (under ptrace the workload's memory is charged to the
// sentry, so a breach OOM-kills the whole sandbox rather than the
// allocating process, and raising the stubs' oom_score_adj does not help:
// killing a stub frees nothing) and pids (gVisor's tasks are not host
// processes, so pids.max never counts them). CPU quotas and the wall-clock
// budget hold. runsc's workloads are not host processes either, so
// Process.Pid is 0 and signals are delivered by an exec of kill inside the
// sandbox. The init's pid namespace check is skipped on runsc (the sentry
// keeps the container's pid namespace itself).
//
// syscall_filter on runsc: the workload's system calls are served by the
// sentry, which reaches the host kernel only under gVisor's own seccomp
// filter; and because runsc exec does not apply the bundle's filter to the
// processes it starts (measured: unshare -U succeeded in an exec'd shell),
// every command goes through a static helper of a few hundred bytes in the
// shared rootfs (/.managoat/filter-exec, generated by this package from a
// handful of assembled instructions and the filter assembled with
// go-seccomp-bpf ahead of time, mechanism/internal/seccompbpf) that sets
// no_new_privs, loads the same deny-list and execs the command (amd64
// only).
//
// Known limits of the Debian runsc (2022-12) on this kind of host: statx
// and fstatat with AT_NO_AUTOMOUNT fail with EINVAL, so coreutils' ls and
// stat fail inside gVisor (glibc's statx fallback passes the flag on; a
// newer runsc accepts it). `kill -9 1; kill -9 -1` from the workload ends
// the container's init and so the sandbox (runc's init is protected by the
// kernel); the host is unaffected and Status then reports stopped. Destroy
// of a runsc sandbox takes about 1.7 s here: runsc delete waits until the
// orphaned sandbox process is reaped by pid 1, which reaps late on this
// machine.
//
// Where this differs from the Docker mechanism it is modelled on: the
// runtime's own root replaces label filters, so another tool's containers
// are never listed or adopted; a missing binary is told apart from exit
// 127 by the marker, not by parsing the runtime's messages; the memory
// attribution reads the container's own cgroup counters, not a 137; and
// limits are read back after start rather than trusted.
package oci
