//go:build amd64

package seccompbpf

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"unsafe"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/internal/denylist/policy"
	"github.com/managoat/managoat/mechanism/internal/seccompbpf/internal/compat"
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
	switch os.Getenv(childEnv) {
	case "":
		os.Exit(m.Run())
	case "probe":
		fmt.Println(compat.Syscall32(20, 0, 0, 0) == uintptr(os.Getpid()))
		os.Exit(0)
	default:
		os.Exit(filteredChild())
	}
}

const childEnv = "SECCOMPBPF_TEST_CHILD"

// TestJailProgramFilters loads the generated jail program in a child
// process and tries what it must refuse and allow; last, an i386 call
// (int $0x80), which must kill the process: the rules know only x86-64's
// numbers, and an i386 unshare or keyctl would otherwise pass.
func TestJailProgramFilters(t *testing.T) {
	// Without the kernel's IA32 emulation, int $0x80 faults whatever the
	// filter says: there is nothing to refuse.
	probe := exec.Command(os.Args[0], "-test.run=^$")
	probe.Env = append(os.Environ(), childEnv+"=probe")
	out, err := probe.Output()
	testenv.Require(t, err == nil && string(out) == "true\n", fmt.Sprintf("the kernel runs no i386 system calls (IA32 emulation off): %v %q", err, out))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err = cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v\n%s", err, out)
	}
	ws, _ := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGSYS {
		t.Errorf("the i386 call did not kill the child with SIGSYS: %v", err)
	}
	want := "unshare: operation not permitted\nmount: operation not permitted\nclone3: function not implemented\ngetpid: allowed\ni386 getpid: trying\n"
	if string(out) != want {
		t.Errorf("child said:\n%s\nwant:\n%s", out, want)
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
	_, _, e = unix.Syscall(unix.SYS_GETPID, 0, 0, 0)
	say("getpid", errnoErr(e))
	fmt.Println("i386 getpid: trying")
	os.Stdout.Sync()
	compat.Syscall32(20, 0, 0, 0) // i386 getpid
	fmt.Println("i386 getpid: allowed")
	return 0
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}
