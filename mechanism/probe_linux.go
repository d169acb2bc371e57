package mechanism

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism/internal/cgroups"
)

// HostProbe probes this Linux host. Each probe performs the operation a
// launch performs, in a throwaway form, and cleans up after itself:
//
//   - memory_cap, pids_cap, cpu_cap: create a cgroup under this process's
//     own cgroup (v1 or v2, whichever serves the controller), write a limit,
//     read it back, remove it; resource_limits is the three together.
//   - process_separation: clone /bin/true into a new pid namespace (plus a
//     user namespace when not root).
//   - filesystem_confinement: on a thread of its own, unshare a mount
//     namespace, mount a tmpfs root, bind /usr read-only, pivot_root into it
//     and see a write refused; the thread is then discarded.
//   - network_restriction: on a thread of its own, unshare a network
//     namespace, bring lo up, connect to a listener on lo, and see a connect
//     to an outside address fail.
//   - privilege_separation: run /bin/true as uid 65534 (as root) or in a
//     user namespace (otherwise), and set no_new_privs on a discarded thread.
//   - syscall_filter: load a seccomp filter on a discarded thread and see
//     the filtered call fail with EPERM.
//   - landlock: enforce a write-only ruleset on a discarded thread and see a
//     write outside the allowed directory refused.
//   - disk_quota: the storage directory's filesystem is mounted with quotas.
//   - time_budget, egress_allowlist: never from the host (a mechanism must
//     construct them).
//
// Namespace and mount probes without CAP_SYS_ADMIN fall back to cloning
// /bin/true into a user namespace plus the namespace in question.
type HostProbe struct {
	// StorageDir is where sandbox files would live (disk_quota looks at
	// its filesystem). Default os.TempDir().
	StorageDir string
}

// NewHostProber returns an uncached prober of this host.
func NewHostProber() *HostProbe { return &HostProbe{} }

// Probe implements Prober.
func (h *HostProbe) Probe(ctx context.Context, c Capability) (r Report) {
	r.Name = c
	defer func() {
		if p := recover(); p != nil {
			r = Report{Name: c, Detail: fmt.Sprintf("probe panicked: %v", p)}
		}
	}()
	if err := ctx.Err(); err != nil {
		return Report{Name: c, Detail: "not probed: " + err.Error()}
	}
	var ev string
	var err error
	switch c {
	case MemoryCap:
		ev, err = probeCgroup(cgroups.Limits{MemoryBytes: 64 << 20})
	case PidsCap:
		ev, err = probeCgroup(cgroups.Limits{Pids: 64})
	case CPUCap:
		ev, err = probeCgroup(cgroups.Limits{CPUMillis: 100})
	case ResourceLimits:
		ev, err = probeCgroup(cgroups.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUMillis: 100})
	case ProcessSeparation:
		ev, err = probeClone(unix.CLONE_NEWPID)
	case FilesystemConfinement:
		ev, err = probeMount()
	case NetworkRestriction:
		ev, err = probeNet()
	case PrivilegeSeparation:
		ev, err = probePriv()
	case SyscallFilter:
		ev, err = probeSeccomp()
	case Landlock:
		ev, err = probeLandlock()
	case DiskQuota:
		dir := h.StorageDir
		if dir == "" {
			dir = os.TempDir()
		}
		ev, err = probeQuota(dir)
	case TimeBudget:
		err = errors.New("a wall-clock budget is enforced by a mechanism's supervisor, never by the host; a mechanism must construct it")
	case EgressAllowlist:
		err = errors.New("a per-connection egress allowlist is built by a mechanism's network proxy, never by the host; a mechanism must construct it")
	case HostMounts:
		err = errors.New("host paths are bound into a sandbox by its mechanism, never by the host; a mechanism must construct it")
	default:
		err = fmt.Errorf("unknown capability; known: %v", Known)
	}
	if err != nil {
		return Report{Name: c, Detail: err.Error()}
	}
	return Report{Name: c, Available: true, Detail: ev}
}

var (
	layoutOnce sync.Once
	layout     *cgroups.Layout
	layoutErr  error
	probeSeq   atomic.Int64
)

