// Package policy states managoat's seccomp filters as go-seccomp-bpf
// policies, and assembles them, on x86-64 with a translation of each for
// i386's system calls (Assemble) that the library does not make.
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
	"slices"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"github.com/elastic/go-seccomp-bpf/arch"
	"github.com/managoat/managoat/mechanism/internal/denylist"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// Jail is the jail's filter: the deny-list and namespace-making clones
// answer EPERM; clone3, whose flags a filter cannot read, answers ENOSYS,
// so libc falls back to clone, filtered above.
//
// Every rule is an errno, never SECCOMP_RET_TRACE, RET_LOG or
// RET_USER_NOTIF: when several filters are stacked the kernel takes the
// action of highest precedence (kill, trap, errno, user_notif, trace,
// log, allow), so a filter the workload stacks on top of this one and
// that answers RET_USER_NOTIF outranks a TRACE (or LOG) of ours, and its
// own supervisor's SECCOMP_USER_NOTIF_FLAG_CONTINUE then runs the call:
// clone3 answered RET_TRACE (ENOSYS only because no tracer was
// attached) let a workload make a user and network namespace with full
// capabilities in it. An errno outranks user_notif, trace and log.
func Jail(goarch string) seccomp.Policy {
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: denylist.Syscalls(goarch)},
			{Action: seccomp.ActionErrno, NamesWithCondtions: []seccomp.NameWithConditions{{
				Name:       "clone",
				Conditions: []seccomp.Condition{{Argument: 0, Operation: seccomp.BitsSet, Value: denylist.CloneNewMask}},
			}}},
			{Action: enosys, Names: []string{"clone3"}},
			// Kernel AIO's contexts are counted host-wide, with no
			// per-user bound (fs.aio-max-nr, 65536 by default): 16
			// io_setup(4096) in one sandbox made every io_setup of the
			// host and of every other sandbox fail with EAGAIN. ENOSYS,
			// as on a kernel without AIO, which libaio's users (InnoDB,
			// fio) take for no native AIO and fall back.
			{Action: enosys, Names: []string{"io_setup"}},
		},
	}
}

// enosys answers a call ENOSYS, as a kernel without it would.
const enosys = seccomp.ActionErrno | seccomp.Action(unix.ENOSYS)

// JailMounts is Jail for a sandbox with a read-write host mount: besides,
// no file may be given a set-user-ID or set-group-ID bit (a mode with
// S_ISUID or S_ISGID: chmod, fchmod, fchmodat, fchmodat2, and the
// creating mode of open, openat, creat, mknod and mknodat answer EPERM),
// and openat2, whose mode a filter cannot read, answers ENOSYS (the C
// libraries and Go's runtime never need it). A file the workload writes
// into a bind is the host's file, owned on the host by the source's owner
// (the jail's idmapped mount) or the workload's host uid: a set-user-ID
// copy of sh written there would give whoever runs it on the host, where
// the source is not nosuid, that owner's euid. Inside the sandbox the bits
// were useless anyway (no_new_privs, every mount nosuid); dpkg installing
// a set-user-ID program fails in such a sandbox.
func JailMounts(goarch string) seccomp.Policy {
	p := Jail(goarch)
	var conds []seccomp.NameWithConditions
	for _, c := range SetIDModeArgs(goarch) {
		conds = append(conds, seccomp.NameWithConditions{Name: c.Name,
			Conditions: []seccomp.Condition{{Argument: c.Arg, Operation: seccomp.BitsSet, Value: unix.S_ISUID | unix.S_ISGID}}})
	}
	p.Syscalls = append(p.Syscalls,
		seccomp.SyscallGroup{Action: seccomp.ActionErrno, NamesWithCondtions: conds},
		seccomp.SyscallGroup{Action: enosys, Names: []string{"openat2"}})
	return p
}

// ModeArg is a system call that sets a file's mode, and the index of the
// argument that holds it.
type ModeArg struct {
	Name string
	Arg  uint32
}

// SetIDModeArgs are the system calls JailMounts refuses a mode with
// S_ISUID or S_ISGID (the same index on i386).
func SetIDModeArgs(goarch string) []ModeArg {
	out := []ModeArg{{"fchmod", 1}, {"fchmodat", 2}, {"fchmodat2", 2}, {"openat", 3}, {"mknodat", 2}}
	if goarch == "amd64" {
		out = append(out, ModeArg{"chmod", 1}, ModeArg{"open", 2}, ModeArg{"creat", 1}, ModeArg{"mknod", 1})
	}
	return out
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
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: seccomp.ActionErrno, Names: denylist.Syscalls("amd64")},
			{Action: seccomp.ActionErrno, NamesWithCondtions: cloneConds},
			{Action: enosys, Names: []string{"clone3"}},
		},
	}
}

