//go:build amd64

package seccompbpf

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/hostfacts"
	"github.com/managoat/managoat/mechanism/internal/denylist"
	"github.com/managoat/managoat/mechanism/internal/denylist/policy"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// TestGeneratedIsCurrent checks that programs_amd64.go is what the
// policies assemble to now.
func TestGeneratedIsCurrent(t *testing.T) {
	for _, c := range []struct {
		name string
		got  func() ([]unix.SockFilter, error)
		want func() ([]unix.SockFilter, error)
	}{
		{"jail", Jail, func() ([]unix.SockFilter, error) { return policy.Assemble(policy.Jail("amd64")) }},
		{"filter-exec", FilterExec, func() ([]unix.SockFilter, error) { return policy.Assemble(policy.FilterExec()) }},
	} {
		got, err := c.got()
		if err != nil {
			t.Fatal(err)
		}
		want, err := c.want()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: programs_amd64.go is stale (%d instructions, the policy assembles to %d): run go generate ./mechanism/internal/seccompbpf", c.name, len(got), len(want))
		}
	}
}

// TestMain runs the filter checks in a child process of this test binary
// (see TestJailProgramFilters) when asked to.
func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(filteredChild())
	}
	os.Exit(m.Run())
}

const childEnv = "SECCOMPBPF_TEST_CHILD"

// TestJailProgramFilters loads the generated jail program in a child
// process and tries what it must refuse and allow, in x86-64's calls and
// in x32's (ENOSYS); then, each in a child of its own (hostfacts.TryI386),
// in i386's through int $0x80. Each i386 call is chosen so that the kernel
// alone would answer otherwise (a personality query succeeds, CLONE_NEWNS
// with CLONE_FS is EINVAL, clone3 without arguments is EINVAL, keyctl on a
// missing key is ENOKEY), so an EPERM or ENOSYS is the filter's.
//
// Where the kernel runs no i386 system call (hostfacts.IA32 absent: IA32
// emulation off), nothing can pass the filter through one: the test then
// checks that each int $0x80 ends its process before any call returns,
// filter or not, and TestProgramsI386 checks the i386 half of the program
// in a userspace interpreter on every host.
func TestJailProgramFilters(t *testing.T) {
	testenv.RequireRoot(t) // clock_settime64 is EPERM for anyone else
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	want := `unshare: operation not permitted
mount: operation not permitted
clone3: function not implemented
io_uring_setup: operation not permitted
getpid: allowed
x32 getpid: function not implemented
`
	if string(out) != want {
		t.Errorf("child said:\n%s\nwant:\n%s", out, want)
	}

	prog, err := Jail()
	if err != nil {
		t.Fatal(err)
	}
	ia32 := hostfacts.Get(hostfacts.IA32)
	t.Logf("%s: %v (%s)", ia32.Name, ia32.Present, ia32.Detail)
	// i386 numbers: getpid 20, unshare 310, personality 136, keyctl 288,
	// clone 120, clone3 435, clock_settime64 404.
	for _, c := range []struct {
		name string
		nr   uint32
		args [3]uint32
		want string
	}{
		{"getpid", 20, [3]uint32{}, "allowed"},
		{"unshare", 310, [3]uint32{unix.CLONE_NEWUTS}, "operation not permitted"},
		{"personality", 136, [3]uint32{0xffffffff}, "operation not permitted"},
		{"keyctl", 288, [3]uint32{unix.KEYCTL_DESCRIBE, 0x7ffffff0}, "operation not permitted"},
		{"clone NEWNS", 120, [3]uint32{unix.CLONE_NEWNS | unix.CLONE_FS}, "operation not permitted"},
		// Allowed by the filter, refused by the kernel: CLONE_SIGHAND
		// needs CLONE_VM, so nothing is forked.
		{"clone plain", 120, [3]uint32{unix.CLONE_SIGHAND}, "invalid argument"},
		{"clone3", 435, [3]uint32{}, "function not implemented"},
		// An i386 call with no x86-64 namesake (denylist.I386Extra):
		// clock_settime64 would be EPERM without CAP_SYS_TIME too, so
		// this needs root to mean anything.
		{"clock_settime64", 404, [3]uint32{0xffff}, "operation not permitted"},
	} {
		o := hostfacts.TryI386(context.Background(), c.nr, c.args, prog)
		if o.Err != nil {
			t.Fatalf("i386 %s: %v", c.name, o.Err)
		}
		if !ia32.Present {
			// No IA32 emulation: int $0x80 faults (SIGSEGV), or a
			// seccomp filter of the caller's that stands in for the
			// missing emulation kills the process (SIGSYS).
			if o.Ran || (o.Signal != syscall.SIGSEGV && o.Signal != syscall.SIGSYS) {
				t.Errorf("i386 %s without IA32 emulation: %+v, want the process ended by SIGSEGV (or SIGSYS)", c.name, o)
			}
			continue
		}
		got := "allowed"
		if o.Signal != 0 {
			got = "ended by " + o.Signal.String()
		} else if o.Result < 0 && o.Result > -4096 {
			got = unix.Errno(-o.Result).Error()
		}
		if got != c.want {
			t.Errorf("i386 %s: %s, want %s", c.name, got, c.want)
		}
	}
}

