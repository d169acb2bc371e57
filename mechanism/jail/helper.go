package jail

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	seccomp "github.com/elastic/go-seccomp-bpf"
	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"

	"github.com/managoat/managoat/mechanism"
)

// helperEnv selects the helper mode of a re-executed binary.
const helperEnv = "MANAGOAT_JAIL_HELPER"

// Fds inherited by the helper.
const (
	fdListener = 3 // the control socket (unixpacket listener)
	fdConfig   = 4 // read end: the launch config, sent once placed in cgroups
	fdReady    = 5 // write end: "ready" or an error line
)

// launchConfig is what the manager tells the init.
type launchConfig struct {
	Root     string   // host directory the tmpfs root is mounted on
	HomeDir  string   // host directory bound at /home/sprite
	Hostname string   // uts hostname
	Rootless bool     // running in a user namespace: the workload stays uid 0 there
	UID, GID int      // the workload's uid/gid when not rootless
	Env      []string // default environment of every command
	Pids     int64    // the sandbox's pids cap, 0 for none
	// TreeBuilt: the manager built the mount tree, hostname and lo in
	// the namespaces the init was born in (as root); the init only enters.
	TreeBuilt bool
}

// Init must be the first call in main of every binary that uses this
// package (and in TestMain of its tests):
//
//	func main() {
//		if jail.Init() {
//			return // never reached: a helper exits by itself
//		}
//		...
//	}
//
// The jail re-executes the running binary (/proc/self/exe) as each
// sandbox's init; in that process Init does the init's work and never
// returns. In every other process it returns false at once.
func Init() bool {
	mode := os.Getenv(helperEnv)
	if mode == "" {
		return false
	}
	var err error
	switch mode {
	case "init":
		err = initMain()
	default:
		err = fmt.Errorf("unknown helper mode %q", mode)
	}
	report(err)
	os.Exit(1)
	return true
}

func report(err error) {
	if err == nil {
		return
	}
	msg := "error: " + strings.ReplaceAll(err.Error(), "\n", " ") + "\n"
	unix.Write(fdReady, []byte(msg))
	fmt.Fprint(os.Stderr, "managoat jail init: "+msg)
}

// initMain runs as pid 1 of the sandbox's new namespaces, as root there.
// It waits until the manager placed it in its cgroups (and, as root, built
// the root's tree while the init started up), enters the root, drops
// privileges on every one of its threads and serves: one start of the
// binary per sandbox.
func initMain() error {
	f := os.NewFile(fdConfig, "config")
	var cfg launchConfig
	if err := json.NewDecoder(f).Decode(&cfg); err != nil {
		return fmt.Errorf("read launch config: %w", err)
	}
	f.Close()
	if !cfg.TreeBuilt {
		if err := buildNamespaces(cfg); err != nil {
			return err
		}
	}
	if err := enterRoot(cfg); err != nil {
		return err
	}
	if err := dropPrivileges(cfg); err != nil {
		return err
	}
	return serve(cfg)
}

// buildNamespaces fills the mount, uts and network namespaces of the
// calling thread: the root's tree, the hostname, lo up.
func buildNamespaces(cfg launchConfig) error {
	if err := buildTree(cfg); err != nil {
		return err
	}
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := mechanism.LoopbackUp(); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	if err := unix.Mount(src, dst, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", src, dst, fstype, err)
	}
	return nil
}

// roBind binds src on dst read-only, nosuid, nodev.
func roBind(src, dst string) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// bindTarget creates an empty file or directory at dst matching src.
func bindTarget(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	if st.IsDir() {
		return os.MkdirAll(dst, 0o755)
	}
	fh, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return fh.Close()
}

// etcBinds are the host /etc entries a workload may need; nothing secret
// (no shadow, no ssh keys, no machine credentials).
var etcBinds = []string{
	"alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
	"ssl", "ca-certificates", "ca-certificates.conf", "mime.types", "protocols",
	"services", "bash.bashrc", "profile", "profile.d", "inputrc", "terminfo",
	"debian_version", "os-release", "gai.conf", "host.conf", "magic", "timezone",
	"python3", "python3.11", "perl", "vim", "skel", "environment", "login.defs",
}

