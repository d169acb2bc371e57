package jail

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// How the init is started. Three paths, from the fastest:
//
//   - root, on a kernel whose procfs takes the pidns mount option (6.18+):
//     startRestricted. The init is born restricted and does almost
//     nothing but serve.
//   - root otherwise: startInit with a tree. The init is born with
//     SYS_ADMIN in its inheritable set, enters its root and drops
//     privileges on every thread (psx).
//   - rootless: startInit without a tree; the init builds its namespaces
//     itself inside a new user namespace and drops privileges (psx).

// onDiscardedThread runs f on a locked OS thread that the runtime throws
// away afterwards (f changes its credentials or namespaces for good).
func onDiscardedThread(f func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: the runtime keeps it, state and all.
			onDiscardedThread(f)
			runtime.UnlockOSThread()
			close(done)
			return
		}
		defer close(done)
		f() // the goroutine returns locked: the thread ends with it
	}()
	<-done
}

// restrictedStart starts the init born restricted (root, procfs pidns
// option). On a discarded thread T: enter new mount, uts, ipc and network
// namespaces; create the sandbox's writable file systems detached (their
// inodes, with the home directory's and the devices', are what the
// Landlock ruleset is on); give the thread what the init must be born
// with (restrictThread: bounding set keepCaps, nothing inheritable,
// no_new_privs, the ruleset) and clone the init from it into a new pid
// and cgroup namespace: exec'd as root it gets exactly keepCaps, and it
// inherits the rest, on every thread it will ever have. Only seccomp is
// left to the init (one TSYNC load).
//
// A second discarded thread joins T's mount and uts namespaces as soon as
// they exist and builds the tree and hostname there while T and then the
// init's runtime go on (a third makes the network namespace and its lo,
// which T enters before the clone); once the init exists it attaches the
// writable file systems, mounts a proc for the init's pid namespace (the
// pidns option), masks it, and pivot_roots the namespace, which moves the
// init with it. Its result comes on the channel start returns.
//
// It comes in two steps, so that the threads' work that needs no init
// (namespaces, the tree, the writable file systems, T's restrictions)
// runs while the caller still makes the cgroups, the control socket and
// the command: beginRestricted as soon as the sandbox's home is known,
// then restrictedStart.start with the command (or abortUnused).
type restrictedStart struct {
	used   bool               // start or abort was called
	cmdCh  chan *cloneRequest // to T: the init to clone, nil to abort
	result chan error         // from T: the clone's result
	built  chan error         // from the tree's thread
	userns *usernsPrep        // a mapped sandbox's, for a C init to join (userns_prep.go)
	files  []*os.File         // handed to the init, closed with the start
	// rootReady is closed once the tree's thread has built a mapped
	// image sandbox's tree (its root is then there for T's ruleset).
	rootReady chan struct{}
}

// nsFDs are the sandbox's mount and uts namespaces, for the tree's thread.
type nsFDs struct{ mnt, uts int }

type cloneRequest struct {
	cmd   *exec.Cmd
	hooks initHooks
}

