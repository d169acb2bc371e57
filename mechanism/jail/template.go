package jail

import (
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism/internal/etcfiles"
)

// treeTemplate is the part of every sandbox's root that is the same for
// all of them: the tmpfs root with its directories, the host runtime's
// read-only binds, the generated /etc and its read-only binds, /dev's
// devices (buildTreeShared). A Jail builds it once, in a private mount
// namespace of its own that a descriptor keeps alive, after its second
// start (a process that starts one sandbox never needs it); every later
// start clones it into the sandbox's namespace with
// one open_tree(OPEN_TREE_CLONE|AT_RECURSIVE) and one move_mount instead
// of some 45 mounts and 60 file creations, then adds what is the
// sandbox's own: /etc/hosts and /etc/hostname (its name) and the home
// directory. The clones share the template's file systems, all of them
// read-only (the root and /etc by mount_setattr, /dev by the first
// sandbox's remount), so no sandbox can change what another sees.
//
// The template's namespace is pivoted into the template tree, its copy of
// the host's mount table detached: it pins nothing of the host but what
// the tree binds (as a running sandbox does), so the host can unmount
// its other file systems. A template that fails to clone is dropped: the
// start then builds its tree as without one, and the template is built
// again.
type treeTemplate struct {
	mu      sync.Mutex
	state   int // tmplNone, tmplBuilding, tmplReady
	ns      int // the template's mount namespace
	root    int // O_PATH descriptor of the template's root mount
	sources map[string]fileID

	// Pinned templates (template_pin.go): dir is Config.TemplateDir.
	dir        string
	adoptTried bool  // adopt runs once per process
	adopted    bool  // the template was pinned by another process
	pinErr     error // why the last template built here was not pinned
}

// fileID identifies a host file the template binds or copies: a bind
// keeps the inode it was made on, so a file replaced since (ldconfig
// renames a new ld.so.cache over the old one; a package upgrade replaces
// a directory) would be stale in every clone. Contents changed in place
// show through a bind and need no check.
type fileID struct{ dev, ino uint64 }

// treeSources are the identities of everything buildTreeShared takes from
// the host (missing ones as the zero fileID).
func treeSources() map[string]fileID {
	out := map[string]fileID{}
	add := func(p string) {
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			out[p] = fileID{st.Dev, st.Ino}
		} else {
			out[p] = fileID{}
		}
	}
	for _, p := range runtimeDirs {
		add(p)
	}
	for _, name := range etcBinds {
		add("/etc/" + name)
	}
	for _, d := range devNodes {
		add("/dev/" + d)
	}
	return out
}

// fresh reports whether the host still has what the template was built
// from.
func (t *treeTemplate) fresh() bool {
	t.mu.Lock()
	want := t.sources
	t.mu.Unlock()
	return sameSources(want, treeSources())
}

const (
	tmplNone = iota
	tmplBuilding
	tmplReady
)

// tmplHostname is the placeholder the template's /etc files carry; each
// sandbox binds its own over them.
const tmplHostname = "sandbox"

// ready reports whether the template is built.
func (t *treeTemplate) ready() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.state == tmplReady
}

// get returns duplicates of the template's descriptors when it is ready
// (the caller closes them): an invalidate meanwhile cannot close them
// under it, nor a reuse of their numbers make it clone something else.
func (t *treeTemplate) get() (ns, root int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != tmplReady {
		return -1, -1, false
	}
	ns, err := unix.FcntlInt(uintptr(t.ns), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, -1, false
	}
	root, err = unix.FcntlInt(uintptr(t.root), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		unix.Close(ns)
		return -1, -1, false
	}
	return ns, root, true
}

