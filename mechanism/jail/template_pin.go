package jail

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/mechanism"
)

// A pinned template outlives the process that built it (Config.TemplateDir).
// A process that starts one sandbox and exits (managoat run, a sandbox's
// supervisor) never reaches its second start, so the in-process template
// never serves it, and building the tree is the longest step of its
// start. With a TemplateDir, the first start that finds no usable
// template there builds one in place of its own tree, clones it like any
// later start, and pins its mount namespace on a file in the directory
// (a bind mount of the namespace's nsfs file, as `ip netns` pins network
// namespaces); template.json names that file, with the key and the host
// sources it was built from. Every later process's first start adopts it:
// it opens the file, joins the namespace on a discarded thread to reach
// its root, and clones it.
//
// A pinned template is used only under the same key: boot, kernel,
// binary (mechanism.BootKey), the workload's uid and gid (they are in its
// /etc/passwd) and treeLayout. And only while the host's sources are
// those it was built from (fileID): otherwise the start builds a new one
// and replaces it; the old pin is unmounted (processes that opened it
// keep it until they close it). The directory is private to root (0700),
// and the pinned tree is read-only like every clone. Pins live until the
// host reboots (the directory is on /run) or they are replaced.

// treeLayout changes whenever buildTreeShared builds something else.
const treeLayout = "tree-v1"

const pinIndex = "template.json"

type pinIndexFile struct {
	Key     string               `json:"key"`
	Pin     string               `json:"pin"`
	NS      [2]uint64            `json:"ns"` // the pinned namespace's (dev, inode)
	Sources map[string][2]uint64 `json:"sources"`
}

// nsID is the (dev, inode) of the namespace behind descriptor fd.
func nsID(fd int) ([2]uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return [2]uint64{}, err
	}
	return [2]uint64{st.Dev, st.Ino}, nil
}

func templateKey(lc launchConfig) string {
	boot := mechanism.BootKey()
	if boot == "" {
		return ""
	}
	return fmt.Sprintf("%s %s uid=%d gid=%d", boot, treeLayout, lc.UID, lc.GID)
}

// adopt makes a template pinned in t.dir this process's, when it is
// usable; on the calling thread (a discarded one: it joins the template's
// mount namespace). Tried once per process.
func (t *treeTemplate) adopt(lc launchConfig) bool {
	t.mu.Lock()
	if t.dir == "" || t.adoptTried || t.state != tmplNone {
		t.mu.Unlock()
		return false
	}
	t.adoptTried = true
	t.mu.Unlock()
	key := templateKey(lc)
	// Only from a directory no one else could have written.
	var st unix.Stat_t
	if unix.Stat(t.dir, &st) != nil || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join(t.dir, pinIndex))
	if err != nil || key == "" {
		return false
	}
	var idx pinIndexFile
	if json.Unmarshal(b, &idx) != nil || idx.Key != key || filepath.Base(idx.Pin) != idx.Pin || idx.Pin == "" {
		return false
	}
	sources := map[string]fileID{}
	for p, id := range idx.Sources {
		sources[p] = fileID{id[0], id[1]}
	}
	if !sameSources(sources, treeSources()) {
		return false
	}
	ns, err := unix.Open(filepath.Join(t.dir, idx.Pin), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false
	}
	// The namespace the index was written for, not whatever else may be
	// mounted there.
	if id, err := nsID(ns); err != nil || id != idx.NS {
		unix.Close(ns)
		return false
	}
	// A file that is not a pinned mount namespace fails here.
	if err := unix.Setns(ns, unix.CLONE_NEWNS); err != nil {
		unix.Close(ns)
		return false
	}
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(ns)
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.state != tmplNone { // another start got there first
		unix.Close(ns)
		unix.Close(root)
		return true
	}
	t.ns, t.root, t.sources, t.state, t.adopted = ns, root, sources, tmplReady, true
	return true
}

