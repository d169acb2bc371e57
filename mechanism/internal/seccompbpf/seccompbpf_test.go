//go:build amd64

package seccompbpf

import (
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"github.com/managoat/managoat/mechanism/internal/denylist/policy"
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

// TestJailProgramFilters loads the generated jail program on a thread of
// its own (discarded after) and tries what it must refuse and allow.
func TestJailProgramFilters(t *testing.T) {
	prog, err := Jail()
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		unshare, clone3, mount, getpid error
		pid                            int
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		var r result
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			r.getpid = err
			done <- r
			return
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			r.getpid = e
			done <- r
			return
		}
		_, _, e := unix.Syscall(unix.SYS_UNSHARE, unix.CLONE_NEWUTS, 0, 0)
		r.unshare = errnoErr(e)
		_, _, e = unix.Syscall(unix.SYS_CLONE3, 0, 0, 0)
		r.clone3 = errnoErr(e)
		r.mount = unix.Mount("none", "/nonexistent", "tmpfs", 0, "")
		r.pid = unix.Getpid()
		done <- r
	}()
	r := <-done
	if r.getpid != nil {
		t.Fatalf("load the filter: %v", r.getpid)
	}
	if r.unshare != unix.EPERM || r.mount != unix.EPERM {
		t.Errorf("unshare: %v, mount: %v; want EPERM for both", r.unshare, r.mount)
	}
	if r.clone3 != unix.ENOSYS {
		t.Errorf("clone3: %v, want ENOSYS (RET_TRACE without a tracer)", r.clone3)
	}
	if r.pid != unix.Getpid() {
		t.Errorf("getpid on the filtered thread: %d", r.pid)
	}
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