// filteredChild loads the jail program on this thread (the process is
// thrown away after) and reports what each call returned.
func filteredChild() int {
	runtime.LockOSThread()
	prog, err := Jail()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("no_new_privs:", err)
		return 1
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		fmt.Println("seccomp:", e)
		return 1
	}
	say := func(name string, e error) {
		if e == nil {
			fmt.Println(name + ": allowed")
		} else {
			fmt.Println(name+":", e)
		}
	}
	_, _, e := unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUTS, 0, 0)
	say("unshare", errnoErr(e))
	say("mount", unix.Mount("none", "/nonexistent", "tmpfs", 0, ""))
	_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
	say("clone3", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_IO_URING_SETUP, 0, 0, 0) // EINVAL unfiltered
	say("io_uring_setup", errnoErr(e))
	_, _, e = unix.Syscall(unix.SYS_GETPID, 0, 0, 0)
	say("getpid", errnoErr(e))
	_, _, e = unix.Syscall(0x40000000|unix.SYS_GETPID, 0, 0, 0)
	say("x32 getpid", errnoErr(e))
	return 0
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// TestProgramsI386 runs both programs in x/net/bpf's interpreter on every
// i386 system call number below 1024, on every bit of clone's flags, on
// x32 and on foreign architectures, and checks each verdict against the
// deny-list and an i386 table that is not go-seccomp-bpf's
// (testdata/syscalls_386.txt): a rule the translation dropped, a wrong
// number, a wrong mask or a wrong return shows here.
func TestProgramsI386(t *testing.T) {
	table := map[string]uint32{}
	names := map[uint32]string{}
	b, err := os.ReadFile("testdata/syscalls_386.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		var name string
		var nr uint32
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		if _, err := fmt.Sscan(line, &name, &nr); err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		table[name], names[nr] = nr, name
	}
	denied := map[string]bool{}
	// What i386 alone has that does what a denied call does, stated here
	// again so that a name dropped from denylist.I386Extra shows.
	for _, n := range []string{"umount", "stime", "clock_settime64", "clock_adjtime64", "vm86", "vm86old"} {
		if !slices.Contains(denylist.I386Extra, n) {
			t.Errorf("%s is missing from denylist.I386Extra", n)
		}
	}
	for _, n := range append(denylist.Syscalls("amd64"), denylist.I386Extra...) {
		denied[n] = true
		if _, ok := table[n]; !ok && !slices.Contains(denylist.NotOnI386, n) {
			t.Errorf("denied %s has no i386 number, and is not listed in NotOnI386", n)
		}
	}
	const (
		archI386   = 0x40000003 // AUDIT_ARCH_I386
		archX86_64 = 0xc000003e // AUDIT_ARCH_X86_64
		allow      = unix.SECCOMP_RET_ALLOW
		eperm      = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys     = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	)
	for _, c := range []struct {
		name   string
		prog   func() ([]unix.SockFilter, error)
		clone3 uint32
		enosys []string // besides clone3
	}{
		{"jail", Jail, enosys, []string{"io_setup"}},
		{"jail-mounts", JailMounts, enosys, []string{"io_setup", "openat2"}},
		{"filter-exec", FilterExec, enosys, nil},
	} {
		prog, err := c.prog()
		if err != nil {
			t.Fatal(err)
		}
		raw := make([]bpf.RawInstruction, len(prog))
		for i, f := range prog {
			raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
		}
		insts, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatalf("%s: the program does not disassemble", c.name)
		}
		vm, err := bpf.NewVM(insts)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		// verdict runs the program on a seccomp_data, its words written
		// big-endian: the interpreter loads them so (the kernel loads
		// native-endian words; every load here is one whole word).
		verdict := func(arch, nr uint32, arg0 uint64) uint32 {
			var d [64]byte
			binary.BigEndian.PutUint32(d[0:], nr)
			binary.BigEndian.PutUint32(d[4:], arch)
			binary.BigEndian.PutUint32(d[16:], uint32(arg0))
			binary.BigEndian.PutUint32(d[20:], uint32(arg0>>32))
			v, err := vm.Run(d[:])
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			return uint32(v)
		}
		for nr := uint32(0); nr < 1024; nr++ {
			name := names[nr]
			want := uint32(allow)
			switch {
			case name == "clone":
				continue
			case name == "clone3":
				want = c.clone3
			case slices.Contains(c.enosys, name):
				want = enosys
			case c.name == "jail-mounts" && slices.ContainsFunc(policy.SetIDModeArgs("amd64"), func(m policy.ModeArg) bool { return m.Name == name }):
				continue // conditional on the mode: TestJailMountsRefusesSetIDModes
			case denied[name]:
				want = eperm
			}
			if got := verdict(archI386, nr, 0); got != want {
				t.Errorf("%s: i386 %d (%s) = %#x, want %#x", c.name, nr, name, got, want)
			}
		}
		for bit := 0; bit < 64; bit++ {
			flag := uint64(1) << bit
			want := uint32(allow)
			if flag&denylist.CloneNewMask != 0 {
				want = eperm
			}
			if bit >= 32 {
				want = allow // an i386 call passes 32 bits: the kernel never sees these
			}
			if got := verdict(archI386, table["clone"], flag); got != want {
				t.Errorf("%s: i386 clone(%#x) = %#x, want %#x", c.name, flag, got, want)
			}
		}
		if got := verdict(archI386, table["clone"], 0); got != allow {
			t.Errorf("%s: i386 clone(0) = %#x, want allow", c.name, got)
		}
		if got := verdict(archX86_64, 0x40000000|unix.SYS_GETPID, 0); got != enosys {
			t.Errorf("%s: x32 getpid = %#x, want ENOSYS", c.name, got)
		}
		if got := verdict(archX86_64, unix.SYS_GETPID, 0); got != allow {
			t.Errorf("%s: getpid = %#x, want allow", c.name, got)
		}
		if got := verdict(archX86_64, unix.SYS_UNSHARE, 0); got != eperm {
			t.Errorf("%s: unshare = %#x, want EPERM", c.name, got)
		}
		for _, arch := range []uint32{0, 0x40000028 /* ARM */, 0xc00000b7 /* AARCH64 */, archI386 | 0x80000000, 0xffffffff} {
			if got := verdict(arch, 20, 0); got != unix.SECCOMP_RET_KILL_PROCESS {
				t.Errorf("%s: arch %#x = %#x, want KILL_PROCESS", c.name, arch, got)
			}
		}
	}
}