// CgroupLayout returns this host's cgroup layout (detected once).
func CgroupLayout() (*cgroups.Layout, error) {
	layoutOnce.Do(func() { layout, layoutErr = cgroups.Detect() })
	return layout, layoutErr
}

func probeCgroup(lim cgroups.Limits) (string, error) {
	l, err := CgroupLayout()
	if err != nil {
		return "", fmt.Errorf("cannot read the cgroup layout: %w", err)
	}
	name := fmt.Sprintf("managoat-probe-%d-%d", os.Getpid(), probeSeq.Add(1))
	g, err := l.Create(name, lim)
	if err != nil {
		return "", fmt.Errorf("cgroup layout %s: %w", l.Mode, err)
	}
	defer g.Remove(context.Background())
	if err := g.Verify(lim, 0); err != nil {
		return "", fmt.Errorf("cgroup layout %s: limit written but not in force: %w", l.Mode, err)
	}
	var where []string
	if lim.MemoryBytes > 0 {
		where = append(where, "memory on "+l.Where("memory"))
	}
	if lim.Pids > 0 {
		where = append(where, "pids on "+l.Where("pids"))
	}
	if lim.CPUMillis > 0 {
		where = append(where, "cpu on "+l.Where("cpu"))
	}
	return fmt.Sprintf("cgroup layout %s: created a cgroup, wrote and read back the limit (%s)", l.Mode, strings.Join(where, ", ")), nil
}

func isPrivileged() bool {
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[0].Effective&(1<<unix.CAP_SYS_ADMIN) != 0
}

func probeClone(flags uintptr) (string, error) {
	cmd := exec.Command("/bin/true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags}
	how := "as a privileged process"
	if !isPrivileged() {
		cmd.SysProcAttr.Cloneflags |= unix.CLONE_NEWUSER
		cmd.SysProcAttr.UidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}}
		cmd.SysProcAttr.GidMappings = []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}}
		how = "inside a new user namespace"
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("clone of /bin/true with namespace flags %#x %s failed: %w", flags, how, err)
	}
	return fmt.Sprintf("cloned /bin/true into new namespaces (flags %#x) %s", flags, how), nil
}

// onDiscardedThread runs f on a locked OS thread that is never unlocked, so
// the runtime terminates the thread (and whatever f did to it) afterwards.
func onDiscardedThread(f func() (string, error)) (string, error) {
	type res struct {
		ev  string
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// The main thread is never discarded (the runtime wedges it),
			// and /proc/self follows it: hold it locked so f runs on
			// another thread, then release it untouched.
			ev, err := onDiscardedThread(f)
			runtime.UnlockOSThread()
			ch <- res{ev, err}
			return
		}
		ev, err := f()
		ch <- res{ev, err}
	}()
	r := <-ch
	return r.ev, r.err
}

func probeMount() (string, error) {
	if !isPrivileged() {
		return probeClone(unix.CLONE_NEWNS)
	}
	dir, err := os.MkdirTemp("", "managoat-probe-root-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	return onDiscardedThread(func() (string, error) {
		if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
			return "", fmt.Errorf("unshare mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return "", fmt.Errorf("make / private: %w", err)
		}
		if err := unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m,mode=755"); err != nil {
			return "", fmt.Errorf("mount tmpfs: %w", err)
		}
		usr := filepath.Join(dir, "usr")
		if err := os.Mkdir(usr, 0o755); err != nil {
			return "", err
		}
		if err := unix.Mount("/usr", usr, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("bind /usr: %w", err)
		}
		if err := unix.Mount("", usr, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return "", fmt.Errorf("remount /usr read-only: %w", err)
		}
		old := filepath.Join(dir, "old")
		if err := os.Mkdir(old, 0o755); err != nil {
			return "", err
		}
		if err := unix.PivotRoot(dir, old); err != nil {
			return "", fmt.Errorf("pivot_root: %w", err)
		}
		if err := unix.Chdir("/"); err != nil {
			return "", err
		}
		if err := unix.Unmount("/old", unix.MNT_DETACH); err != nil {
			return "", fmt.Errorf("detach old root: %w", err)
		}
		fd, err := unix.Open("/usr/managoat-probe", unix.O_CREAT|unix.O_WRONLY, 0o644)
		if err == nil {
			unix.Close(fd)
			return "", errors.New("a write to the read-only /usr bind succeeded")
		}
		if err != unix.EROFS {
			return "", fmt.Errorf("write to read-only bind failed with %v, want EROFS", err)
		}
		return "unshared a mount namespace, bound /usr read-only into a tmpfs root, pivot_root'ed into it, a write gave EROFS", nil
	})
}