// beginRestricted starts the two threads (net is the network namespace
// Start began); see restrictedStart.
func beginRestricted(lc launchConfig, net *netPrep, tmpl *treeTemplate) *restrictedStart {
	type started struct {
		det   *detached
		pid   int
		hooks initHooks
	}
	r := &restrictedStart{cmdCh: make(chan *cloneRequest, 1), result: make(chan error, 1), built: make(chan error, 1)}
	// A mapped sandbox's user namespace is made beforehand for a C init
	// to join, and for an image's idmapped layer (the Go init is born in
	// one of its own with the same mapping; the layer's idmap is the same
	// with either).
	mappedImage := lc.Image != nil && lc.Image.Mapped
	if lc.IDBase != 0 && mappedImage {
		r.userns = newUsernsPrep(lc.IDBase)
		r.rootReady = make(chan struct{})
	}
	// A C init of a mapped sandbox on the host's root makes its namespace
	// itself (launch decides alike): T writes no uid_map (rulesetFor).
	lc.unshareUserns = lc.IDBase != 0 && !mappedImage && initMode() != initGo
	nsCh := make(chan *nsFDs, 1)
	startedCh := make(chan *started, 1)
	go onDiscardedThread(func() {
		ns := <-nsCh
		if ns == nil {
			if r.rootReady != nil {
				close(r.rootReady)
			}
			<-startedCh
			r.built <- errors.New("no namespaces")
			return
		}
		err := buildBeside(ns.mnt, ns.uts, lc, tmpl, r.userns)
		phase("tree")
		if r.rootReady != nil {
			close(r.rootReady) // T's ruleset holds on the root now built
		}
		for _, fd := range []int{ns.mnt, ns.uts} {
			unix.Close(fd)
		}
		st := <-startedCh
		if st == nil {
			r.built <- errors.New("init not started")
			return
		}
		defer st.det.close()
		if err == nil && st.hooks.place != nil {
			err = st.hooks.place(st.pid) // before the pivot: host paths
		}
		phase("placed")
		if err == nil {
			err = finishBeside(st.pid, st.det, lc)
		}
		phase("pivoted")
		if err == nil && st.hooks.send != nil {
			err = st.hooks.send()
		}
		r.built <- err
	})
	go onDiscardedThread(func() {
		var det *detached
		var err error
		ns := &nsFDs{-1, -1}
		defer func() {
			if ns != nil {
				for _, fd := range []int{ns.mnt, ns.uts} {
					if fd >= 0 {
						unix.Close(fd)
					}
				}
				nsCh <- nil
			}
			if err != nil {
				net.release() // the network namespace, if made, is not wanted
				det.close()
				startedCh <- nil
			}
			r.result <- err
		}()
		err = r.prepare(lc, ns, func() { nsCh <- ns; ns = nil }, &det)
		phase("restricted")
		req := <-r.cmdCh
		if req == nil {
			if err == nil {
				err = errors.New("start abandoned")
			}
			return
		}
		if err != nil {
			return
		}
		var nfd int
		if nfd, err = net.take(); err != nil {
			return
		}
		err = unix.Setns(nfd, unix.CLONE_NEWNET)
		unix.Close(nfd)
		if err != nil {
			err = fmt.Errorf("enter the sandbox's network namespace: %w", err)
			return
		}
		if err = ownNewUserns(req.cmd.SysProcAttr, lc.IDBase); err != nil { // userns.go
			return
		}
		if err = req.cmd.Start(); err == nil {
			// Hand over at once: this thread's end and the scheduler's
			// wake-up of the caller are not on the way to a ready init.
			startedCh <- &started{det, req.cmd.Process.Pid, req.hooks}
		}
	})
	return r
}

// prepare is T's work before the clone: new mount, uts and ipc
// namespaces (handed to the tree's thread by sendNS), the writable file
// systems (*det) and the thread's restrictions.
func (r *restrictedStart) prepare(lc launchConfig, ns *nsFDs, sendNS func(), det **detached) (err error) {
	if err = unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	treeUmask()
	// Nothing mounted in this namespace propagates to the host.
	if err = mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return err
	}
	for _, p := range []struct {
		name string
		fd   *int
	}{{"mnt", &ns.mnt}, {"uts", &ns.uts}} {
		if *p.fd, err = unix.Open("/proc/thread-self/ns/"+p.name, unix.O_RDONLY|unix.O_CLOEXEC, 0); err != nil {
			return err
		}
	}
	sendNS()
	d, err := newDetached()
	if err != nil {
		return err
	}
	*det = d
	// A C init joins the namespace made for it, where it could be made
	// (userNSFile decides alike): T then writes no uid_map (rulesetFor).
	if r.userns != nil && initMode() != initGo {
		_, uerr := r.userns.wait()
		lc.joinUserns = uerr == nil
	}
	rfd, err := rulesetFor(lc, r.rootReady, func(p string) (int, error) { // userns.go
		switch p {
		case mechanism.Home:
			return unix.Open(lc.HomeDir, unix.O_PATH|unix.O_CLOEXEC, 0)
		case "/tmp": // close-on-exec: another sandbox's init may be forked meanwhile
			return unix.FcntlInt(uintptr(d.tmp), unix.F_DUPFD_CLOEXEC, 0)
		case "/dev/shm":
			return unix.FcntlInt(uintptr(d.shm), unix.F_DUPFD_CLOEXEC, 0)
		case "/dev/pts":
			return unix.FcntlInt(uintptr(d.pts), unix.F_DUPFD_CLOEXEC, 0)
		}
		return unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0) // the host's device, bound later
	})
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	if err = addMountRules(rfd, lc.Mounts, openSource); err != nil { // mounts.go
		return err
	}
	return restrictThread(keepFor(lc), rfd)
}

