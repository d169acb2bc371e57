// Package denylist is the one seccomp deny-list of managoat's mechanisms
// (the jail and the OCI bundles), so they cannot drift apart: the
// syscalls of a container runtime's default profile (Docker/containerd
// without extra capabilities) that a workload never gets — mounts,
// tracing, kexec, bpf, keyrings, kernel modules, clocks, swap, reboot,
// namespaces, perf, handle-based opens, userfaultfd, io_uring, and
// obsolete or dangerous interfaces.
//
// Besides, as Docker's default profile refuses them to a container
// without CAP_SYS_NICE (or does not list them at all), the NUMA
// memory-policy calls (get_mempolicy, set_mempolicy, mbind, move_pages,
// migrate_pages, set_mempolicy_home_node): they read and steer where the
// host puts pages, the host's NUMA topology and other processes' pages
// (move_pages, migrate_pages) included, and no workload needs them (libnuma
// then reports no NUMA, as in a container); and memfd_secret, memory taken
// out of the kernel's direct map, unswappable, whose purpose is to hide
// data from the kernel's own view, a surface Docker keeps closed too.
//
// What a jail sandbox's /proc shows of the host is decided beside its
// tree: masked files and directories (mechanism/jail start.go,
// maskedProcFiles: keys, key-users, config.gz, kallsyms, timers), and
// mountinfo's source paths, left as the kernel prints them (mounts.go).
// The jail's own additions to this list (clone3 and io_setup ENOSYS, no
// set-id modes with a read-write mount) are in package policy.
package denylist

var common = []string{
	"acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "delete_module",
	"finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "init_module",
	"kcmp", "kexec_file_load", "kexec_load", "keyctl", "mount", "mount_setattr",
	"move_mount", "name_to_handle_at", "open_by_handle_at", "open_tree",
	"perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
	"ptrace", "quotactl", "reboot", "request_key", "setns", "settimeofday",
	"swapoff", "swapon", "syslog", "umount2", "unshare", "userfaultfd",
	"vhangup", "lookup_dcookie", "adjtimex", "personality", "pidfd_getfd",
	"fanotify_init", "process_madvise", "setdomainname", "sethostname",
	// open_tree with mount_setattr in one call; quotactl by descriptor;
	// io_uring, which Docker's default refuses since v25.
	"open_tree_attr", "quotactl_fd", "io_uring_setup", "io_uring_enter", "io_uring_register",
	// NUMA memory policy and secret memory (see the package doc).
	"get_mempolicy", "set_mempolicy", "mbind", "move_pages", "migrate_pages", "set_mempolicy_home_node",
	"memfd_secret",
}

var amd64Only = []string{
	"create_module", "get_kernel_syms", "query_module", "nfsservctl", "_sysctl",
	"uselib", "ustat", "sysfs", "iopl", "ioperm", "modify_ldt",
}

// I386Extra are i386 system calls without an x86-64 namesake that do what
// a denied one does (umount is umount2 without flags; the 64-bit-time
// clock setters and stime set the clock), or that Docker's default
// profile never allows (vm86): the jail's filter denies them when it
// translates the list for i386.
var I386Extra = []string{"umount", "clock_settime64", "clock_adjtime64", "stime", "vm86", "vm86old"}

// NotOnI386 are the denied names i386 has no system call for.
var NotOnI386 = []string{"kexec_file_load"}

// Syscalls returns the denied syscall names for goarch (runtime.GOARCH).
func Syscalls(goarch string) []string {
	out := append([]string(nil), common...)
	if goarch == "amd64" {
		out = append(out, amd64Only...)
	}
	return out
}

// CloneNewFlags are the namespace flags of clone(2) a workload may not
// pass (CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
// CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET), one by one as an OCI
// profile lists them.
var CloneNewFlags = []uint64{0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000}

// CloneNewMask is CloneNewFlags or'ed: a clone(2) with any of its bits set
// is refused.
const CloneNewMask = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