func probeNet() (string, error) {
	if !isPrivileged() {
		return probeClone(unix.CLONE_NEWNET)
	}
	return onDiscardedThread(func() (string, error) {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return "", fmt.Errorf("unshare network namespace: %w", err)
		}
		if err := LoopbackUp(); err != nil {
			return "", fmt.Errorf("bring lo up: %w", err)
		}
		ln, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(ln)
		if err := unix.Bind(ln, &unix.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			return "", fmt.Errorf("bind on lo: %w", err)
		}
		if err := unix.Listen(ln, 1); err != nil {
			return "", err
		}
		sa, _ := unix.Getsockname(ln)
		c, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		err = unix.Connect(c, sa)
		unix.Close(c)
		if err != nil {
			return "", fmt.Errorf("connect on lo inside the namespace: %w", err)
		}
		o, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		err = unix.Connect(o, &unix.SockaddrInet4{Addr: [4]byte{192, 0, 2, 1}, Port: 80})
		unix.Close(o)
		if err == nil {
			return "", errors.New("a connect to 192.0.2.1:80 succeeded from the new network namespace")
		}
		return fmt.Sprintf("unshared a network namespace, lo up and reachable, connect to 192.0.2.1:80 refused (%v)", err), nil
	})
}

func probePriv() (string, error) {
	var ev string
	if os.Geteuid() == 0 {
		cmd := exec.Command("/bin/true")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("run /bin/true as uid 65534: %w", err)
		}
		ev = "ran /bin/true as uid 65534"
	} else {
		e, err := probeClone(0)
		if err != nil {
			return "", err
		}
		ev = e
	}
	_, err := onDiscardedThread(func() (string, error) {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return "", fmt.Errorf("set no_new_privs: %w", err)
		}
		v, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)
		if err != nil || v != 1 {
			return "", fmt.Errorf("no_new_privs reads %d (%v)", v, err)
		}
		return "", nil
	})
	if err != nil {
		return "", err
	}
	return ev + "; no_new_privs set and read back", nil
}

func probeSeccomp() (string, error) {
	return onDiscardedThread(func() (string, error) {
		// getpgid answers EPERM; everything else is allowed. The probe
		// thread makes no syscall of another ABI, so the program needs no
		// architecture check (the jail's filter has one).
		prog := []unix.SockFilter{
			{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
			{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_GETPGID},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)},
			{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return "", fmt.Errorf("set no_new_privs: %w", err)
		}
		fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
		if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
			return "", fmt.Errorf("load seccomp filter: %w", e)
		}
		runtime.KeepAlive(prog)
		if _, err := unix.Getpgid(0); err != unix.EPERM {
			return "", fmt.Errorf("filtered getpgid returned %v, want EPERM", err)
		}
		return "loaded a seccomp filter; the filtered syscall returned EPERM", nil
	})
}

// LandlockWriteAccess is the Landlock filesystem access set that write
// confinement handles at the given ABI version.
func LandlockWriteAccess(abi int) uint64 {
	a := uint64(ll.AccessFSWriteFile | ll.AccessFSRemoveDir | ll.AccessFSRemoveFile | ll.AccessFSMakeChar |
		ll.AccessFSMakeDir | ll.AccessFSMakeReg | ll.AccessFSMakeSock | ll.AccessFSMakeFifo |
		ll.AccessFSMakeBlock | ll.AccessFSMakeSym)
	if abi >= 2 {
		a |= ll.AccessFSRefer
	}
	if abi >= 3 {
		a |= ll.AccessFSTruncate
	}
	if abi >= 5 {
		a |= ll.AccessFSIoctlDev
	}
	return a
}

