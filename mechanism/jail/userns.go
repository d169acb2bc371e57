package jail

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/mechanism"
)

// Each sandbox of a root manager runs in a user namespace of its own that
// maps idRangeSize uids and gids (0..65535 inside) to a range of the host
// that no other sandbox, host user or subordinate-id range (/etc/subuid,
// /etc/subgid) uses. The ranges are taken between idRangeFirst and
// idRangeLimit: above the ranges systemd-nspawn hands out (below
// 0x70000000) and below systemd's "foreign" range (0x7FFE0000) and 2^31,
// which many tools take for a negative id.
const (
	idRangeSize  = 1 << 16
	idRangeFirst = 0x70000000
	idRangeLimit = 0x7FFE0000
)

// DefaultIDMapDir is where a root manager claims the sandboxes' id ranges
// (Config.IDMapDir): one file per range, naming the sandbox's state
// directory. It is host-wide, whatever the StateDir, so that two jails
// never give one range twice, and persistent (ranges are kept across a
// reboot with the sandboxes' state).
const DefaultIDMapDir = "/var/lib/managoat/idmap"

// usernsSupport reports why sandboxes of this process cannot get a user
// namespace of their own (nil when they can): the manager must be root
// and the init born restricted (procfs pidns option, Linux 6.18), because
// only then is the sandbox's tree built by the manager, which keeps the
// mount, network, uts and ipc namespaces owned by the host (the sandbox's
// root holds no capability over them).
func (j *Jail) usernsSupport() error {
	if j.rootless {
		return errors.New("the manager is not root: the workload is the caller's own uid, in a user namespace mapping only it")
	}
	if j.cfg.IDMapDir == "-" {
		return errors.New("turned off (Config.IDMapDir \"-\")")
	}
	if err := mechanism.ProcPidnsOption(); err != nil {
		return fmt.Errorf("the kernel's procfs lacks the pidns mount option (Linux 6.18), so the init is not born restricted: %v", err)
	}
	return usernsKernel()
}

var usernsKernel = sync.OnceValue(func() error {
	b, err := os.ReadFile("/proc/sys/user/max_user_namespaces")
	if err != nil {
		return fmt.Errorf("no user namespaces: %v", err)
	}
	if strings.TrimSpace(string(b)) == "0" {
		return errors.New("user namespaces are disabled (user.max_user_namespaces = 0)")
	}
	return nil
})

// UsernsDescription says how sandboxes started by a root manager in this
// process are mapped, and what they lack and why; for managoat doctor.
func UsernsDescription() string {
	j := &Jail{rootless: os.Geteuid() != 0, cfg: Config{IDMapDir: DefaultIDMapDir}}
	if j.rootless {
		return fmt.Sprintf("no uid range of their own (the manager is not root): the workload is root of a user namespace that maps only the caller's uid %d, so it is that uid on the host", os.Geteuid())
	}
	if err := j.usernsSupport(); err != nil {
		return "no uid range of their own: " + err.Error() + "; the workload runs as host uid 1000 (or the image's user)"
	}
	if err := registryUsable(DefaultIDMapDir); err != nil {
		return "no uid range of their own: " + err.Error() + "; the workload runs as host uid 1000 (or the image's user)"
	}
	s := "a user namespace each, mapping 65536 uids and gids to a range of the host of its own (claimed in " + DefaultIDMapDir + ")"
	s += "; host mounts (-v) are idmapped so the source's owner is the workload (one whose file system cannot be idmapped is refused unless MANAGOAT_JAIL_UNMAPPED_MOUNTS=1, which runs it as host uid 1000)"
	if err := idmapKernel(); err != nil {
		return s + "; an image's workload cannot be root of it: " + err.Error()
	}
	return s + "; an image's workload may be its root, on an idmapped image layer under its own overlay"
}

// registryUsable reports why the id range registry reg cannot be used.
func registryUsable(reg string) error {
	if err := os.MkdirAll(reg, 0o700); err != nil {
		return fmt.Errorf("the uid range registry %s cannot be made: %v", reg, err)
	}
	if err := unix.Access(reg, unix.W_OK); err != nil {
		return fmt.Errorf("the uid range registry %s is not writable: %v", reg, err)
	}
	return nil
}

