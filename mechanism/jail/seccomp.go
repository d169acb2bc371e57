package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/managoat/managoat/mechanism/internal/denylist"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// namespace clone flags a workload may not use.
const cloneNewMask = unix.CLONE_NEWNS | unix.CLONE_NEWCGROUP | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET

// seccompFilter is loaded on every thread of the init (TSYNC); every
// process it starts inherits it.
func seccompFilter() seccomp.Filter {
	names := denylist.Syscalls(runtime.GOARCH)
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