// buildTree builds the sandbox's root under cfg.Root in the calling
// thread's (private) mount namespace: everything but what must be done
// from inside the new pid namespace (see enterRoot).
func buildTree(cfg launchConfig) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	r := cfg.Root
	if err := mount("tmpfs", r, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m"); err != nil {
		return err
	}
	// Runtime: /usr and the top-level links or directories into it.
	for _, p := range []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"} {
		st, err := os.Lstat(p)
		if err != nil {
			continue
		}
		dst := r + p
		if st.Mode()&os.ModeSymlink != 0 {
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := os.Symlink(t, dst); err != nil {
				return err
			}
			continue
		}
		if !st.IsDir() {
			continue
		}
		if err := os.Mkdir(dst, 0o755); err != nil {
			return err
		}
		if err := roBind(p, dst); err != nil {
			return err
		}
	}
	// /etc: generated files plus harmless read-only binds.
	etc := r + "/etc"
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	gen := map[string]string{
		"passwd":        "root:x:0:0:root:/root:/bin/sh\nsprite:x:1000:1000:sprite:/home/sprite:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"group":         "root:x:0:\nsprite:x:1000:\nnogroup:x:65534:\n",
		"hosts":         "127.0.0.1\tlocalhost " + cfg.Hostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
		"hostname":      cfg.Hostname + "\n",
		"resolv.conf":   "# no network: this sandbox denies all egress\n",
		"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n",
	}
	for name, content := range gen {
		if err := os.WriteFile(filepath.Join(etc, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, name := range etcBinds {
		src := "/etc/" + name
		st, err := os.Lstat(src)
		if err != nil {
			continue
		}
		dst := filepath.Join(etc, name)
		if st.Mode()&os.ModeSymlink != 0 {
			t, _ := os.Readlink(src)
			if err := os.Symlink(t, dst); err != nil {
				return err
			}
			continue
		}
		if err := bindTarget(src, dst); err != nil {
			return err
		}
		if err := roBind(src, dst); err != nil {
			return err
		}
	}
	// Home, /tmp, /var/tmp, /run.
	home := r + mechanism.Home
	if err := os.MkdirAll(home, 0o755); err != nil {
		return err
	}
	if err := mount(cfg.HomeDir, home, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	if err := mount("", home, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return err
	}
	for _, d := range []string{"/tmp"} {
		if err := os.Mkdir(r+d, 0o1777); err != nil {
			return err
		}
		if err := mount("tmpfs", r+d, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(r+"/var", 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/tmp", r+"/var/tmp"); err != nil {
		return err
	}
	if err := os.Mkdir(r+"/run", 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(r+"/root", 0o700); err != nil {
		return err
	}
	// /dev: a tmpfs with the harmless character devices bound from the host.
	dev := r + "/dev"
	if err := os.Mkdir(dev, 0o755); err != nil {
		return err
	}
	if err := mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindTarget("/dev/"+d, dev+"/"+d); err != nil {
			return err
		}
		if err := mount("/dev/"+d, dev+"/"+d, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx"} {
		if err := os.Symlink(target, dev+"/"+name); err != nil {
			return err
		}
	}
	for _, d := range []string{"pts", "shm"} {
		if err := os.Mkdir(dev+"/"+d, 0o755); err != nil {
			return err
		}
	}
	if err := mount("devpts", dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620"); err != nil {
		return err
	}
	if err := mount("tmpfs", dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := os.Mkdir(r+"/proc", 0o555); err != nil {
		return err
	}
	if err := mount("", dev, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	return mount("", r, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m")
}

// enterRoot pivots into the root buildTree built and mounts what belongs
// to the sandbox's pid namespace (/proc), then makes the root read-only.
func enterRoot(cfg launchConfig) error {
	// pivot_root(".", ".") stacks the old root on the new one; detaching
	// it leaves the new root, with no directory for the old one.
	if err := unix.Chdir(cfg.Root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	if err := mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug"} {
		if _, err := os.Stat(p); err == nil {
			if err := mount("/dev/null", p, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
	}
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} {
		if _, err := os.Stat(p); err == nil {
			if err := roBind(p, p); err != nil {
				return err
			}
		}
	}
	return nil
}

// keepCaps are what the init keeps when the workload runs as another uid:
// it spawns as that uid and signals its children. The workload loses every
// capability when its uid is set.
var keepCaps = []int{unix.CAP_SETUID, unix.CAP_SETGID, unix.CAP_KILL}

// allThreads runs a system call on every thread of the process (psx: the
// Go runtime's AllThreadsSyscall without cgo, libpsx with it). The init's
// fresh /proc must be mounted: libpsx finds the threads there.
func allThreads(trap, a1, a2, a3 uintptr) error {
	if _, _, e := psx.Syscall6(trap, a1, a2, a3, 0, 0, 0); e != 0 {
		return e
	}
	return nil
}

// dropPrivileges restricts every thread of the init, so that every
// process it starts, from whichever thread, inherits the restrictions:
// the bounding set cut to keepCaps (nothing without root), permitted and
// effective capabilities likewise, no ambient capabilities,
// no_new_privs, the Landlock ruleset, and the seccomp filter
// (synchronised to all threads by the kernel). Threads created later
// copy the state of the thread that creates them.
func dropPrivileges(cfg launchConfig) error {
	var keep []int
	if !cfg.Rootless {
		keep = keepCaps
	}
	// The bounding set: as root the manager's starting thread already cut
	// it to keep; otherwise (a user namespace starts with a full set) one
	// broadcast per capability still in it, CAP_SETPCAP last.
	last := lastCap()
	var drop []int
	for c := 0; c <= last; c++ {
		if c == unix.CAP_SETPCAP || slices.Contains(keep, c) {
			continue
		}
		if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); err == nil && in == 1 {
			drop = append(drop, c)
		}
	}
	if in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SETPCAP, 0, 0, 0); err == nil && in == 1 && !slices.Contains(keep, unix.CAP_SETPCAP) {
		drop = append(drop, unix.CAP_SETPCAP)
	}
	for _, c := range drop {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, uintptr(c), 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	// Permitted, effective and inheritable down to keep, on every thread;
	// this also clears the ambient set (the kernel keeps ambient within
	// permitted and inheritable).
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	for _, c := range keep {
		data[c/32].Permitted |= 1 << (c % 32)
		data[c/32].Effective |= 1 << (c % 32)
	}
	if err := allThreads(unix.SYS_CAPSET, uintptr(unsafe.Pointer(&hdr)), uintptr(unsafe.Pointer(&data[0])), 0); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	runtime.KeepAlive(&hdr)
	runtime.KeepAlive(&data)
	// no_new_privs is inherited from the manager's starting thread; set it
	// everywhere in case it was not (it never fails where already set).
	if nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || nnp != 1 {
		if err := allThreads(unix.SYS_PRCTL, unix.PR_SET_NO_NEW_PRIVS, 1, 0); err != nil {
			return fmt.Errorf("no_new_privs: %w", err)
		}
	}
	// Landlock: writes only under home, /tmp, /dev/shm and the harmless
	// devices. Reads and execution are confined by the mount view.
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return fmt.Errorf("landlock: %w", err)
	}
	access := mechanism.LandlockWriteAccess(abi)
	attr := &ll.RulesetAttr{HandledAccessFS: access}
	if abi >= 6 {
		attr.Scoped = ll.ScopeAbstractUnixSocket
	}
	rfd, err := ll.LandlockCreateRuleset(attr, 0)
	if err != nil {
		return fmt.Errorf("landlock ruleset: %w", err)
	}
	defer unix.Close(rfd)
	rules := map[string]uint64{
		mechanism.Home: access, "/tmp": access, "/dev/shm": access,
	}
	fileAccess := access &^ uint64(ll.AccessFSRemoveDir|ll.AccessFSRemoveFile|ll.AccessFSMakeChar|ll.AccessFSMakeDir|
		ll.AccessFSMakeReg|ll.AccessFSMakeSock|ll.AccessFSMakeFifo|ll.AccessFSMakeBlock|ll.AccessFSMakeSym|ll.AccessFSRefer)
	for _, d := range []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty", "/dev/random", "/dev/urandom"} {
		rules[d] = fileAccess
	}
	rules["/dev/pts"] = fileAccess
	for p, a := range rules {
		pfd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("landlock rule %s: %w", p, err)
		}
		err = ll.LandlockAddPathBeneathRule(rfd, &ll.PathBeneathAttr{AllowedAccess: a, ParentFd: pfd}, 0)
		unix.Close(pfd)
		if err != nil {
			return fmt.Errorf("landlock rule %s: %w", p, err)
		}
	}
	if err := ll.AllThreadsLandlockRestrictSelf(rfd, 0); err != nil {
		return fmt.Errorf("landlock restrict: %w", err)
	}
	if err := seccomp.LoadFilter(seccompFilter()); err != nil {
		return fmt.Errorf("seccomp: %w", err)
	}
	return nil
}

func lastCap() int {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err == nil {
		var n int
		if _, err := fmt.Sscanf(string(b), "%d", &n); err == nil {
			return n
		}
	}
	return 40
}
