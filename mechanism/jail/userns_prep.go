package jail

import (
	"fmt"
	"os"
	"os/exec"

	"golang.org/x/sys/unix"
)

// usernsPrep is a mapped sandbox's user namespace, made on its own
// thread while Start goes on (holdUserns), for a C init to join
// (setns) first thing: the init's clone then needs no new user
// namespace, which os/exec cannot make with vfork (the child must wait
// for its maps, and under load for the scheduler: ~3 ms a start here), and
// an image's idmapped layer can be mounted before the init exists (the
// tree is built while the init starts, as for any sandbox). The Go init,
// whose runtime is threaded and cannot join one, is born in a new one
// (mapRange).
type usernsPrep struct {
	done chan struct{}
	fd   int
	err  error
}

func newUsernsPrep(base int) *usernsPrep {
	u := &usernsPrep{done: make(chan struct{})}
	go func() {
		u.fd, u.err = makeUserns(base)
		close(u.done)
	}()
	return u
}

// wait returns the namespace's descriptor (the prep keeps it: dup it to
// hand it over).
func (u *usernsPrep) wait() (int, error) {
	<-u.done
	return u.fd, u.err
}

// release waits for the namespace and closes the prep's descriptor.
func (u *usernsPrep) release() {
	if u == nil {
		return
	}
	<-u.done
	if u.err == nil && u.fd >= 0 {
		unix.Close(u.fd)
		u.fd = -1
	}
}

// makeUserns makes a prep's namespace (a test makes it fail).
var makeUserns = holdUserns

// fdUserns is where a C init finds the user namespace to join
// (cinit.c's CI_FD_USERNS), past the three descriptors every init gets.
const fdUserns = fdReady + 1

// userNSFile hands a C init the user namespace rs made for it, as
// descriptor fdUserns; it reports whether it did (else a mapped sandbox's
// init is born in a new one, mapRange).
func userNSFile(cmd *exec.Cmd, rs *restrictedStart, cInit bool) (bool, error) {
	if rs == nil || rs.userns == nil || !cInit {
		return false, nil
	}
	ns, err := rs.userns.wait()
	if err != nil {
		// Where it cannot be made (the holder's ptrace refused, say),
		// the init is born in one (mapRange), as the Go init is; T's
		// ruleset let it write the maps (prepare decided alike). An
		// image's idmapped layer needed it: that start fails, saying so.
		return false, nil
	}
	dup, err := unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	f := os.NewFile(uintptr(dup), "userns")
	if len(cmd.ExtraFiles) != fdUserns-3 {
		f.Close()
		return false, fmt.Errorf("internal: the user namespace would be descriptor %d", 3+len(cmd.ExtraFiles))
	}
	cmd.ExtraFiles = append(cmd.ExtraFiles, f)
	rs.files = append(rs.files, f) // closed with the start (abortUnused)
	return true, nil
}
