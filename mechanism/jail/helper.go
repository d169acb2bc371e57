package jail

import (
	"encoding/json"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	ll "github.com/landlock-lsm/go-landlock/landlock/syscall"
	"golang.org/x/sys/unix"
	"kernel.org/pub/linux/libs/security/libcap/psx"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/internal/etcfiles"
)

// helperEnv selects the helper mode of a re-executed binary.
const helperEnv = "MANAGOAT_JAIL_HELPER"

// closeRangeCloexec is close_range's CLOSE_RANGE_CLOEXEC (Linux 5.11).
const closeRangeCloexec = 1 << 2

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
	// Entered: the init was born restricted and pivoted into its root by
	// the manager (startRestricted); it only loads seccomp and serves.
	Entered bool
	// Image: the sandbox runs on an image's root (image.go).
	Image *imageLaunch `json:",omitempty"`
	// IDBase: the init was born root of a user namespace mapping
	// 0..65535 to host ids IDBase.. (userns.go); 0 for none.
	IDBase int `json:",omitempty"`
	// joinUserns: a C init joins the user namespace at its descriptor
	// 6 first thing (userns_prep.go) instead of being born in one.
	joinUserns bool
	// unshareUserns: a C init makes its user namespace itself and waits
	// for the manager to map it (userns_prep.go, mapUnshared).
	unshareUserns bool
	// Mounts: host paths bound into the tree (mounts.go).
	Mounts []mechanism.Mount `json:",omitempty"`
	// idmaps: the user namespaces a mapped sandbox's mounts are
	// idmapped with (mounts.go), held by Start; nil for none.
	idmaps *mountIdmaps
}

// init takes the helper role before main runs: a process this package
// started as a sandbox's init (the helper variable set) does the init's
// work here and exits, so a program's main never runs in it, whether or
// not main calls Init. Every package this one imports is initialised by
// then; nothing of main's is needed.
func init() {
	if os.Getenv(helperEnv) != "" {
		treeUmask()
		Init()
	}
}

// Init runs the helper role of a process this package started (a
// sandbox's init) and never returns there; in every other process it
// returns false at once.
//
// No binary needs to call it any more: the package's init takes the role
// before main (see the package doc). It stays for programs that call it
// first thing in main, as earlier versions asked:
//
//	func main() {
//		if jail.Init() {
//			return // never reached: a helper exits by itself
//		}
//		...
//	}
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
	// Whatever else the manager's process held without close-on-exec is
	// not the sandbox's (see cinit.c): no workload inherits it. Marked,
	// not closed: the runtime may hold descriptors of its own here.
	if err := unix.CloseRange(fdReady+1, ^uint(0), closeRangeCloexec); err != nil {
		return fmt.Errorf("close_range: %w", err)
	}
	f := os.NewFile(fdConfig, "config")
	var cfg launchConfig
	if err := json.NewDecoder(f).Decode(&cfg); err != nil {
		return fmt.Errorf("read launch config: %w", err)
	}
	f.Close()
	prog, err := seccompFor(cfg) // seccomp.go
	if err != nil {
		return err
	}
	if cfg.Entered {
		if err := unix.Chdir("/"); err != nil {
			return err
		}
		if err := lowerCaps(cfg); err != nil { // userns.go
			return err
		}
		if err := checkRestricted(keepFor(cfg)); err != nil {
			return err
		}
		if err := prog.load(); err != nil {
			return err
		}
		return serve(cfg)
	}
	if !cfg.TreeBuilt {
		if err := buildNamespaces(cfg); err != nil {
			return err
		}
	}
	if err := enterRoot(cfg); err != nil {
		return err
	}
	if err := dropPrivileges(cfg, prog); err != nil {
		return err
	}
	return serve(cfg)
}

// buildNamespaces fills the mount, uts and network namespaces of the
// calling thread: the root's tree, the hostname, lo up.
func buildNamespaces(cfg launchConfig) error {
	if err := buildTreeBase(cfg); err != nil {
		return err
	}
	if err := finishTree(cfg, nil); err != nil {
		return err
	}
	return buildHost(cfg)
}