// claimRange allocates a free id range for the sandbox whose state
// directory is owner and returns its first host id. The claim is a file
// created in the registry under its lock; a claim whose sandbox is gone
// (its directory removed, or its state naming another range) is taken
// over.
func (j *Jail) claimRange(ctx context.Context, owner string) (int, error) {
	reg := j.cfg.IDMapDir
	if err := os.MkdirAll(reg, 0o700); err != nil {
		return 0, fmt.Errorf("id range registry: %w", err)
	}
	unlock, err := flock.Lock(ctx, reg)
	if err != nil {
		return 0, err
	}
	defer unlock()
	sweepRanges(reg)
	taken := hostIDRanges()
	// The search starts at a place of the owner's (a hash of its path)
	// and wraps around: with many sandboxes a claim does not read every
	// claim before it.
	n, start := idRangeCount, rangeStart(owner)
	for i := range n {
		base := idRangeFirst + (start+i)%n*idRangeSize
		if overlaps(taken, base) {
			continue
		}
		p := filepath.Join(reg, strconv.Itoa(base))
		b, err := os.ReadFile(p)
		if err == nil && !staleClaim(string(b), base) {
			continue
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return 0, err
		}
		if err := os.WriteFile(p+".tmp", []byte(owner), 0o600); err != nil {
			return 0, err
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			return 0, err
		}
		return base, nil
	}
	return 0, &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{Name: mechanism.PrivilegeSeparation,
		Detail: fmt.Sprintf("no free uid range of %d ids left between %d and %d (%s)", idRangeSize, idRangeFirst, idRangeLimit, reg)}}}
}

// idRangeCount is how many ranges there are to give.
const idRangeCount = (idRangeLimit - idRangeFirst) / idRangeSize

// rangeStart is where claimRange's search for owner starts (an index).
func rangeStart(owner string) int {
	h := fnv.New32a()
	h.Write([]byte(owner))
	return int(h.Sum32() % idRangeCount)
}

// lastRangeSweep is when this process last swept the registry (unix
// seconds).
var lastRangeSweep atomic.Int64

// rangeSweepEvery is how often the registry is swept (sweepRanges).
const rangeSweepEvery = 10 * time.Minute

// sweptName is the registry's mark of its last sweep: its modification
// time is when (by any process).
const sweptName = ".swept"

// sweepRanges removes, at most every ten minutes per host, the claims of
// sandboxes that are gone without a Destroy (their state directory
// removed: a test's temporary directory, a process killed half-way), so
// the registry holds the live ones. The caller holds its lock. The sweep
// reads every claim and its sandbox's state, so its period is kept in
// the registry (sweptName), not only in this process: a CLI command is a
// process of its own, and with one sweep per process each create read
// the state of every sandbox on the host (1,000 sandboxes: a create took
// twice as long as with 250). A claim left stale until the next sweep
// costs nothing: claimRange judges the claim at the range it would take
// (staleClaim) whether or not a sweep removed it.
func sweepRanges(reg string) {
	now := time.Now().Unix()
	if last := lastRangeSweep.Load(); now-last < int64(rangeSweepEvery/time.Second) || !lastRangeSweep.CompareAndSwap(last, now) {
		return
	}
	mark := filepath.Join(reg, sweptName)
	if fi, err := os.Stat(mark); err == nil && time.Since(fi.ModTime()) < rangeSweepEvery && !fi.ModTime().After(time.Now()) {
		return // another process swept lately
	}
	if err := os.WriteFile(mark, nil, 0o600); err == nil {
		t := time.Now()
		_ = os.Chtimes(mark, t, t)
	}
	ents, err := os.ReadDir(reg)
	if err != nil {
		return
	}
	for _, e := range ents {
		base, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p := filepath.Join(reg, e.Name())
		if b, err := os.ReadFile(p); err == nil && staleClaim(string(b), base) {
			os.Remove(p)
		}
	}
}

// releaseRange drops owner's claim of the range at base.
func (j *Jail) releaseRange(ctx context.Context, owner string, base int) {
	if base == 0 {
		return
	}
	unlock, err := flock.Lock(ctx, j.cfg.IDMapDir)
	if err != nil {
		return
	}
	defer unlock()
	p := filepath.Join(j.cfg.IDMapDir, strconv.Itoa(base))
	if b, err := os.ReadFile(p); err == nil && string(b) == owner {
		os.Remove(p)
	}
}