// buildPinned builds a template on the calling thread (a discarded one: it
// is left in the template's namespace), makes it this process's and pins
// it in t.dir for the others. False when it could not be built; a build
// that could not be pinned still serves this process.
func (t *treeTemplate) buildPinned(lc launchConfig) bool {
	t.mu.Lock()
	if t.dir == "" || t.state != tmplNone {
		t.mu.Unlock()
		return false
	}
	t.state = tmplBuilding
	t.mu.Unlock()
	cfg := lc
	cfg.Hostname, cfg.HomeDir = tmplHostname, ""
	sources := treeSources()
	ns, root, err := buildTemplate(cfg)
	t.mu.Lock()
	if err != nil {
		t.state = tmplBuilding // as ensure: a host where it fails once fails again
		t.mu.Unlock()
		return false
	}
	t.ns, t.root, t.sources, t.state = ns, root, sources, tmplReady
	t.mu.Unlock()
	// Pinned from a thread in the host's mount namespace (this one is in
	// the template's), so the pin is where other processes look.
	done := make(chan error, 1)
	go func() { done <- t.pin(ns, templateKey(lc), sources) }()
	if err := <-done; err != nil {
		t.pinErr = err
	}
	return true
}

// pin binds the namespace ns on a new file in t.dir and names it in the
// index, replacing (and unpinning) the previous one.
func (t *treeTemplate) pin(ns int, key string, sources map[string]fileID) error {
	if key == "" {
		return errors.New("no key for this host and binary")
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := lock(ctx, t.dir)
	if err != nil {
		return err
	}
	defer unlock()
	name := "mnt-" + randHex()
	path := filepath.Join(t.dir, name)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		return err
	}
	src := "/proc/self/fd/" + strconv.Itoa(ns)
	err = unix.Mount(src, path, "", unix.MS_BIND, "")
	if errors.Is(err, unix.EINVAL) {
		// A namespace file cannot be bound where the mount would
		// propagate (a shared /run): make the directory a private
		// mount of its own, then bind again.
		if err = unix.Mount(t.dir, t.dir, "", unix.MS_BIND, ""); err == nil {
			err = unix.Mount("", t.dir, "", unix.MS_PRIVATE, "")
		}
		if err == nil {
			err = unix.Mount(src, path, "", unix.MS_BIND, "")
		}
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("pin the tree template: %w", err)
	}
	id, err := nsID(ns)
	if err != nil {
		unpin(path)
		return err
	}
	idx := pinIndexFile{Key: key, Pin: name, NS: id, Sources: map[string][2]uint64{}}
	for p, id := range sources {
		idx.Sources[p] = [2]uint64{id.dev, id.ino}
	}
	b, _ := json.Marshal(idx)
	var old pinIndexFile
	if ob, err := os.ReadFile(filepath.Join(t.dir, pinIndex)); err == nil {
		_ = json.Unmarshal(ob, &old)
	}
	tmp := filepath.Join(t.dir, "."+pinIndex+"."+name)
	if err := os.WriteFile(tmp, b, 0o600); err == nil {
		err = os.Rename(tmp, filepath.Join(t.dir, pinIndex))
		if err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		unpin(path)
		return err
	}
	if old.Pin != "" && old.Pin != name && filepath.Base(old.Pin) == old.Pin {
		unpin(filepath.Join(t.dir, old.Pin))
	}
	return nil
}

// unpin unmounts a pin and removes its file.
func unpin(path string) {
	_ = unix.Unmount(path, unix.MNT_DETACH)
	_ = os.Remove(path)
}

// UnpinTemplates removes every tree template pinned in dir (a
// Config.TemplateDir): their namespaces end once no process holds them.
// For tests and for an administrator's cleanup; sandboxes are unaffected.
func UnpinTemplates(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if len(e.Name()) > 4 && e.Name()[:4] == "mnt-" {
			unpin(filepath.Join(dir, e.Name()))
		}
	}
	_ = os.Remove(filepath.Join(dir, pinIndex))
	// The directory's own private bind, if pin made one.
	_ = unix.Unmount(dir, unix.MNT_DETACH)
	return nil
}

func sameSources(a, b map[string]fileID) bool {
	if len(a) != len(b) {
		return false
	}
	for p, id := range a {
		if b[p] != id {
			return false
		}
	}
	return true
}
