package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// deniedSyscalls is the deny-list of a container runtime's default profile
// (Docker/containerd without extra capabilities): mounts, tracing, kexec,
// bpf, keyrings, kernel modules, clocks, swap, reboot, namespaces, perf,
// handle-based opens, userfaultfd, and obsolete or dangerous interfaces.
var deniedSyscalls = []string{
	"acct", "add_key", "bpf", "clock_adjtime", "clock_settime", "delete_module",
	"finit_module", "fsconfig", "fsmount", "fsopen", "fspick", "init_module",
	"kcmp", "kexec_file_load", "kexec_load", "keyctl", "mount", "mount_setattr",
	"move_mount", "name_to_handle_at", "open_by_handle_at", "open_tree",
	"perf_event_open", "pivot_root", "process_vm_readv", "process_vm_writev",
	"ptrace", "quotactl", "reboot", "request_key", "setns", "settimeofday",
	"swapoff", "swapon", "syslog", "umount2", "unshare", "userfaultfd",
	"vhangup", "lookup_dcookie", "adjtimex", "personality", "pidfd_getfd",
	"fanotify_init", "process_madvise", "setdomainname", "sethostname",
}

var deniedAMD64 = []string{
	"create_module", "get_kernel_syms", "query_module", "nfsservctl", "_sysctl",
	"uselib", "ustat", "sysfs", "iopl", "ioperm", "modify_ldt",
}

// namespace clone flags a workload may not use.
const cloneNewMask = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// seccompFilter is loaded on every thread of the init (TSYNC); every
// process it starts inherits it.
func seccompFilter() seccomp.Filter {
	names := append([]string(nil), deniedSyscalls...)
	if runtime.GOARCH == "amd64" {
		names = append(names, deniedAMD64...)
	}
	return seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync,
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls: []seccomp.SyscallGroup{
				{Action: seccomp.ActionErrno, Names: names},
				{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
					Name:       "clone",
					Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: cloneNewMask}},
				}}},
				// clone3 passes its flags in memory, which a filter cannot
				// read: answer ENOSYS (RET_TRACE without a tracer) so libc
				// falls back to clone, which is filtered above.
				{Action: seccomp.ActionTrace, Names: []string{"clone3"}},
			},
		},
	}
}

// seccompProgram is the assembled filter: the init assembles it while it
// waits for its root (a few hundred µs), and loads it once there.
type seccompProgram []unix.SockFilter

func assembleSeccomp() (seccompProgram, error) {
	f := seccompFilter()
	insts, err := f.Policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp BPF: %w", err)
	}
	prog := make(seccompProgram, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return prog, nil
}

// load sets no_new_privs and loads the filter on every thread (TSYNC),
// as seccomp.LoadFilter does with seccompFilter's flags.
func (p seccompProgram) load() error {
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	fprog := unix.SockFprog{Len: uint16(len(p)), Filter: &p[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	runtime.KeepAlive(p)
	return nil
}
