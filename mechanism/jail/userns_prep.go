package jail

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"

	"golang.org/x/sys/unix"
)

// A mapped sandbox's init is not cloned into a new user namespace where
// that can be helped: os/exec cannot make one with vfork (the child must
// wait for its maps: a full fork, and a hand-over to the scheduler, ~1 ms
// a start here, several under load). A C init on the host's root makes it
// itself (unshare) and the manager maps it (mapUnshared). On an image the
// namespace must exist before the init, for the idmapped layer the tree
// is built on: usernsPrep makes it while Start goes on (holdUserns: the
// C init's program in its hold mode), and a C init joins it (setns). The Go init, whose runtime
// is threaded and can neither make nor join one, is born in a new one
// (mapRange).

// usernsPrep is a mapped image sandbox's user namespace, made while Start
// goes on.
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

// mapUnshared answers a C init that made its user namespace itself
// (flag 8, cinit.c unshare_userns) and said so on the ready pipe: it maps
// 0..65535 to base.. (uids and gids; setgroups stays allowed, a new
// namespace's default) in /proc/<pid>, tells the init ('m' on the config
// pipe, then its end) and returns the init's next line ("ready", or its
// error); an "error: ..." of its own when the maps could not be written.
func mapUnshared(pid, base int, cfgW *os.File, br *bufio.Reader) string {
	phase("unshared")
	m := fmt.Sprintf("0 %d %d\n", base, idRangeSize)
	var err error
	for _, f := range []string{"uid_map", "gid_map"} {
		if err = os.WriteFile("/proc/"+strconv.Itoa(pid)+"/"+f, []byte(m), 0); err != nil {
			break
		}
	}
	if err == nil {
		_, err = cfgW.Write([]byte{'m'})
	}
	cfgW.Close()
	phase("mapped")
	if err != nil {
		return "error: map the sandbox's user namespace: " + err.Error()
	}
	s, _ := br.ReadString('\n')
	return s
}