// start hands T the init to clone and waits for the clone; the tree's
// thread then reports on the returned channel.
func (r *restrictedStart) start(cmd *exec.Cmd, hooks initHooks) (<-chan error, error) {
	r.used = true
	r.cmdCh <- &cloneRequest{cmd, hooks}
	if err := <-r.result; err != nil {
		<-r.built
		return nil, err
	}
	return r.built, nil
}

// abortUnused ends a begun start that was not used, and waits for its
// threads.
func (r *restrictedStart) abortUnused() {
	defer func() {
		for _, f := range r.files {
			f.Close()
		}
		r.userns.release()
	}()
	if r.used {
		return
	}
	r.used = true
	r.cmdCh <- nil
	<-r.result
	<-r.built
}

// netPrep is a network namespace with lo up, made on a discarded thread
// as early as the caller can (the slowest namespace to create: ~0.5 ms
// here, more under load), for the init to be born in.
type netPrep struct {
	ch   chan netNS
	once sync.Once
}

type netNS struct {
	fd  int
	err error
}

func newNetPrep() *netPrep {
	n := &netPrep{ch: make(chan netNS, 1)}
	go onDiscardedThread(func() {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			n.ch <- netNS{-1, fmt.Errorf("unshare net: %w", err)}
			return
		}
		if err := mechanism.LoopbackUp(); err != nil {
			n.ch <- netNS{-1, fmt.Errorf("lo up: %w", err)}
			return
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		n.ch <- netNS{fd, err}
	})
	return n
}

// take waits for the namespace and hands its descriptor over (once).
func (n *netPrep) take() (fd int, err error) {
	err = errors.New("network namespace already taken")
	n.once.Do(func() {
		r := <-n.ch
		fd, err = r.fd, r.err
	})
	return fd, err
}

// release closes the namespace unless it was taken; it does not wait.
func (n *netPrep) release() {
	if n == nil {
		return
	}
	n.once.Do(func() {
		go func() {
			if r := <-n.ch; r.err == nil {
				unix.Close(r.fd)
			}
		}()
	})
}

// initHooks run on the tree's thread once the init exists: place puts it
// in its cgroups and verifies the limits (before the pivot, while the
// host's /sys/fs/cgroup is still in view), send gives it its launch
// config once the root is ready. Both stay off the caller's goroutine, so
// no wake-up of it is on the way to a ready init.
type initHooks struct {
	place func(pid int) error
	send  func() error
}

// buildBeside joins the mount and uts namespaces (by descriptor) and
// builds the tree (a clone of tmpl when it is ready) and the hostname
// there.
// treeUmask sets the umask the sandbox's tree is built under: a caller's
// umask of 077 made its directories 0700, and no workload could start.
// It is called on a thread that unshared CLONE_FS (umask lives in the
// fs_struct), so the rest of the process keeps its own; the helper
// process, which is wholly the sandbox's, sets it at its start.
func treeUmask() { unix.Umask(0o022) }

func buildBeside(mnt, uts int, lc launchConfig, tmpl *treeTemplate, up *usernsPrep) error {
	if err := unix.Unshare(unix.CLONE_FS); err != nil {
		return fmt.Errorf("unshare fs: %w", err)
	}
	treeUmask()
	if lc.Image != nil {
		return buildImageBeside(mnt, uts, lc, up)
	}
	cloned := false
	if len(lc.Mounts) > 0 {
		tmpl = &treeTemplate{} // its own root, with mount points (mounts.go): no template
	}
	if tmpl.ready() && !tmpl.fresh() {
		tmpl.invalidate() // the host replaced something it binds
	}
	if !tmpl.ready() && !tmpl.adopt(lc) {
		// With a TemplateDir: build the template in place of this
		// tree, for this start and every later one (template_pin.go).
		tmpl.buildPinned(lc)
	}
	if tns, troot, ok := tmpl.get(); ok {
		var err error
		cloned, err = cloneTemplate(tns, troot, mnt, lc)
		unix.Close(tns)
		unix.Close(troot)
		if err != nil {
			return err
		}
		if !cloned {
			tmpl.invalidate()
		}
	}
	for _, fd := range []int{mnt, uts} {
		if err := unix.Setns(fd, 0); err != nil {
			return fmt.Errorf("join the sandbox's namespaces: %w", err)
		}
	}
	if !cloned {
		if err := buildTreeBase(lc); err != nil {
			return err
		}
	}
	if err := unix.Sethostname([]byte(lc.Hostname)); err != nil {
		return fmt.Errorf("sethostname: %w", err)
	}
	return nil
}