// Assemble assembles p for this process's architecture, behind a guard on
// the architecture of each system call. On x86-64 the policy is also
// translated for i386 (compat386), whose calls a process makes through
// int $0x80 when the kernel has IA32 emulation; a call of any other
// architecture kills the process, as libseccomp does by default for one a
// filter does not list. (The x32 ABI shares x86-64's architecture value;
// go-seccomp-bpf's program answers it ENOSYS.)
//
// go-seccomp-bpf assembles for the running architecture only, and answers
// a call of another one with the policy's default action, here allow: an
// i386 unshare, keyctl, ptrace or personality would pass the x86-64
// rules. Hence the guard, and the translation written here.
func Assemble(p seccomp.Policy) ([]unix.SockFilter, error) {
	info, err := arch.GetInfo("")
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	insts, err := p.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp policy: %w", err)
	}
	var compat []bpf.Instruction
	if info.ID == arch.X86_64.ID {
		if compat, err = compat386(p); err != nil {
			return nil, fmt.Errorf("assemble seccomp policy for i386: %w", err)
		}
	}
	// ld arch; native: on to go-seccomp-bpf's program; i386: its section;
	// anything else: kill.
	guard := []bpf.Instruction{
		bpf.LoadAbsolute{Off: archOffset, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(info.ID), SkipTrue: uint8(len(compat) + 2)},
	}
	if len(compat)+2 > 255 {
		return nil, fmt.Errorf("assemble seccomp policy: the i386 section is too long (%d instructions)", len(compat))
	}
	if compat != nil {
		guard = append(guard, bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(arch.I386.ID), SkipFalse: uint8(len(compat))})
	} else {
		guard = append(guard, bpf.Jump{Skip: 0})
	}
	all := append(guard, compat...)
	all = append(all, bpf.RetConstant{Val: unix.SECCOMP_RET_KILL_PROCESS})
	all = append(all, insts...)
	raw, err := bpf.Assemble(all)
	if err != nil {
		return nil, fmt.Errorf("assemble seccomp BPF: %w", err)
	}
	prog := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		prog[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return prog, nil
}

// Offsets in struct seccomp_data: nr, arch, instruction_pointer, args.
const (
	nrOffset   = 0
	archOffset = 4
	argsOffset = 16
)

// compat386 is p for i386 system calls: denylist.I386Extra refused
// (EPERM) first, then each rule by name, with the syscall's i386 number,
// in the policy's order, then the default action. Conditions are
// translated as the policies use them: bits set in argument 0, read as
// the 32 bits an i386 call passes. The section ends in a return on every
// path.
//
// It refuses what it cannot translate faithfully rather than guess: a
// name i386 lacks (but denylist.NotOnI386), a name in two groups or with
// both plain and conditional rules (go-seccomp-bpf would fall through
// from one to the other), a condition of another kind.
func compat386(p seccomp.Policy) ([]bpf.Instruction, error) {
	ret := func(a seccomp.Action) bpf.Instruction {
		if a == seccomp.ActionErrno {
			a |= seccomp.Action(unix.EPERM) // as go-seccomp-bpf returns it
		}
		return bpf.RetConstant{Val: uint32(a)}
	}
	number := func(name string) (int, bool, error) {
		nr, ok := arch.I386.SyscallNames[name]
		if !ok {
			if slices.Contains(denylist.NotOnI386, name) {
				return 0, false, nil
			}
			return 0, false, fmt.Errorf("%s: no such i386 system call", name)
		}
		return nr, true, nil
	}
	out := []bpf.Instruction{bpf.LoadAbsolute{Off: nrOffset, Size: 4}}
	seen := map[string]bool{}
	claim := func(name string) error {
		if seen[name] {
			return fmt.Errorf("%s: in more than one rule group", name)
		}
		seen[name] = true
		return nil
	}
	groups := append([]seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: denylist.I386Extra}}, p.Syscalls...)
	for _, g := range groups {
		for _, name := range g.Names {
			if err := claim(name); err != nil {
				return nil, err
			}
			nr, ok, err := number(name)
			if err != nil {
				return nil, err
			}
			if ok {
				out = append(out,
					bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 1},
					ret(g.Action))
			}
		}
		// Rules on one name are alternatives: any of their masks. Each
		// rule has one condition, bits set in an argument (any of them,
		// as go-seccomp-bpf reads BitsSet), the same for every rule of
		// the name.
		var order []string
		masks := map[string]uint64{}
		argOf := map[string]uint32{}
		for _, nc := range g.NamesWithCondtions {
			if len(nc.Conditions) != 1 {
				return nil, fmt.Errorf("%s: one condition per rule is translated (got %d)", nc.Name, len(nc.Conditions))
			}
			c := nc.Conditions[0]
			if c.Argument > 5 || c.Operation != seccomp.BitsSet || c.Value == 0 || c.Value>>32 != 0 {
				return nil, fmt.Errorf("%s: only bits set in an argument are translated (got %+v)", nc.Name, c)
			}
			if _, ok := masks[nc.Name]; !ok {
				if err := claim(nc.Name); err != nil {
					return nil, err
				}
				order = append(order, nc.Name)
				argOf[nc.Name] = c.Argument
			} else if argOf[nc.Name] != c.Argument {
				return nil, fmt.Errorf("%s: rules on arguments %d and %d", nc.Name, argOf[nc.Name], c.Argument)
			}
			masks[nc.Name] |= c.Value
		}
		for _, name := range order {
			nr, ok, err := number(name)
			if err != nil {
				return nil, err
			}
			if !ok {
				continue
			}
			// Not this syscall: skip the four below. Else the action when
			// a bit of the mask is set in the argument (its low 32 bits,
			// all an i386 call passes), the default otherwise (decided
			// here: A no longer holds the number).
			out = append(out,
				bpf.JumpIf{Cond: bpf.JumpEqual, Val: uint32(nr), SkipFalse: 4},
				bpf.LoadAbsolute{Off: argsOffset + 8*argOf[name], Size: 4},
				bpf.JumpIf{Cond: bpf.JumpBitsSet, Val: uint32(masks[name]), SkipFalse: 1},
				ret(g.Action),
				ret(p.DefaultAction))
		}
	}
	return append(out, ret(p.DefaultAction)), nil
}
