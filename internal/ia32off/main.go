// Command ia32off runs a command as if the kernel had no IA32 emulation:
//
//	go run ./internal/ia32off -- env CI=true go test -race -count=1 ./...
//
// On a kernel without IA32 emulation (ia32_emulation=false, or built
// without it) an x86-64 process's int $0x80 faults and no i386 system call
// runs. ia32off loads a seccomp filter that kills the process at its first
// i386 system call (SECCOMP_RET_KILL_PROCESS on AUDIT_ARCH_I386, every
// other call allowed) and executes the command under it; the filter is
// inherited by every process the command starts, sandboxes included, and
// stacks under any filter they load (the kernel takes the strictest
// verdict). What the tests rely on is the same either way: no i386 call
// returns, and the process that tried ends by a signal (SIGSYS here,
// SIGSEGV on such a kernel). hostfacts' IA32 probe then reports the
// feature absent, and the tests that depend on it take the path they take
// on such a host.
package main

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: ia32off [--] command [args...]")
		os.Exit(2)
	}
	if runtime.GOARCH != "amd64" {
		fmt.Fprintln(os.Stderr, "ia32off: only x86-64 has an i386 interface")
		os.Exit(2)
	}
	path, err := exec.LookPath(args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "ia32off:", err)
		os.Exit(127)
	}
	runtime.LockOSThread()
	const archI386 = 0x40000003 // AUDIT_ARCH_I386
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 4}, // seccomp_data.arch
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, K: archI386, Jt: 0, Jf: 1},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_KILL_PROCESS},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
	}
	if os.Geteuid() != 0 {
		// Without CAP_SYS_ADMIN the kernel takes a filter only with
		// no_new_privs (then set-uid programs run without their privilege).
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "ia32off: no_new_privs:", err)
			os.Exit(1)
		}
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		fmt.Fprintln(os.Stderr, "ia32off: seccomp:", e)
		os.Exit(1)
	}
	err = syscall.Exec(path, args, os.Environ())
	fmt.Fprintln(os.Stderr, "ia32off:", err)
	os.Exit(126)
}