// finishBeside, in the sandbox's mount namespace once the init exists:
// attaches det, mounts the init's proc, pivots.
func finishBeside(pid int, det *detached, lc launchConfig) error {
	if err := finishTree(lc, det); err != nil {
		return err
	}
	phase("attached")
	pidns, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/ns/pid", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(pidns)
	return mountProcFor(pidns, lc.Root)
}

// restrictThread gives the calling thread what a process it execs as root
// inherits: a bounding set of keep, nothing inheritable (which clears the
// ambient set), no_new_privs, and the Landlock ruleset rfd. Root's exec
// then grants exactly the bounding set. The thread keeps its own permitted
// and effective sets: creating the init's pid and cgroup namespaces needs
// SYS_ADMIN.
func restrictThread(keep []int, rfd int) error {
	last := lastCap()
	for c := 0; c <= last; c++ {
		if c == unix.CAP_SETPCAP || slices.Contains(keep, c) {
			continue
		}
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
		}
	}
	if !slices.Contains(keep, unix.CAP_SETPCAP) {
		if err := unix.Prctl(unix.PR_CAPBSET_DROP, unix.CAP_SETPCAP, 0, 0, 0); err != nil && err != unix.EINVAL {
			return fmt.Errorf("drop CAP_SETPCAP from the bounding set: %w", err)
		}
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("capset: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if err := landlockRestrictSelf(rfd); err != nil {
		return fmt.Errorf("landlock restrict: %w", err)
	}
	return nil
}

// capData is keep as permitted and effective, with nothing inheritable.
func capData(keep []int) *[2]unix.CapUserData {
	var data [2]unix.CapUserData
	for _, c := range keep {
		data[c/32].Permitted |= 1 << (c % 32)
		data[c/32].Effective |= 1 << (c % 32)
	}
	return &data
}

// mountProcFor mounts a proc of pid namespace pidns at root/proc, masks
// it, and pivots into root.
func mountProcFor(pidns int, root string) error {
	fs, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigSetFd(fs, "pidns", pidns); err != nil {
		return fmt.Errorf("proc pidns: %w", err)
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("proc: %w", err)
	}
	m, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return fmt.Errorf("fsmount proc: %w", err)
	}
	defer unix.Close(m)
	if err := unix.MoveMount(m, "", unix.AT_FDCWD, root+"/proc", unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	phase("proc")
	if err := maskProc(root); err != nil {
		return err
	}
	phase("masked")
	return pivot(root)
}

// maskedProcFiles are the proc files maskProc hides (/dev/null bound on
// them): the kernel's memory (kcore), every key of the host (keys), and
// every user's key counts, which name the host's uids that hold keys
// (key-users); the host's timers and scheduler (timer_list, timer_stats,
// sched_debug, latency_stats); the kernel's configuration (config.gz)
// and symbol table (kallsyms: its addresses read as zero here, but the
// names, modules included, say which kernel and which exploit fits).
// Docker masks kcore, keys, timer_list, timer_stats, sched_debug and
// latency_stats likewise. Left readable on purpose: cmdline, version,
// cpuinfo, meminfo (what uname, cpuid and the cgroup's limits tell
// anyway, and what tools read), mountinfo (see mounts.go).
var maskedProcFiles = []string{"/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/timer_stats",
	"/proc/sched_debug", "/proc/latency_stats", "/proc/config.gz", "/proc/kallsyms"}

// maskedProcDirs are the proc directories maskProc hides under an empty
// read-only tmpfs, as Docker does: the host's ACPI, SCSI and sound
// devices.
var maskedProcDirs = []string{"/proc/acpi", "/proc/scsi", "/proc/asound"}

