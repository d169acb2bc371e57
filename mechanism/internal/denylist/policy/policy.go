// Package policy states managoat's seccomp filters as go-seccomp-bpf
// policies, and assembles them.
//
// Only the generator and the tests of package seccompbpf import it on
// x86-64, where the assembled programs are generated into the source:
// go-seccomp-bpf's syscall tables cost every process that links them
// about 0.4 ms and 160 KiB at start (its package initialisation), and
// assembling a filter costs a start another 0.2 ms. On other
// architectures seccompbpf assembles at run time through this package.
package policy

import (
	"fmt"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/managoat/managoat/mechanism/internal/denylist"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Jail is the jail's filter: the deny-list and namespace-making clones
// answer EPERM; clone3, whose flags a filter cannot read, answers RET_TRACE
// (ENOSYS without a tracer), so libc falls back to clone, filtered above.
func Jail(goarch string) seccomp.Policy {
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: denylist.Syscalls(goarch)},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
				Name:       "clone",
				Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: denylist.CloneNewMask}},
			}}},
			{Action: seccomp.ActionTrace, Names: []string{"clone3"}},
		},
	}
}

// FilterExec is the OCI bundles' deny-list as the filter-exec helper loads
// it (x86-64 only): as the bundle's OCI profile states it, one clone rule
// per namespace flag, and ENOSYS for clone3.
func FilterExec() seccomp.Policy {
	var cloneConds []seccomp.NameWithConditions
	for _, f := range denylist.CloneNewFlags {
		cloneConds = append(cloneConds, seccomp.NameWithConditions{Name: "clone",
			Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: f}}})
	}
	enosys := seccomp.ActionErrno | seccomp.Action(38)
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: denylist.Syscalls("amd64")},
			{Action: seccomp.ActionErrno, NamesWithCondtions: cloneConds},
			{Action: enosys, Names: []string{"clone3"}},
		},
	}
}

// Assemble assembles p for this process's architecture (go-seccomp-bpf
// assembles for no other), behind a guard that kills the process on a
// system call of any other architecture.
//
// go-seccomp-bpf answers a call of another architecture with the policy's
// default action, here allow: on x86-64 a process could make the i386
// calls (int $0x80, with IA32 emulation on) that the deny-list refuses in
// their x86-64 form (unshare, keyctl, ptrace, personality...). The rules
// know only this architecture's numbers, so a call of another one is
// refused outright, as libseccomp does by default.
func Assemble(p seccomp.Policy) ([]unix.SockFilter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	raw, err := bpf.Assemble(insts)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp BPF: %w", err)
	}
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // seccomp_data.arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, K: uint32(info.ID)},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_KILL_PROCESS},
	}
	for _, r := range raw {
		prog = append(prog, unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K})
	}
	return prog, nil
}
