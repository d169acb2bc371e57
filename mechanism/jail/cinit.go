package jail

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// initEnv picks the init of a sandbox born restricted: "standalone" (the
// embedded C init, the default where there is one), "c" (the C init
// linked into this binary by cgo, the default otherwise) or "go" (the Go
// init, always available). Meant for tests of each and as a way around a
// suspected bug; a choice this binary cannot honour falls back in that
// order.
const initEnv = "MANAGOAT_JAIL_INIT"

// The inits' names, as initEnv takes them.
const (
	initStandalone = "standalone"
	initLinked     = "c"
	initGo         = "go"
)

// initMode is the init a sandbox born restricted gets.
func initMode() string {
	want := os.Getenv(initEnv)
	if want == initGo {
		return initGo
	}
	if want != initLinked {
		if _, err := standaloneInit(); err == nil {
			return initStandalone
		}
	}
	if cInitLinked {
		return initLinked
	}
	return initGo
}

// InitDescription says which init a sandbox born restricted gets in this
// process (see MANAGOAT_JAIL_INIT in the package doc), and why when it is
// not the first choice; for managoat doctor.
func InitDescription() string {
	why := ""
	if v := os.Getenv(initEnv); v != "" {
		why = " (" + initEnv + "=" + v + ")"
	} else if _, err := standaloneInit(); err != nil {
		why = " (no standalone init: " + err.Error() + ")"
	}
	switch initMode() {
	case initStandalone:
		return "a standalone C program with no C library, embedded, run from a sealed memory file" + why
	case initLinked:
		return "C, the constructor cgo linked into this binary" + why
	}
	if !cInitLinked && why == "" {
		why = " (built without cgo)"
	}
	return "Go" + why
}

// standaloneInit is a sealed memory file holding the standalone C init,
// made once per process. The init is executed from it rather than from
// this whole binary: an 18 KiB static program with no C library is ready
// in a fraction of the time a 13 MiB dynamically linked one takes to be
// loaded (cinit_rt.c). A host that refuses to execute memory files
// (vm.memfd_noexec) gets the linked init.
//
// The init is started with the file among its ExtraFiles and executed as
// /proc/self/fd/<its number there>, never by its number in this process:
// os/exec's child moves descriptors up past the highest one it passes
// before it execs, onto whatever numbers are there, and this file's
// number was one of them now and then (a pipe was executed: EACCES).
var standaloneInit = sync.OnceValues(func() (*os.File, error) {
	if len(standaloneInitELF) == 0 {
		return nil, fmt.Errorf("no standalone init for this architecture")
	}
	// MFD_EXEC says so where vm.memfd_noexec=1 would otherwise seal it
	// non-executable; a kernel older than 6.3 refuses the flag.
	fd, err := unix.MemfdCreate("managoat-jail-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_EXEC)
	if err == unix.EINVAL {
		fd, err = unix.MemfdCreate("managoat-jail-init", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	fail := func(err error) (*os.File, error) {
		unix.Close(fd)
		return nil, err
	}
	for b := standaloneInitELF; len(b) > 0; {
		n, err := unix.Write(fd, b)
		if err != nil {
			return fail(fmt.Errorf("write the standalone init: %w", err))
		}
		b = b[n:]
	}
	// Executable by all: a mapped sandbox's init execs it as its user
	// namespace's root, host uid base (userns.go); only this process
	// (and root) can reach the descriptor.
	if err := unix.Fchmod(fd, 0o555); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&0o100 == 0 {
		return fail(fmt.Errorf("the standalone init cannot be executed from a memory file here"))
	}
	// Sealed: nothing can change what every later start executes.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		return fail(fmt.Errorf("seal the standalone init: %w", err))
	}
	return os.NewFile(uintptr(fd), "managoat-jail-init"), nil
})

// Layout of cinit.c's struct ci_config.
const (
	cInitMagic   = 0x4943474d // "MGCI"
	cInitVersion = 2
)

// managerSeccomp is the filter, assembled once per manager process and
// handed to every C init (the Go init assembles its own).
var managerSeccomp = sync.OnceValues(assembleSeccomp)

// managerSeccompMounts is managerSeccomp for sandboxes with a read-write
// host mount (seccompFor).
var managerSeccompMounts = sync.OnceValues(assembleSeccompMounts)

// cInitConfig encodes what the C init reads from fdConfig: the header of
// cinit.c's struct ci_config, then the seccomp program.
func cInitConfig(lc launchConfig, prog seccompProgram) []byte {
	want := capData(keepFor(lc))
	var flags uint32
	if lc.Rootless {
		flags |= 1
	}
	if lc.IDBase != 0 {
		flags |= 2 // root of its own user namespace: lower_caps
	}
	if lc.joinUserns {
		flags |= 4 // join it at descriptor 6 first: join_userns
	}
	if lc.unshareUserns {
		flags |= 8 // make it, wait for the maps: unshare_userns
	}
	b := make([]byte, 0, 36+8*len(prog))
	for _, v := range []uint32{cInitMagic, cInitVersion, uint32(lc.UID), uint32(lc.GID), flags,
		want[0].Permitted, want[1].Permitted, uint32(len(prog)), uint32(lc.IDBase)} {
		b = ne.AppendUint32(b, v)
	}
	for _, f := range prog {
		b = ne.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = ne.AppendUint32(b, f.K)
	}
	return b
}