// buildHost sets the hostname and brings lo up in the calling thread's uts
// and network namespaces.
func buildHost(cfg launchConfig) error {
	if err := unix.Sethostname([]byte(cfg.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	if err := mechanism.LoopbackUp(); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// detached holds the sandbox's writable file systems created before the
// init is started (their inodes carry its Landlock rules), not yet
// attached anywhere: startRestricted makes them, buildTree moves them into
// the tree. A nil *detached mounts fresh ones instead.
type detached struct {
	tmp, shm, pts int
}

// ptyMax bounds the terminals a sandbox's devpts instance holds at once
// (its max= option): the kernel's pool for every devpts instance but the
// host's own (kernel.pty.max less kernel.pty.reserve, 3072 by default)
// is shared host-wide, and a sandbox that opened every pty it could
// (3,071 here) made openpty fail with ENOSPC in every other sandbox. The
// host's own instance keeps its reserve whatever the sandboxes do. The
// pool still bounds all sandboxes together: pool/ptyMax sandboxes at
// their bound (12 by default) would use it up.
const ptyMax = 256

// A command's open-file limit (RLIMIT_NOFILE): soft workloadNoFile, hard
// at most workloadNoFileMax (and at most what the init inherited: the
// manager's; raising it needs CAP_SYS_RESOURCE). A workload inherited
// the manager's (20000:20000 here). cinit.c's CI_NOFILE_SOFT and
// CI_NOFILE_HARD are the same numbers; the C init sets them in each
// command before its exec, the Go init on itself (lowerNoFile).
const (
	workloadNoFile    = 1024
	workloadNoFileMax = 65536
)

// lowerNoFile sets the Go init's RLIMIT_NOFILE, which every command it
// starts inherits, to the workload's (through package syscall, which then
// no longer restores the limit the runtime started with in a child).
func lowerNoFile() error {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return fmt.Errorf("getrlimit: %w", err)
	}
	r.Max = min(r.Max, workloadNoFileMax)
	r.Cur = min(r.Max, workloadNoFile)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return fmt.Errorf("setrlimit: %w", err)
	}
	return nil
}

// newDetached creates /tmp and /dev/shm tmpfs and a /dev/pts devpts
// instance, detached.
func newDetached() (*detached, error) {
	d := &detached{-1, -1, -1}
	var err error
	if d.tmp, err = fsmountFD("tmpfs", [][2]string{{"mode", "1777"}}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err == nil {
		if d.shm, err = fsmountFD("tmpfs", [][2]string{{"mode", "1777"}}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err == nil {
			d.pts, err = fsmountFD("devpts", [][2]string{{"newinstance", ""}, {"ptmxmode", "0666"}, {"mode", "0620"}, {"max", strconv.Itoa(ptyMax)}}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOEXEC)
		}
	}
	if err != nil {
		d.close()
		return nil, err
	}
	return d, nil
}

func (d *detached) close() {
	if d == nil {
		return
	}
	for _, fd := range []int{d.tmp, d.shm, d.pts} {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// Which of detached's file systems.
const (
	detTmp = iota
	detShm
	detPts
)

// place attaches the detached file system which at dst, or without one
// (d nil) mounts a fresh fstype there.
func (d *detached) place(which int, dst, fstype string, flags uintptr, data string) error {
	if d == nil {
		return mount(fstype, dst, fstype, flags, data)
	}
	fd := [...]int{detTmp: d.tmp, detShm: d.shm, detPts: d.pts}[which]
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach %s on %s: %w", fstype, dst, err)
	}
	return nil
}

// fsmountFD creates a detached mount of a new fstype instance.
func fsmountFD(fstype string, params [][2]string, attrs int) (int, error) {
	fs, err := unix.Fsopen(fstype, unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen %s: %w", fstype, err)
	}
	defer unix.Close(fs)
	for _, p := range params {
		if p[1] == "" {
			err = unix.FsconfigSetFlag(fs, p[0])
		} else {
			err = unix.FsconfigSetString(fs, p[0], p[1])
		}
		if err != nil {
			return -1, fmt.Errorf("%s option %s: %w", fstype, p[0], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return -1, fmt.Errorf("create %s: %w", fstype, err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, attrs)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", fstype, err)
	}
	return m, nil
}

func mount(src, dst, fstype string, flags uintptr, data string) error {
	err := unix.Mount(src, dst, fstype, flags, data)
	if flags&(unix.MS_REMOUNT|unix.MS_RDONLY) == unix.MS_REMOUNT|unix.MS_RDONLY {
		err = retryBusy(err, func() error { return unix.Mount(src, dst, fstype, flags, data) })
	}
	if err != nil {
		return fmt.Errorf("mount %s on %s (%s): %w", src, dst, fstype, err)
	}
	return nil
}

// retryBusy retries a read-only remount that failed with EBUSY: a file
// just written in the tree is still open in a child another goroutine of
// this process is forking (its copy of the descriptor table lives until
// that child execs). Bounded: about a second in all.
func retryBusy(err error, again func() error) error {
	for d := 50 * time.Microsecond; err == unix.EBUSY && d < time.Second; d *= 2 {
		time.Sleep(d)
		err = again()
	}
	return err
}

// roBind binds src on dst read-only, nosuid, nodev.
func roBind(src, dst string) error {
	if err := mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return err
	}
	return mount("", dst, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// bindTarget creates an empty file or directory at dst matching st.
func bindTarget(st os.FileInfo, dst string) error {
	if st.IsDir() {
		return os.Mkdir(dst, 0o755)
	}
	return os.WriteFile(dst, nil, 0o644)
}

// runtimeDirs are the host's top-level runtime directories (or links to
// them) every sandbox gets, read-only.
var runtimeDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt"}

// devNodes are the host devices bound into every sandbox's /dev.
var devNodes = []string{"null", "zero", "full", "random", "urandom", "tty"}

// etcBinds are the host /etc entries a workload may need; nothing secret
// (no shadow, no ssh keys, no machine credentials).
var etcBinds = []string{
	"alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime",
	"ssl", "ca-certificates", "ca-certificates.conf", "mime.types", "protocols",
	"services", "bash.bashrc", "profile", "profile.d", "inputrc", "terminfo",
	"debian_version", "os-release", "gai.conf", "host.conf", "magic", "timezone",
	"python3", "python3.11", "perl", "vim", "skel", "environment", "login.defs",
}

// buildTreeBase builds the sandbox's root under cfg.Root in the calling
// thread's (private) mount namespace: everything but what must be done
// from inside the new pid namespace, or with it (/proc). Every directory
// and file is made first, then the host's runtime is bound in and made
// read-only, nosuid and nodev with the root in one recursive
// mount_setattr (one remount per bind where the kernel lacks it), then
// home and /dev go on top; finishTree adds the writable file systems.
func buildTreeBase(cfg launchConfig) error {
	if cfg.Image != nil {
		return buildImageTree(cfg, -1)
	}
	if err := buildTreeShared(cfg); err != nil {
		return err
	}
	return bindHome(cfg)
}

// bindHome binds the sandbox's home directory, read-write, nosuid and
// nodev, at /home/sprite in the tree.
func bindHome(cfg launchConfig) error {
	home := cfg.Root + mechanism.Home
	if err := mount(cfg.HomeDir, home, "", unix.MS_BIND, ""); err != nil {
		return err
	}
	return mount("", home, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_NOSUID|unix.MS_NODEV, "")
}

// buildTreeShared is buildTreeBase but the home directory: the part a
// tree template holds (template.go).
func buildTreeShared(cfg launchConfig) error {
	if err := mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	r := cfg.Root
	if err := mount("tmpfs", r, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m"); err != nil {
		return err
	}
	var binds [][2]string // host source, target
	// Runtime: /usr and the top-level links or directories into it.
	for _, p := range runtimeDirs {
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
		binds = append(binds, [2]string{p, dst})
	}
	// /etc: generated files plus harmless read-only binds.
	etc := r + "/etc"
	if err := os.Mkdir(etc, 0o755); err != nil {
		return err
	}
	for name, content := range etcfiles.Files(cfg.Hostname) {
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
		if err := bindTarget(st, dst); err != nil {
			return err
		}
		binds = append(binds, [2]string{src, dst})
	}
	// Mount points of the writable mounts, /dev and /proc; /var/tmp, /run.
	// Each level with Mkdir, never MkdirAll: were r removed on the host
	// meanwhile (its tmpfs detached with it), MkdirAll would make r again
	// on the host's file system, and the tree there.
	for _, d := range []string{path.Dir(mechanism.Home), mechanism.Home, "/tmp", "/var"} {
		mode := os.FileMode(0o755)
		if d == "/tmp" {
			mode = 0o1777
		}
		if err := os.Mkdir(r+d, mode); err != nil {
			return err
		}
	}
	if err := os.Symlink("/tmp", r+"/var/tmp"); err != nil {
		return err
	}
	for _, d := range []string{"/run", "/dev", "/proc"} {
		if err := os.Mkdir(r+d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Mkdir(r+"/root", 0o700); err != nil {
		return err
	}
	if err := makeMountPoints(r, cfg.Mounts); err != nil { // mounts.go
		return err
	}
	// The runtime, read-only with the root.
	for _, b := range binds {
		if err := mount(b[0], b[1], "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return err
		}
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	err := retryBusy(unix.MountSetattr(unix.AT_FDCWD, r, unix.AT_RECURSIVE, &attr), func() error {
		return unix.MountSetattr(unix.AT_FDCWD, r, unix.AT_RECURSIVE, &attr)
	})
	if err != nil {
		if err != unix.ENOSYS {
			return fmt.Errorf("mount_setattr %s: %w", r, err)
		}
		for _, b := range binds {
			if err := mount("", b[1], "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
				return err
			}
		}
		if err := mount("", r, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=16m"); err != nil {
			return err
		}
	}
	// /dev: a tmpfs with the harmless character devices bound from the host.
	return buildDev(r + "/dev")
}

// finishTree puts the writable file systems in the tree buildTreeBase
// built (det's, or fresh ones when det is nil) and makes /dev read-only.
func finishTree(cfg launchConfig, det *detached) error {
	r, dev := cfg.Root, cfg.Root+"/dev"
	if err := det.place(detTmp, r+"/tmp", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := det.place(detPts, dev+"/pts", "devpts", unix.MS_NOSUID|unix.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,max="+strconv.Itoa(ptyMax)); err != nil {
		return err
	}
	if err := det.place(detShm, dev+"/shm", "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return err
	}
	if err := mount("", dev, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return err
	}
	return placeMounts(cfg) // mounts.go
}

// enterRoot mounts what belongs to the sandbox's pid namespace (/proc)
// in the tree buildTreeBase built, then pivots into it. /proc is mounted
// before the pivot: in a user namespace the kernel allows a new proc only
// while a full one is visible (the host's, until the old root goes).
func enterRoot(cfg launchConfig) error {
	if err := mount("proc", cfg.Root+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return err
	}
	if err := maskProc(cfg.Root); err != nil {
		return err
	}
	return pivot(cfg.Root)
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
func dropPrivileges(cfg launchConfig, prog seccompProgram) error {
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
	rfd, err := landlockRuleset("")
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	if err := addMountRules(rfd, cfg.Mounts, openMountedTarget); err != nil { // mounts.go
		return err
	}
	if err := ll.AllThreadsLandlockRestrictSelf(rfd, 0); err != nil {
		return fmt.Errorf("landlock restrict: %w", err)
	}
	return prog.load()
}

// landlockRuleset is the sandbox's Landlock ruleset, for the root mounted
// at root ("" once pivoted): writes only under home, /tmp, /dev/shm and
// the harmless devices, abstract unix sockets scoped. Reads and execution
// are confined by the mount view.
func landlockRuleset(root string) (int, error) {
	return newRuleset(func(p string) (int, error) {
		return unix.Open(root+p, unix.O_PATH|unix.O_CLOEXEC, 0)
	})
}

// newRuleset builds the ruleset with open returning an O_PATH descriptor
// of each sandbox path a rule is on (rules are on inodes: any path to the
// same directory or device will do).
func newRuleset(open func(sandboxPath string) (int, error)) (int, error) {
	abi, err := ll.LandlockGetABIVersion()
	if err != nil {
		return -1, fmt.Errorf("landlock: %w", err)
	}
	access := mechanism.LandlockWriteAccess(abi)
	attr := &ll.RulesetAttr{HandledAccessFS: access}
	if abi >= 6 {
		attr.Scoped = ll.ScopeAbstractUnixSocket
	}
	rfd, err := ll.LandlockCreateRuleset(attr, 0)
	if err != nil {
		return -1, fmt.Errorf("landlock ruleset: %w", err)
	}
	fileAccess := access &^ uint64(ll.AccessFSRemoveDir|ll.AccessFSRemoveFile|ll.AccessFSMakeChar|ll.AccessFSMakeDir|
		ll.AccessFSMakeReg|ll.AccessFSMakeSock|ll.AccessFSMakeFifo|ll.AccessFSMakeBlock|ll.AccessFSMakeSym|ll.AccessFSRefer)
	rules := []struct {
		path   string
		access uint64
	}{
		{mechanism.Home, access}, {"/tmp", access}, {"/dev/shm", access}, {"/dev/pts", fileAccess},
		{"/dev/null", fileAccess}, {"/dev/zero", fileAccess}, {"/dev/full", fileAccess},
		{"/dev/tty", fileAccess}, {"/dev/random", fileAccess}, {"/dev/urandom", fileAccess},
	}
	for _, r := range rules {
		pfd, err := open(r.path)
		if err != nil {
			unix.Close(rfd)
			return -1, fmt.Errorf("landlock rule %s: %w", r.path, err)
		}
		err = ll.LandlockAddPathBeneathRule(rfd, &ll.PathBeneathAttr{AllowedAccess: r.access, ParentFd: pfd}, 0)
		unix.Close(pfd)
		if err != nil {
			unix.Close(rfd)
			return -1, fmt.Errorf("landlock rule %s: %w", r.path, err)
		}
	}
	return rfd, nil
}

func landlockRestrictSelf(rfd int) error { return ll.LandlockRestrictSelf(rfd, 0) }

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