// staleClaim: the sandbox that claimed base is gone, or no longer records
// it. A directory without a state yet is a Provision in progress.
func staleClaim(owner string, base int) bool {
	if _, err := os.Stat(owner); errors.Is(err, fs.ErrNotExist) {
		return true
	}
	st, err := readState(owner)
	if errors.Is(err, fs.ErrNotExist) {
		// A Provision cut short leaves no state: stale after a while.
		fi, serr := os.Stat(owner)
		return serr == nil && time.Since(fi.ModTime()) > 10*time.Minute
	}
	return err == nil && st.IDBase != base
}

// idFiles are the host's id files hostIDRanges reads (a test points
// them elsewhere).
var idFiles = struct{ subuid, subgid, passwd, group string }{"/etc/subuid", "/etc/subgid", "/etc/passwd", "/etc/group"}

// idSpan is a closed range of host ids.
type idSpan struct{ lo, hi int }

func overlaps(taken []idSpan, base int) bool {
	for _, s := range taken {
		if s.lo <= base+idRangeSize-1 && base <= s.hi {
			return true
		}
	}
	return false
}

// hostIDRanges are the host's ids in use or delegated: the subordinate
// ranges of /etc/subuid and /etc/subgid, and the ids of /etc/passwd and
// /etc/group.
func hostIDRanges() []idSpan {
	var out []idSpan
	for _, f := range []string{idFiles.subuid, idFiles.subgid} {
		eachLine(f, func(fields []string) {
			if len(fields) >= 3 {
				lo, err1 := strconv.Atoi(fields[1])
				n, err2 := strconv.Atoi(fields[2])
				if err1 == nil && err2 == nil && n > 0 {
					out = append(out, idSpan{lo, lo + n - 1})
				}
			}
		})
	}
	for _, f := range []string{idFiles.passwd, idFiles.group} {
		eachLine(f, func(fields []string) {
			if len(fields) >= 3 {
				if id, err := strconv.Atoi(fields[2]); err == nil {
					out = append(out, idSpan{id, id})
				}
			}
		})
	}
	return out
}

func eachLine(path string, f func(fields []string)) {
	fh, err := os.Open(path)
	if err != nil {
		return
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f(strings.Split(l, ":"))
	}
}

// OwnerOf returns the host uid and gid the workload of sandbox id owns
// its files as: base+uid for a sandbox with an id range of its own,
// else Owner's. A caller writing into the home directory through
// HostPath should chown to them.
func (j *Jail) OwnerOf(id string) (uid, gid int) {
	st, err := readState(j.dir(id))
	if err != nil {
		return j.Owner()
	}
	uid, gid = j.Owner()
	if !j.rootless {
		uid, gid = j.imageUser(st.Spec, st.IDBase != 0 && st.ImageRoot)
	}
	return st.IDBase + uid, st.IDBase + gid
}

// IDRange returns the first host id and the size of sandbox id's id
// range, or 0, 0 for a sandbox without one (rootless, a kernel without
// what it needs, or a sandbox provisioned before ranges existed).
func (j *Jail) IDRange(id string) (base, size int, err error) {
	if err := mechanism.ValidateID(id); err != nil {
		return 0, 0, err
	}
	st, err := readState(j.dir(id))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return 0, 0, fmt.Errorf("%w: %s", mechanism.ErrNotFound, id)
		}
		return 0, 0, err
	}
	if st.IDBase == 0 {
		return 0, 0, nil
	}
	return st.IDBase, idRangeSize, nil
}

// provisionRange gives st a range of its own where this host can start
// it mapped, and decides whether an image's workload may be root of it.
func (j *Jail) provisionRange(ctx context.Context, dir string, st *state) error {
	if j.usernsSupport() != nil || j.cfg.UID >= idRangeSize || j.cfg.GID >= idRangeSize {
		return nil
	}
	if img := st.Spec.Image; img != nil && (img.UID >= idRangeSize || img.GID >= idRangeSize) {
		return mechanism.Invalid("Image.UID", fmt.Sprintf("the image's user %d:%d is past the %d ids a sandbox maps", img.UID, img.GID, idRangeSize))
	}
	if err := registryUsable(j.cfg.IDMapDir); err != nil {
		// Unmapped, as before ranges existed (doctor says why): a
		// read-only /var/lib must not stop every sandbox.
		return nil
	}
	base, err := j.claimRange(ctx, dir)
	if err != nil {
		return err
	}
	st.IDBase = base
	if img := st.Spec.Image; img != nil && overlayOnce() {
		st.ImageRoot = idmapProbe(dir, img.Dir) == nil
	}
	if len(st.Spec.Mounts) == 0 {
		return nil
	}
	// Host mounts are idmapped to the workload (mounts.go): try it now.
	err = probeIdmaps(st.Spec.Mounts)
	if err == nil {
		return nil
	}
	j.releaseRange(context.WithoutCancel(ctx), dir, base)
	st.IDBase, st.ImageRoot = 0, false
	if j.cfg.UnmappedMounts {
		return nil // as before ranges existed: the workload is Config.UID on the host
	}
	return &mechanism.UnavailableError{Mechanism: "jail", Missing: []mechanism.Report{{Name: mechanism.HostMounts,
		Detail: err.Error() + "; a sandbox with host mounts keeps its own uid range only through idmapped mounts, so it is refused " +
			"(Config.UnmappedMounts, or MANAGOAT_JAIL_UNMAPPED_MOUNTS=1, runs it without one: its workload is then host uid " +
			strconv.Itoa(j.cfg.UID) + ", which may be a real account)"}}}
}