// Every verdict of every program is one a filter the workload stacks on
// top cannot outrank and then undo: allow, an errno or a kill. When
// filters are stacked the kernel takes the verdict of highest precedence
// (kill, trap, errno, user_notif, trace, log, allow), so a workload's
// filter answering RET_USER_NOTIF for a call ours answered RET_TRACE or
// RET_LOG, and its supervisor's SECCOMP_USER_NOTIF_FLAG_CONTINUE, would
// run the call (clone3 was RET_TRACE: TestStackedFilterCannotUndoTheDenyList
// in package jail made a user namespace that way). Fails on the old
// jail program: a return of SECCOMP_RET_TRACE.
func TestNoVerdictAStackedFilterOutranks(t *testing.T) {
	for _, c := range []struct {
		name string
		prog func() ([]unix.SockFilter, error)
	}{{"jail", Jail}, {"jail-mounts", JailMounts}, {"filter-exec", FilterExec}} {
		prog, err := c.prog()
		if err != nil {
			t.Fatal(err)
		}
		rets := 0
		for i, f := range prog {
			if f.Code != 0x06 { // BPF_RET|BPF_K; a BPF_RET|BPF_A would be unknowable here
				if f.Code&0x07 == 0x06 {
					t.Errorf("%s: instruction %d returns a computed verdict (%#x)", c.name, i, f.Code)
				}
				continue
			}
			rets++
			switch action := f.K & unix.SECCOMP_RET_ACTION_FULL; action {
			case unix.SECCOMP_RET_ALLOW, unix.SECCOMP_RET_ERRNO, unix.SECCOMP_RET_KILL_PROCESS, unix.SECCOMP_RET_KILL_THREAD:
			default:
				t.Errorf("%s: instruction %d returns %#x: a stacked RET_USER_NOTIF outranks it", c.name, i, f.K)
			}
		}
		if rets == 0 {
			t.Fatalf("%s: no return found", c.name)
		}
	}
}

