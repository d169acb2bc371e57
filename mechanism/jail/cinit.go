package jail

import (
	"os"
	"sync"
)

// initEnv, set to "go", makes the manager start the Go init even where the
// C init is linked (tests of the fallback; a way around a suspected bug).
const initEnv = "MANAGOAT_JAIL_INIT"

// useCInit says whether a sandbox born restricted gets the C init.
func useCInit() bool { return cInitLinked && os.Getenv(initEnv) != "go" }

// Layout of cinit.c's struct ci_config.
const (
	cInitMagic   = 0x4943474d // "MGCI"
	cInitVersion = 1
)

// managerSeccomp is the filter, assembled once per manager process and
// handed to every C init (the Go init assembles its own).
var managerSeccomp = sync.OnceValues(assembleSeccomp)

// cInitConfig encodes what the C init reads from fdConfig: the header of
// cinit.c's struct ci_config, then the seccomp program.
func cInitConfig(lc launchConfig, prog seccompProgram) []byte {
	want := capData(keepCaps)
	var flags uint32
	if lc.Rootless {
		flags |= 1
	}
	b := make([]byte, 0, 32+8*len(prog))
	for _, v := range []uint32{cInitMagic, cInitVersion, uint32(lc.UID), uint32(lc.GID), flags,
		want[0].Permitted, want[1].Permitted, uint32(len(prog))} {
		b = ne.AppendUint32(b, v)
	}
	for _, f := range prog {
		b = ne.AppendUint16(b, f.Code)
		b = append(b, f.Jt, f.Jf)
		b = ne.AppendUint32(b, f.K)
	}
	return b
}