// mapRange makes the init's clone create its user namespace, mapping
// 0..65535 to base.. (uids and gids), and become its root before the
// exec: the init is uid 0 there, host uid base, and holds its
// capabilities there only. The mount, network, uts and ipc namespaces it
// is born in were made by the manager, so they stay the host's: root of
// the sandbox's namespace cannot mount, configure the network or set the
// hostname. setgroups stays allowed, so the init can drop its workloads'
// supplementary groups.
func mapRange(sys *syscall.SysProcAttr, base int) {
	if base == 0 {
		return
	}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: base, Size: idRangeSize}}
	sys.Cloneflags |= unix.CLONE_NEWUSER
	sys.UidMappings, sys.GidMappings = m, m
	sys.GidMappingsEnableSetgroups = true
	sys.Credential = &syscall.Credential{Uid: 0, Gid: 0}
}

// secbitNoSetuidFixup is SECBIT_NO_SETUID_FIXUP: a change of the
// thread's uids keeps its capabilities.
const secbitNoSetuidFixup = 1 << 2

// ownNewUserns makes the calling thread, a locked one the runtime
// discards afterwards (onDiscardedThread), the owner of the user
// namespace sys's clone makes (CLONE_NEWUSER, 0 mapped to base): its
// effective uid and gid become owner (base), its capabilities stay (the clone's
// writes of the maps need CAP_SETUID and CAP_SETGID in the host's
// namespace). The kernel charges the per-user counts of every process in
// a user namespace (inotify instances and watches, pending signals,
// message queue bytes, ...) to the namespace's owner in its parent too:
// owned by the host's root, every sandbox used up root's quotas and one
// another's (cinit.c become_owner does the same for the C init). The
// child is born in the new namespace, where its securebits are the
// default again, as root (base maps to 0). A sys without a new user
// namespace, or an owner of 0, is left alone.
func ownNewUserns(sys *syscall.SysProcAttr, owner int) error {
	if sys == nil || sys.Cloneflags&unix.CLONE_NEWUSER == 0 || owner <= 0 {
		return nil
	}
	base := uintptr(owner)
	keep := ^uintptr(0) // -1: unchanged
	if _, _, e := unix.RawSyscall(unix.SYS_PRCTL, unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0); e != 0 {
		return fmt.Errorf("securebits: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, keep, base, keep); e != 0 {
		return fmt.Errorf("become the owner of the sandbox's user namespace: setresgid: %w", e)
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, keep, base, keep); e != 0 {
		return fmt.Errorf("become the owner of the sandbox's user namespace: setresuid: %w", e)
	}
	return nil
}

// rootCaps are what a workload that is root of its sandbox's user
// namespace keeps besides keepCaps (the init holds them for it: under
// no_new_privs an exec grants no more than the init has). They act only
// on files whose owner and group the namespace maps, the sandbox's own:
// change owners (dpkg, apt's _apt), override permissions, as a
// container's root does.
var rootCaps = []int{unix.CAP_CHOWN, unix.CAP_DAC_OVERRIDE, unix.CAP_FOWNER, unix.CAP_FSETID}

// keepFor are the capabilities the init of lc is born with.
func keepFor(lc launchConfig) []int {
	if lc.IDBase != 0 && lc.UID == 0 {
		return append(append([]int{}, keepCaps...), rootCaps...)
	}
	return keepCaps
}

// rulesetFor is the Landlock ruleset of lc's init: newRuleset's, and for
// a mapped image sandbox, whose workload may write its whole root (the
// overlay's upper layer takes it), every write beneath that root too (the
// overlay, at lc.Root in the calling thread's mount namespace once the
// tree's thread has built it: rootReady), and nothing outside it, a host
// file reopened through a descriptor the workload was given included.
// The mapping keeps the host's files out of its reach besides: they are
// not owned by any id of its namespace.
//
// The thread that clones a mapped sandbox's Go init (born in a new user
// namespace: mapRange) writes the init's uid_map, setgroups and gid_map
// in the host's /proc after the clone, under the ruleset it has
// restricted itself with: there the ruleset lets it write files under
// the host's /proc, which no process of the sandbox can reach (its /proc
// is another instance, of its own pid namespace, and the host's is gone
// with the old root at the pivot). A C init makes its own (its maps
// written by the manager's thread, not T) or joins one made beforehand:
// no such rule.
func rulesetFor(lc launchConfig, rootReady <-chan struct{}, open func(sandboxPath string) (int, error)) (int, error) {
	mappedImage := lc.Image != nil && lc.Image.Mapped
	if mappedImage && rootReady == nil {
		return -1, errors.New("internal: a mapped image sandbox's tree is not built before its init")
	}
	rfd, err := newRuleset(open)
	if err != nil {
		return -1, err
	}
	add := func(path string, access uint64) error {
		pfd, err := unix.Open(path, unix.O_PATH|unix.O_CLOEXEC|unix.O_DIRECTORY, 0)
		if err != nil {
			return err
		}
		defer unix.Close(pfd)
		return ll.LandlockAddPathBeneathRule(rfd, &ll.PathBeneathAttr{AllowedAccess: access, ParentFd: pfd}, 0)
	}
	if mappedImage {
		<-rootReady
		abi, _ := ll.LandlockGetABIVersion()
		if err := add(lc.Root, mechanism.LandlockWriteAccess(abi)); err != nil {
			unix.Close(rfd)
			return -1, fmt.Errorf("landlock rule for the sandbox's root: %w", err)
		}
	}
	if lc.IDBase != 0 && !lc.joinUserns && !lc.unshareUserns {
		if err := add("/proc", ll.AccessFSWriteFile); err != nil {
			unix.Close(rfd)
			return -1, fmt.Errorf("landlock rule for the host's /proc: %w", err)
		}
	}
	return rfd, nil
}

// lowerCaps is cinit.c's lower_caps for the Go init: a mapped sandbox's
// init is born root of a user namespace of its own, with every
// capability there (bounding set included); it lowers them to
// keepFor(cfg) on every thread before anything else.
func lowerCaps(cfg launchConfig) error {
	if cfg.IDBase == 0 {
		return nil
	}
	keep := keepFor(cfg)
	var drop []int
	for c := 0; c <= lastCap(); c++ {
		if c != unix.CAP_SETPCAP && !slices.Contains(keep, c) {
			drop = append(drop, c)
		}
	}
	if !slices.Contains(keep, unix.CAP_SETPCAP) {
		drop = append(drop, unix.CAP_SETPCAP)
	}
	for _, c := range drop {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	data := capData(keep)
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(data)
	return nil
}

// shiftID is the host id that id of a home seeded before Provision
// becomes in a sandbox whose range starts at base: an id a sandbox would
// use inside (0..65535: a home copied from an image) is put in the range,
// and so is one of another sandbox's range (a home committed from a
// mapped sandbox), at the same place; any other is left alone.
func shiftID(id, base int) int {
	switch {
	case id < idRangeSize:
		return base + id
	case id >= idRangeFirst && id < idRangeLimit:
		return base + (id-idRangeFirst)%idRangeSize
	}
	return id
}

// shiftHome gives the entries of home (a Spec.HomeDir seeded before
// Provision: provider/local copies an image's /home/sprite there) the
// sandbox's ids, so its workload owns what it owned where they came
// from. Links are not followed; nothing runs in the sandbox yet.
func shiftHome(ctx context.Context, home string, base int) error {
	return filepath.WalkDir(home, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == home {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		uid, gid := shiftID(int(st.Uid), base), shiftID(int(st.Gid), base)
		if uid == int(st.Uid) && gid == int(st.Gid) {
			return nil
		}
		if err := unix.Lchown(p, uid, gid); err != nil {
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFLNK && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			// chown cleared them; a setuid bit stays cleared (nosuid
			// home), a setgid directory keeps its inheritance.
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return unix.Chmod(p, st.Mode&0o7777&^unix.S_ISUID)
			}
		}
		return nil
	})
}
