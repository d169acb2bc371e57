package hostfacts

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism/internal/compat"
)

// runRole is the child TryI386 starts: it loads the filter it was given
// (on this thread, which the call is made from), makes the one i386 call,
// prints what it returned and exits. It never returns.
func runRole(spec string) {
	runtime.LockOSThread()
	var nr, a1, a2, a3 uint32
	if _, err := fmt.Sscanf(spec, "i386 %d %d %d %d", &nr, &a1, &a2, &a3); err != nil {
		fmt.Printf("bad %s %q: %v\n", Role, spec, err)
		os.Exit(2)
	}
	if f := os.Getenv(roleFilter); f != "" {
		var prog []unix.SockFilter
		for _, ins := range strings.Split(strings.TrimSuffix(f, ";"), ";") {
			var s unix.SockFilter
			if _, err := fmt.Sscanf(ins, "%d,%d,%d,%d", &s.Code, &s.Jt, &s.Jf, &s.K); err != nil {
				fmt.Printf("bad filter %q: %v\n", ins, err)
				os.Exit(2)
			}
			prog = append(prog, s)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fmt.Println("no_new_privs:", err)
			os.Exit(2)
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			fmt.Println("seccomp:", e)
			os.Exit(2)
		}
	}
	// Without IA32 emulation int $0x80 is a general-protection fault: the
	// kernel sends SIGSEGV, which Go's handler turns into a crash (exit 2,
	// a goroutine dump), not the signal the parent reads. The default
	// action, set here with the raw system call (os/signal cannot reset a
	// synchronous signal), ends the child by SIGSEGV itself.
	var dfl struct{ handler, flags, restorer, mask uint64 } // the kernel's sigaction: SIG_DFL, no flags
	if _, _, e := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGSEGV), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0); e != 0 {
		fmt.Println("rt_sigaction:", e)
		os.Exit(2)
	}
	r := int32(uint32(compat.Syscall32(uintptr(nr), uintptr(a1), uintptr(a2), uintptr(a3))))
	fmt.Printf("returned %d\n", r)
	os.Exit(0)
}
