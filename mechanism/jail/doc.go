// Package jail is the native Linux isolation mechanism: namespaces,
// pivot_root, cgroups, Landlock and seccomp, with nothing but the kernel
// (golang.org/x/sys/unix, go-landlock; the seccomp filter is assembled by
// go-seccomp-bpf ahead of time, see mechanism/internal/seccompbpf).
//
// # The re-exec role, taken before main
//
// Go cannot run code between fork and exec, so each sandbox's init is this
// same binary re-executed (/proc/self/exe) in a helper mode selected by an
// environment variable. The package's init function recognises that mode
// and does the init's work before the program's main runs, then exits: a
// binary that imports this package needs no hook, and a re-executed
// process never runs the program's main (a main that forgot a hook could
// otherwise start a sandbox from inside a sandbox's init, and again from
// that one's). Init remains for programs that call it first thing in main,
// as earlier versions asked; it returns false in every process that gets
// that far.
//
// # Three inits: a standalone C program, a cgo constructor, Go
//
// The init of a sandbox born restricted (below) is C (cinit.c). On
// x86-64 it is a static 18 KiB program with no C library (cinit_rt.c is
// the few dozen system calls and string functions it needs), embedded in
// this package (cinit_amd64.elf, rebuilt by go generate; a test checks
// that it matches the sources) and executed from a sealed memory file:
// no dynamic loader, no C library start-up, no 13 MiB binary to map. It is
// ready a fraction of a millisecond after its exec and idles at about
// 40 KiB resident. Where there is no such program (another architecture,
// a host that refuses to execute memory files), the same C code runs as a
// constructor of this binary when it is built with cgo: it runs before
// the Go runtime exists, as runc's nsexec does, and idles at about
// 1.6 MiB. Started as Go, an init the size of managoat paid 2-4 ms of
// runtime and package initialisation and stayed at 7-11 MiB resident.
// A C init is used where the manager has done all the privileged work
// before the exec (as root on a kernel whose procfs takes the pidns
// option, below), so what is left in C is small: check the capabilities
// and no_new_privs it was born with, load the seccomp program the manager
// assembled, and serve the control protocol (proto.go). Everywhere else
// (rootless, older kernels, no C init), and when MANAGOAT_JAIL_INIT=go,
// the init is the Go one (helper.go, serve.go); the breach conformance
// runs against the standalone and the Go init, and the unit tests of the
// protocol, descriptors, limits and leaks against all three.
//
// # What a sandbox is
//
// Start launches the init with new mount, pid, network, uts, ipc and cgroup
// namespaces, plus a user namespace: without root one mapping the caller,
// as root one mapping a uid range of the sandbox's own (below). Before it does anything
// the init is placed in the sandbox's cgroups (CLONE_INTO_CGROUP on the v2
// tree, the manager writing its pid into cgroup.procs on v1), the limits are
// read back and verified in force, and the sandbox is killed if they are
// not. Every command is a descendant of the init, so every command is born
// inside. The sandbox's root is a tmpfs of read-only, nosuid binds of the
// host's /usr, /bin, /sbin, /lib* (links kept where the host is
// merged-/usr), a generated /etc (passwd, group, hosts, resolv.conf,
// nsswitch.conf) plus harmless read-only entries (ld.so.cache, ssl,
// alternatives, ...; never shadow or keys), the home directory at
// /home/sprite (read-write, nosuid, nodev), a private tmpfs /tmp, a fresh
// /proc (kcore, keys, key-users, timer_list, sched_debug, config.gz,
// kallsyms masked, acpi, scsi, asound empty; sys, sysrq-trigger, irq, bus
// read-only: start.go maskProc), and
// a minimal /dev (null, zero, full, random, urandom, tty, devpts, shm),
// with lo up (the only interface). The devpts instance holds at most 256
// terminals (max=: the kernel's pool for every instance but the host's is
// shared), and a command's open-file limit is 1024, its hard limit at most
// 65536 (the manager's was inherited).
//
// # Network
//
// A sandbox's network is egress by default (network.go,
// mechanism/egress): the outside world through a proxy of the process
// that started it (a provider/local sandbox's supervisor), which sets up
// the sandbox's network namespace while the init starts, serves its
// resolver (127.0.0.53 in its /etc/resolv.conf) and every TCP
// connection, never reaches the host's loopback or addresses, link-local
// (metadata) or private ranges, and enforces the allow list UpdateEgress
// puts in force (kept for the next start). Spec.Network none keeps only
// lo. Spec.Publish ports are published on the host's loopback while the
// sandbox runs (Address). When the process serving them dies the
// sandbox fails closed, until a Start adopts it. Without root the same
// holds (the proxy's sockets and packet filter are made in the sandbox's
// user and network namespaces by mechanism/egress's helper, which
// nsenter starts there), except that the packet filter does not change
// with the policy, so a connection the list denies is reset by the
// proxy at once rather than refused at connect; published ports reach
// the sandbox through sockets another helper of mechanism/egress makes in
// its namespaces, one per connection (it ends with the sandbox's stop or
// its init); where nsenter is missing a rootless sandbox has only lo, an
// egress network is refused naming egress_allowlist and published ports
// naming network_restriction.
//
// As root, on a kernel whose procfs takes the pidns mount option (6.18+),
// the init is born restricted: the manager starts it from a locked OS
// thread that it then discards, which enters new mount, uts, ipc and
// network namespaces, creates /tmp, /dev/shm and /dev/pts detached,
// builds the Landlock ruleset on their inodes, the home directory's and
// the devices', cuts its bounding set to SETUID, SETGID and KILL, clears
// its inheritable set, sets no_new_privs, restricts itself with the
// ruleset, and clones the init into a new pid and cgroup namespace: exec'd
// as root, the init has exactly SETUID, SETGID and KILL, no_new_privs and
// the ruleset, on every thread it will ever have. While its runtime starts,
// a second discarded thread joins its mount, uts and network namespaces,
// builds the root's tree (binds made read-only in one recursive
// mount_setattr), the hostname and lo, mounts a proc for the init's pid
// namespace, and pivot_roots the namespace into the root, which moves the
// init with it. The init checks what it was born with and loads the
// seccomp filter on all its threads (TSYNC). On older kernels the init is
// born with SYS_ADMIN in its inheritable set, pivots and mounts /proc
// itself, and lowers its capabilities and applies Landlock on every thread
// with psx broadcasts; without root it builds its namespaces inside a new
// user namespace and drops its bounding set the same way. Either way:
// no_new_privs, a bounding set of SETUID, SETGID and KILL (nothing without
// root), a Landlock ruleset allowing writes only under /home/sprite, /tmp,
// /dev/shm and the harmless devices (and scoping abstract unix sockets),
// and a seccomp deny-list in the shape of a container runtime's default
// (mount, ptrace, kexec, bpf, keyctl, module loading, namespaces, clocks,
// swap, reboot, perf, io_uring, NUMA memory policy, memfd_secret, ...;
// clone with namespace flags is EPERM, clone3 is
// ENOSYS, and so is io_setup (kernel AIO's contexts are counted host-wide,
// fs.aio-max-nr, with no per-user bound: one sandbox used them all); every verdict is an errno or a kill, never RET_TRACE, RET_LOG or
// RET_USER_NOTIF, which a filter the workload stacks on top outranks; on x86-64 the same rules hold for i386's system calls, made
// through int $0x80 by 32-bit programs, and a system call of any other
// architecture kills the process).
// The init then stays pid 1 of the sandbox, reaps orphans and
// starts commands on request over a unixpacket control socket; every
// command inherits that state. Commands run as uid:gid 1000:1000
// ("sprite"; Config.UID/GID; host ids base+1000 in a sandbox with a
// range of its own) with no capabilities (CapEff, CapPrm and
// CapAmb zero; the bounding set keeps the three the init needs, unusable
// under no_new_privs); without root they are uid 0 of a user namespace
// mapped to the caller, with no capabilities. The binary starts once per
// sandbox.
//
// Limits: memory (memory.limit_in_bytes or memory.max, swap capped too when
// the host has it), pids (pids.max, counting the init: one task for the C
// init, about ten threads for the Go one), CPU (cfs quota or cpu.max over a 100 ms period) and a wall-clock
// budget per Execute. A memory or pids kill is attributed from the kernel's
// counters (memory.oom_control or memory.events oom_kill, pids.events max),
// the wall clock from the budget the jail itself enforces. The cgroup layout
// (v1, v2 or hybrid) is detected at run time; on a hybrid host the limits
// live on v1 and the v2 tree is used for placement and cgroup.kill.
// Stop, Destroy and the next Start remove a sandbox's cgroups and control
// socket whenever its state is there; SweepOrphans (which provider/local
// runs every ten minutes) removes those whose state went without a
// Destroy: a state directory deleted whole, a process killed half-way.
//
// CPU throttling is not a kill: a CPU cap shows as slowness, never as
// LimitExceeded cpu. Every command runs in a session of its own (setsid):
// it cannot leave its process group, and no descendant can join another
// command's or the init's; a signal, a wall-clock kill or a kill on close
// goes to the command's group and to the command itself. A descendant
// that makes a session of its own (setsid) leaves the group: it lives on
// under the sandbox's limits until Stop, which ends the whole pid
// namespace. A process started with StartProcess belongs to the
// connection that started it: when the calling process exits (or the
// Process is dropped with its connection), the jail kills it, so a
// detachable session needs a long-lived supervisor holding it. No
// descriptor of the managing process other than the three given reaches
// a command, whatever the managing process inherited.
// A non-*os.File Stdin is copied by a goroutine that ends when its Read
// returns after the process exited (as with os/exec).
//
// State lives under Config.StateDir (one directory per sandbox: state.json,
// home/, and init.log for the Go init; the C init reports on a pipe);
// Status probes the recorded init (pid and start time) and its control
// socket, so Status and ListRunning are right after the
// managing process restarts, and any process sharing the StateDir may
// manage the sandboxes (serialised by flocks on the sandbox directory).
// Stop kills the init (the kernel then kills its whole pid namespace) and
// removes the cgroups; Destroy also removes the files.
//
// # A uid range of its own
//
// As root, each sandbox provisioned on a kernel where its init is born
// restricted (above) gets a user namespace mapping 65536 uids and gids,
// 0..65535 inside, to a range of the host of its own (userns.go): base
// from 0x70000000 up in steps of 65536, past the ranges systemd-nspawn
// hands out and below systemd's foreign range and 2^31, never one that
// meets a range of /etc/subuid or /etc/subgid or an id of /etc/passwd or
// /etc/group. The range is claimed in Config.IDMapDir (host-wide,
// /var/lib/managoat/idmap by default: one file per range naming the
// sandbox, taken under a lock, taken over when its sandbox is gone, and
// swept at most every ten minutes per host, the last sweep's time kept in
// the registry, of claims of sandboxes gone without a Destroy),
// recorded in the sandbox's state (a restart or a new manager adopting
// it keeps it) and released by Destroy. The workload's uid inside is what
// it was (1000, or an image's user) and base+uid on the host, which owns
// its home; OwnerOf and IDRange say which. The guarantee: no host user,
// and no process of another sandbox, has the workload's uid, so none can
// signal or ptrace it, and the workload's ids own no host file but the
// sandbox's own (its home, an image's upper layer). A C init makes the
// namespace itself first thing (unshare, single-threaded, after the
// pivot), the manager writes its maps, and the init becomes its root
// (host uid base): its clone keeps vfork and no process is made for the
// namespace. On an image the namespace is needed before the init, for
// the idmapped layer: it is made while the start goes on by the C init's
// program in a mode of its own (started with vfork, it unshares, the
// manager maps and holds the namespace, and it exits), and a C init
// joins it (setns, as its owner). The Go init, whose runtime is threaded and can neither make nor
// join one, is born in a new one (its clone then cannot use vfork).
// Each namespace is owned by host uid base, not the host's root (the C
// init takes base's ids before it makes or joins it, the thread cloning
// the Go init or a holder takes them with its capabilities kept): the
// kernel charges the per-user counts of every process in a user namespace
// (user.max_inotify_instances and max_inotify_watches, pending signals,
// message queue bytes, processes) to its owner in the host's namespace as
// well, so each sandbox has quotas of its own, and neither the host's
// root nor another sandbox loses any to it (TestInotifyQuotaIsTheSandboxs).
// Every init lowers the full set of capabilities a user namespace gives
// its root to the ones it keeps (SETUID, SETGID, KILL) before anything
// else. The mount, network, uts and ipc
// namespaces it lives in are made by the manager and stay the host's
// (the pid and cgroup ones too, but for the Go init, whose clone makes
// them in its new user namespace), so root of the sandbox holds no
// capability over them: it cannot mount, configure the network or set
// the hostname, whatever seccomp allows (and an image's root workload
// never holds SYS_ADMIN or NET_ADMIN anyway). Host files appear inside as
// owned by nobody (65534): their ids are not mapped. A range costs a
// cold start 1.03-1.15x here (BenchmarkColdStartMapped, against an
// unmapped start in the same run).
// Not mapped, and running as before (Config.UID on the host): without
// root (the workload is the caller), on a kernel without the procfs pidns
// option (the older start path builds the tree in the init, which a
// user namespace would then own), with Config.IDMapDir "-", for a sandbox
// with a host mount that cannot be idmapped when Config.UnmappedMounts
// lets it run (Host mounts, below; refused otherwise), and for a sandbox
// provisioned before ranges existed (its state has none).
// UsernsDescription (managoat doctor) says which applies.
//
// # Host mounts
//
// Spec.Mounts bind host files and directories into the tree (mounts.go):
// the source, resolved once at Provision, is opened with no symbolic link
// followed, cloned (open_tree), made nosuid and nodev and, for :ro,
// read-only on every submount too (mount_setattr), and attached on the
// target, which is walked from the tree's root one component at a time,
// never through a symbolic link (a link the workload left in its home
// refuses the start), and made where missing; the read-only flag is read
// back before the workload starts. Landlock allows writes beneath a
// read-write mount. A sandbox with mounts builds its own tree rather than
// cloning the shared template. The same holds rootless.
//
// A sandbox with mounts keeps its uid range: each mount is idmapped
// (MOUNT_ATTR_IDMAP, Linux 5.12, per file system: ext4, xfs, btrfs,
// tmpfs from 6.3, ...) with a user namespace mapping the source's owner
// on the host to the workload. A directory root owns and binds (managoat
// run -v .:/home/sprite/src as root) is the workload's to write, and what
// it makes there is root's on the host; other host ids show as nobody
// and cannot be written through the mount. The workload itself stays
// base+1000 on the host, no host account. A sandbox with a read-write
// mount loads a filter that refuses any set-user-ID or set-group-ID mode
// (chmod, fchmod, fchmodat, fchmodat2, creating open, openat, creat, mknod
// and mknodat: EPERM; openat2 ENOSYS), since a set-user-ID file in the
// bind would run on the host with its owner's euid; dpkg cannot install a
// set-user-ID program in such a sandbox. Where a source's file system
// cannot be idmapped (FUSE, NFS, sysfs, an older kernel), Provision
// refuses the sandbox (host_mounts, saying why) unless
// Config.UnmappedMounts, or MANAGOAT_JAIL_UNMAPPED_MOUNTS=1 in the
// environment, lets it run without a range: its workload is then
// Config.UID on the host, which may be a real account, and owns the
// source only if that uid does. Where sandboxes get no range at all
// (rootless, an older kernel: above), mounts change nothing in that.
//
// # On an image
//
// A Spec with Image (an image unpacked by package image) runs the sandbox
// on the image's root instead of the host's runtime: an overlay of the
// image's directory, shared read-only by every sandbox on it, under an
// upper layer in the sandbox's own state directory (a copy of the image
// where the kernel has no overlayfs), with the same home, /dev, /tmp,
// /proc, Landlock ruleset, seccomp filter and capabilities as on the
// host's root, and the image's /etc but for hosts, hostname and
// resolv.conf. Mount points the image has as symlinks are made real
// directories in the upper layer, never followed. In a sandbox with a
// range of its own, on a kernel whose overlayfs takes an idmapped lower
// layer (Linux 5.19; probed once per file system by mounting one), the
// image's directory is mounted under the overlay idmapped with the
// sandbox's user namespace, so its files (owned by the host's root on
// disk) are root's inside; the upper layer is owned by the range. The
// workload then runs as the image's user, root included: root of the
// user namespace, with CHOWN, DAC_OVERRIDE, FOWNER and FSETID besides the
// init's three, all acting only on files whose ids the namespace maps
// (the sandbox's own). It may write its whole root (dpkg -i, pip install
// into its own layer: the ruleset allows writes beneath the sandbox's
// root, built before the init for that, and still nowhere else), while
// the image's directory stays unchanged and shared. Elsewhere (no range, no idmapped layers) the
// workload runs as the image's user unless that is root (then as
// Config.UID) and writes, as on the host's root, only its home and /tmp.
// A Spec.DiskBytes bounds the upper layer as it bounds the home, by the
// same means (a project quota or a loop-mounted ext4 image, layer.img)
// and the same size: a sandbox on an image writes at most twice
// DiskBytes to the host's disk, its home and its layer (quota.go). Only a
// sandbox provisioned before layers were bounded has an unbounded layer; a
// sandbox on a copy of its image (no overlayfs) needs no bound, since its
// workload is not root there and Landlock lets it write only its home,
// /tmp and /dev/shm (TestCopyRootNotWritable). Usage counts the layer, or
// the copy, with the home.
// See image.go and userns_image.go; the breach conformance runs on an
// image root too (TestConformanceOnImage, as the image's user "app"),
// and TestImageRootInUserns tries root's escapes.
//
// # Cost
//
// Start is measured against `unshare --mount --pid --net --fork true` and
// `bwrap --unshare-all --ro-bind / / true`, Execute against a plain
// fork+exec (BenchmarkColdStart, BenchmarkExecute). What a start costs, and
// what was done about it: the binary starts once per sandbox (the init
// drops no privileges at run time on the main path, it is born with them);
// the network namespace (~0.5 ms here) is made on its own thread and the
// tree on another while the init's runtime starts; the runtime's binds are
// made read-only by one recursive mount_setattr; state.json is rewritten in
// place (one pwrite; a CRC-32 member lets a reader detect a half-written
// one) because on an ext4 mounted with discard every inode allocated or
// freed costs a journal transaction; Execute is one request and one reply
// and allocates next to nothing; the init is the C one (above), so no Go
// runtime starts inside the sandbox, and it starts commands with vfork.
// After its second start a Jail keeps the part of the root that is the
// same for every sandbox as a template in a mount namespace of its own
// (template.go) and clones it, instead of building ~45 mounts again. With
// Config.TemplateDir (provider/local sets it as root, for an installed
// binary: not one `go run` or `go test` built) the template is
// pinned there for other processes (template_pin.go): the first start of
// a process that starts one sandbox and exits (managoat run, a sandbox's
// supervisor), for which building the tree was the longest step, clones
// the one an earlier process pinned. What
// is left is the network namespace, the clone of the pid, mount and
// network namespaces and the init's exec, the few mounts that are the
// sandbox's own, and /bin/true's own exec inside; unshare and bwrap build
// no /etc or /dev, and set no cgroup, Landlock or seccomp.
//
// # Not constructed
//
// Without root the jail refuses, naming the capability, a Spec with a
// disk quota (disk_quota: as root the home is bounded by a project quota
// or a loop-mounted ext4 image, quota.go; neither is open to an
// unprivileged manager), and, where nsenter is missing, an egress network
// or allow list (egress_allowlist) and published ports
// (network_restriction). cgroup v2 limits are implemented but were exercised here only
// on a hybrid host; a pure-v2 host needs a delegated cgroup so controllers
// can be enabled below the caller's own.
package jail