// maskProc hides or freezes the host-facing entries of the proc mounted at
// root/proc.
func maskProc(root string) error {
	for _, p := range maskedProcFiles {
		if _, err := os.Stat(root + p); err == nil {
			if err := mount("/dev/null", root+p, "", unix.MS_BIND, ""); err != nil {
				return err
			}
		}
	}
	for _, p := range maskedProcDirs {
		if fi, err := os.Stat(root + p); err == nil && fi.IsDir() {
			if err := mount("tmpfs", root+p, "tmpfs", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "size=4k,nr_inodes=1,mode=555"); err != nil {
				return err
			}
		}
	}
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"} {
		if _, err := os.Stat(root + p); err == nil {
			if err := roBind(root+p, root+p); err != nil {
				return err
			}
		}
	}
	return nil
}

// pivot makes root the root of the calling thread's mount namespace (and
// of every process there whose root was the old one). pivot_root(".", ".")
// stacks the old root on the new one; detaching it leaves the new root,
// with no directory for the old one.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return err
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivot_root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detach old root: %w", err)
	}
	return unix.Chdir("/")
}

// checkRestricted verifies, in an init born restricted, that the calling
// thread has exactly keep (per the mode) and no_new_privs; the rest was
// inherited with it. An init that is not restricted never serves.
func checkRestricted(keep []int) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var got [2]unix.CapUserData
	if err := unix.Capget(&hdr, &got[0]); err != nil {
		return fmt.Errorf("capget: %w", err)
	}
	want := capData(keep)
	for i := range got {
		if got[i].Permitted != want[i].Permitted || got[i].Effective != want[i].Effective || got[i].Inheritable != 0 {
			return fmt.Errorf("init born with capabilities %+v, want %+v", got, *want)
		}
	}
	if nnp, err := unix.PrctlRetInt(unix.PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0); err != nil || nnp != 1 {
		return errors.New("init born without no_new_privs")
	}
	return nil
}

// initCaps are the capabilities the init needs until its root is built,
// besides keepCaps: mounts, pivot_root and sethostname (SYS_ADMIN) and lo
// up (NET_ADMIN).
var initCaps = []int{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN}

// startInit starts the init from a locked OS thread that the runtime
// throws away afterwards (its credentials and namespaces are changed for
// good). See prepareInitThread. As root, that thread also enters new
// mount, uts, ipc and network namespaces before the start, so the init
// (cloned into a new pid and cgroup namespace only) is born sharing them;
// then, while the init's runtime starts up, the thread builds the
// sandbox's mount tree, hostname and lo there (buildNamespaces with tree),
// and reports on the returned channel. With tree nil (rootless: a user
// namespace cannot be entered by one thread of a process), the init
// builds them itself and the channel is nil.
func startInit(cmd *exec.Cmd, rootless bool, tree *launchConfig) (<-chan error, error) {
	started := make(chan error, 1)
	var built chan error
	if tree != nil {
		built = make(chan error, 1)
	}
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			// Never the main thread: the runtime keeps it, state and all.
			b, err := startInit(cmd, rootless, tree)
			runtime.UnlockOSThread()
			started <- err
			if err == nil && b != nil {
				built <- <-b
			}
			return
		}
		// Return without UnlockOSThread: the thread ends with the goroutine.
		err := prepareInitThread(rootless)
		if err == nil && tree != nil {
			if err = unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWNET); err != nil {
				err = fmt.Errorf("unshare: %w", err)
			}
		}
		if err == nil {
			err = cmd.Start()
		}
		started <- err
		if err == nil && tree != nil {
			built <- buildNamespaces(*tree)
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return built, nil
}

// prepareInitThread, as root, puts initCaps in the calling thread's
// inheritable set, cuts its bounding set to keepCaps and sets
// no_new_privs: an init exec'd from it as root gets bounding set ∪
// inheritable, so it is born with its final bounding set and
// no_new_privs, and later has only its permitted, effective and
// inheritable sets to lower on each of its threads.
func prepareInitThread(rootless bool) error {
	if !rootless {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capget: %w", err)
		}
		for _, c := range initCaps {
			data[c/32].Inheritable |= 1 << (c % 32)
		}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			return fmt.Errorf("capset inheritable: %w", err)
		}
		last := lastCap()
		for c := 0; c <= last; c++ {
			if slices.Contains(keepCaps, c) {
				continue
			}
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && err != unix.EINVAL {
				return fmt.Errorf("drop capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	return nil
}