// ensure builds the template in the background unless it is ready or
// being built. cfg gives the root's mount point and the runtime to bind.
func (t *treeTemplate) ensure(cfg launchConfig) {
	t.mu.Lock()
	if t.state != tmplNone {
		t.mu.Unlock()
		return
	}
	t.state = tmplBuilding
	t.mu.Unlock()
	cfg.Hostname, cfg.HomeDir = tmplHostname, ""
	go onDiscardedThread(func() {
		sources := treeSources() // before: a change meanwhile makes it stale
		ns, root, err := buildTemplate(cfg)
		t.mu.Lock()
		defer t.mu.Unlock()
		if err != nil {
			// Left at tmplBuilding: a host where it fails once fails
			// again; every start builds its tree, as without one.
			return
		}
		t.ns, t.root, t.sources, t.state = ns, root, sources, tmplReady
	})
}

// invalidate drops a template that failed to clone or went stale, so the
// next start builds a new one.
func (t *treeTemplate) invalidate() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state == tmplReady {
		unix.Close(t.ns)
		unix.Close(t.root)
		t.state = tmplNone
	}
}

// buildTemplate runs on a discarded thread: a new mount namespace, the
// shared tree in it, and descriptors of both.
func buildTemplate(cfg launchConfig) (ns, root int, err error) {
	if err := unix.Unshare(unix.CLONE_NEWNS | unix.CLONE_FS); err != nil {
		return -1, -1, fmt.Errorf("unshare: %w", err)
	}
	treeUmask()
	cfg.Mounts = nil // no sandbox's mount points in the shared tree
	if err := buildTreeShared(cfg); err != nil {
		return -1, -1, err
	}
	// /dev read-only now, not by the first sandbox (finishTree remounts
	// it too; the clones share its superblock).
	if err := mount("", cfg.Root+"/dev", "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NOEXEC, "mode=755,size=64k"); err != nil {
		return -1, -1, err
	}
	ns, err = unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, -1, err
	}
	// Into the tree, the host's mounts detached (see treeTemplate).
	if err := pivot(cfg.Root); err != nil {
		unix.Close(ns)
		return -1, -1, err
	}
	root, err = unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(ns)
		return -1, -1, err
	}
	return ns, root, nil
}

// cloneTemplate, on a thread with its own fs (unshare CLONE_FS), copies
// the template's tree and attaches it at lc.Root in the mount namespace
// mnt, which the thread is left in. It reports false, with nothing
// attached, when the template could not be cloned.
func cloneTemplate(ns, root, mnt int, lc launchConfig) (bool, error) {
	if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
		return false, nil // still in the host's: the caller builds the tree
	}
	fd, cerr := unix.OpenTree(root, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_RECURSIVE|unix.AT_EMPTY_PATH)
	if err := unix.Setns(mnt, unix.CLONE_NEWNS); err != nil {
		if cerr == nil {
			unix.Close(fd)
		}
		return false, fmt.Errorf("join the sandbox's namespace: %w", err)
	}
	if cerr != nil {
		return false, nil
	}
	defer unix.Close(fd)
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, lc.Root, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return false, nil
	}
	return true, personalize(lc)
}

// personalize binds the sandbox's own /etc/hosts and /etc/hostname over
// the template's, from a small tmpfs mounted on /run for the moment
// (read-only once written, detached once bound), then binds its home.
func personalize(lc launchConfig) error {
	run := lc.Root + "/run"
	if err := mount("tmpfs", run, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=16k"); err != nil {
		return err
	}
	files := etcfiles.Files(lc.Hostname)
	for _, name := range []string{"hosts", "hostname"} {
		if err := os.WriteFile(run+"/"+name, []byte(files[name]), 0o644); err != nil {
			return err
		}
	}
	if err := mount("", run, "", unix.MS_REMOUNT|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=755,size=16k"); err != nil {
		return err
	}
	for _, name := range []string{"hosts", "hostname"} {
		if err := mount(run+"/"+name, lc.Root+"/etc/"+name, "", unix.MS_BIND, ""); err != nil {
			return err
		}
	}
	if err := unix.Unmount(run, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("umount %s: %w", run, err)
	}
	return bindHome(lc)
}