func probeLandlock() (string, error) {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return "", fmt.Errorf("landlock ABI query: %w (ENOSYS: not built; EOPNOTSUPP: disabled at boot)", err)
	}
	dir, err := os.MkdirTemp("", "managoat-probe-landlock-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	allowed := filepath.Join(dir, "allowed")
	if err := os.Mkdir(allowed, 0o755); err != nil {
		return "", err
	}
	return onDiscardedThread(func() (string, error) {
		access := LandlockWriteAccess(abi)
		fd, err := ll.LandlockCreateRuleset(&ll.RulesetAttr{HandledAccessFS: access}, 0)
		if err != nil {
			return "", fmt.Errorf("create ruleset: %w", err)
		}
		defer unix.Close(fd)
		pfd, err := unix.Open(allowed, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		defer unix.Close(pfd)
		if err := ll.LandlockAddPathBeneathRule(fd, &ll.PathBeneathAttr{AllowedAccess: access, ParentFd: pfd}, 0); err != nil {
			return "", fmt.Errorf("add rule: %w", err)
		}
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			return "", err
		}
		if err := ll.LandlockRestrictSelf(fd, 0); err != nil {
			return "", fmt.Errorf("restrict self: %w", err)
		}
		if f, err := unix.Open(filepath.Join(allowed, "ok"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644); err != nil {
			return "", fmt.Errorf("write in the allowed directory failed: %w", err)
		} else {
			unix.Close(f)
		}
		f, err := unix.Open(filepath.Join(dir, "denied"), unix.O_CREAT|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
		if err == nil {
			unix.Close(f)
			return "", errors.New("a write outside the allowed directory succeeded under Landlock")
		}
		return fmt.Sprintf("Landlock ABI %d: a write outside the allowed directory gave %v", abi, err), nil
	})
}

func probeQuota(dir string) (string, error) {
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	abs, _ := filepath.Abs(dir)
	best, opts, fstype := "", "", ""
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 {
			continue
		}
		mnt := f[4]
		sep := slices.Index(f, "-")
		if sep < 0 || sep+3 >= len(f) {
			continue
		}
		if (abs == mnt || strings.HasPrefix(abs, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) >= len(best) {
			best = mnt
			opts = f[5] + "," + f[sep+3]
			fstype = f[sep+1]
		}
	}
	for _, o := range strings.Split(opts, ",") {
		switch o {
		case "prjquota", "pquota", "usrquota", "uquota", "grpquota", "gquota", "quota":
			return fmt.Sprintf("%s (%s on %s) is mounted with %s", dir, fstype, best, o), nil
		}
	}
	return "", fmt.Errorf("%s is on %s (%s) mounted without quotas, so the host sets no per-sandbox disk cap (a mechanism may still construct one, as the jail and runc do with a loop-mounted home as root)", dir, best, fstype)
}

var (
	pidnsOnce sync.Once
	pidnsErr  error
)

// ProcPidnsOption reports (nil) whether procfs takes the pidns mount
// option (Linux 6.18): a proc instance for another process's pid namespace
// can then be mounted from outside it. Needs CAP_SYS_ADMIN. The answer is
// probed once per process.
func ProcPidnsOption() error {
	pidnsOnce.Do(func() {
		fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
		if err != nil {
			pidnsErr = fmt.Errorf("fsopen proc: %w", err)
			return
		}
		defer unix.Close(fs)
		ns, err := unix.Open("/proc/self/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			pidnsErr = err
			return
		}
		defer unix.Close(ns)
		if err := unix.FsconfigSetFd(fs, "pidns", ns); err != nil {
			pidnsErr = fmt.Errorf("fsconfig pidns: %w", err)
		}
	})
	return pidnsErr
}

// LoopbackUp sets IFF_UP on lo in the calling thread's network namespace.
func LoopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var ifr [40]byte
	copy(ifr[:], "lo")
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCGIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	*(*uint16)(unsafe.Pointer(&ifr[16])) |= unix.IFF_UP | unix.IFF_RUNNING
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCSIFFLAGS, uintptr(unsafe.Pointer(&ifr[0]))); e != 0 {
		return e
	}
	return nil
}
