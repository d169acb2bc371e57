package jail

import (
	"fmt"
	"runtime"
	"unsafe"

	"github.com/managoat/managoat/mechanism/internal/seccompbpf"
	"golang.org/x/sys/unix"
)

// seccompProgram is the assembled filter (seccompbpf.Jail: the deny-list,
// namespace-making clones, and clone3, whose flags a filter cannot read,
// answered ENOSYS so libc falls back to clone). It is loaded on every
// thread of the init (TSYNC); every process it starts inherits it.
type seccompProgram []unix.SockFilter

func assembleSeccomp() (seccompProgram, error) {
	prog, err := seccompbpf.Jail()
	return seccompProgram(prog), err
}

// assembleSeccompMounts is the filter of a sandbox with a read-write host
// mount (seccompbpf.JailMounts): besides, no set-user-ID or set-group-ID
// mode, since a file the workload makes there is the host's (mounts.go).
func assembleSeccompMounts() (seccompProgram, error) {
	prog, err := seccompbpf.JailMounts()
	return seccompProgram(prog), err
}

// seccompFor assembles the filter of a sandbox started with lc.
func seccompFor(lc launchConfig) (seccompProgram, error) {
	if hasWritableMount(lc.Mounts) {
		return assembleSeccompMounts()
	}
	return assembleSeccomp()
}

// load sets no_new_privs and loads the filter on every thread (TSYNC).
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
