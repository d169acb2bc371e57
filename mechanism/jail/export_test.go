package jail

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// InitEnv selects the init (initEnv).
const InitEnv = initEnv

// InitModes are the inits this test binary can start: "standalone" (the
// embedded C init, the default where there is one), "c" (linked by cgo)
// and "go".
func InitModes() []string {
	var modes []string
	if _, err := standaloneInit(); err == nil {
		modes = append(modes, initStandalone)
	}
	if cInitLinked {
		modes = append(modes, initLinked)
	}
	return append(modes, initGo)
}

// SetOrphanAge sets how old a leftover must be for SweepOrphans until t
// ends.
func SetOrphanAge(t interface{ Cleanup(func()) }, d time.Duration) {
	old := orphanAge
	orphanAge = d
	t.Cleanup(func() { orphanAge = old })
}

// CgroupName is the name of the cgroups of sandbox id of j.
func CgroupName(j *Jail, id string) string { return cgroupPrefix + j.hash + "-" + id }

// SetOrphanScope limits the cgroups SweepOrphans looks at to names until t
// ends (a sweep of other tests' cgroups, in flight, would hurt them).
func SetOrphanScope(t interface{ Cleanup(func()) }, names ...string) {
	orphanScope = func(n string) bool {
		for _, m := range names {
			if n == m {
				return true
			}
		}
		return false
	}
	t.Cleanup(func() { orphanScope = nil })
}

// BindTestSocket makes a unix seqpacket socket bound at path, listening
// when listen, and returns its descriptor (a control socket's kind).
func BindTestSocket(t testing.TB, path string, listen bool) int {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		unix.Close(fd)
		t.Fatal(err)
	}
	if listen {
		if err := unix.Listen(fd, 4); err != nil {
			unix.Close(fd)
			t.Fatal(err)
		}
	}
	return fd
}

// SetPhaseHook calls f at each step of a start (phaseHook) until t ends;
// set it before the jail starts anything.
func SetPhaseHook(t interface{ Cleanup(func()) }, f func(step string)) {
	phaseHook = f
	t.Cleanup(func() { phaseHook = nil })
}