// TestJailMountsRefusesSetIDModes runs the program of a sandbox with a
// read-write mount in a userspace interpreter: a mode with S_ISUID or
// S_ISGID is EPERM in every call that sets one, in x86-64's and i386's
// numbers and at the mode's own argument, any other mode (and the jail's
// plain program) is allowed, openat2 is ENOSYS, and the deny-list holds
// as in Jail.
func TestJailMountsRefusesSetIDModes(t *testing.T) {
	const (
		archI386   = 0x40000003
		archX86_64 = 0xc000003e
		eperm      = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys     = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	)
	run := func(prog []unix.SockFilter) func(arch, nr uint32, args [6]uint64) uint32 {
		raw := make([]bpf.RawInstruction, len(prog))
		for i, f := range prog {
			raw[i] = bpf.RawInstruction{Op: f.Code, Jt: f.Jt, Jf: f.Jf, K: f.K}
		}
		insts, ok := bpf.Disassemble(raw)
		if !ok {
			t.Fatal("the program does not disassemble")
		}
		vm, err := bpf.NewVM(insts)
		if err != nil {
			t.Fatal(err)
		}
		return func(arch, nr uint32, args [6]uint64) uint32 {
			var d [64]byte
			binary.BigEndian.PutUint32(d[0:], nr)
			binary.BigEndian.PutUint32(d[4:], arch)
			for i, a := range args {
				// The interpreter loads big-endian words: the low half
				// of a little-endian u64 is the first word the kernel
				// loads, so put it there.
				binary.BigEndian.PutUint32(d[16+8*i:], uint32(a))
				binary.BigEndian.PutUint32(d[20+8*i:], uint32(a>>32))
			}
			v, err := vm.Run(d[:])
			if err != nil {
				t.Fatal(err)
			}
			return uint32(v)
		}
	}
	mounts, err := JailMounts()
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Jail()
	if err != nil {
		t.Fatal(err)
	}
	vm, vmPlain := run(mounts), run(plain)
	i386 := map[string]uint32{"fchmod": 94, "fchmodat": 306, "fchmodat2": 452, "openat": 295, "mknodat": 297,
		"chmod": 15, "open": 5, "creat": 8, "mknod": 14}
	x86 := map[string]uint32{"fchmod": unix.SYS_FCHMOD, "fchmodat": unix.SYS_FCHMODAT, "fchmodat2": 452, "openat": unix.SYS_OPENAT,
		"mknodat": unix.SYS_MKNODAT, "chmod": unix.SYS_CHMOD, "open": unix.SYS_OPEN, "creat": unix.SYS_CREAT, "mknod": unix.SYS_MKNOD}
	for _, c := range policy.SetIDModeArgs("amd64") {
		for _, a := range []struct {
			arch uint32
			nr   uint32
		}{{archX86_64, x86[c.Name]}, {archI386, i386[c.Name]}} {
			for mode, want := range map[uint64]uint32{0o4755: eperm, 0o2775: eperm, 0o6777: eperm, 0o755: unix.SECCOMP_RET_ALLOW, 0o1777: unix.SECCOMP_RET_ALLOW} {
				var args [6]uint64
				args[c.Arg] = mode
				if got := vm(a.arch, a.nr, args); got != want {
					t.Errorf("arch %#x %s(mode %#o at argument %d) = %#x, want %#x", a.arch, c.Name, mode, c.Arg, got, want)
				}
				if got := vmPlain(a.arch, a.nr, args); got != unix.SECCOMP_RET_ALLOW {
					t.Errorf("the plain jail program: arch %#x %s(mode %#o) = %#x, want allow", a.arch, c.Name, mode, got)
				}
				// The mode's bits in another argument (a path's address, a
				// descriptor, flags) are not a mode.
				var other [6]uint64
				other[(c.Arg+1)%6] = mode
				if got := vm(a.arch, a.nr, other); got != unix.SECCOMP_RET_ALLOW {
					t.Errorf("arch %#x %s with %#o in argument %d = %#x, want allow", a.arch, c.Name, mode, (c.Arg+1)%6, got)
				}
			}
		}
	}
	for _, a := range []struct{ arch, nr uint32 }{{archX86_64, unix.SYS_OPENAT2}, {archI386, 437}} {
		if got := vm(a.arch, a.nr, [6]uint64{}); got != enosys {
			t.Errorf("arch %#x openat2 = %#x, want ENOSYS", a.arch, got)
		}
	}
	if got := vm(archX86_64, unix.SYS_UNSHARE, [6]uint64{}); got != eperm {
		t.Errorf("unshare = %#x, want EPERM", got)
	}
	if got := vm(archX86_64, 435, [6]uint64{}); got != enosys {
		t.Errorf("clone3 = %#x, want ENOSYS", got)
	}
}
