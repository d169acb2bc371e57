package jail

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/flock"
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
// namespaces); an index, template-<key digest>.json, names that file,
// with the key, the binary and the host sources it was built from. Every
// later process's first start adopts it: it opens the file, joins the
// namespace on a discarded thread to reach its root, and clones it.
//
// A pinned template is used only under the same key: boot, kernel,
// binary (mechanism.BootKey), the workload's uid and gid (they are in its
// /etc/passwd) and treeLayout. And only while the host's sources are
// those it was built from (fileID): otherwise the start builds a new one
// and replaces it; the old pin is unmounted (processes that opened it
// keep it until they close it). Each key has its own index, so two
// installed binaries used in turn do not replace each other's template.
// A start that pins also collects the pins of binaries that are gone or
// were replaced, and keeps at most maxPins: tearing a pinned namespace
// down takes a few milliseconds (an RCU grace period), paid only on that
// rare path. The directory is private to root (0700), and the pinned tree
// is read-only like every clone. Pins live until the host reboots (the
// directory is on /run), are replaced, or are collected.

// treeLayout changes whenever buildTreeShared builds something else.
const treeLayout = "tree-v1"

// maxPins bounds the templates pinned in one directory.
const maxPins = 8

type pinIndexFile struct {
	Key     string               `json:"key"`
	Pin     string               `json:"pin"`
	NS      [2]uint64            `json:"ns"` // the pinned namespace's (dev, inode)
	Exe     exeID                `json:"exe"`
	Sources map[string][2]uint64 `json:"sources"`
}

// exeID identifies the binary that pinned a template: while it is there,
// unchanged, its processes may adopt it.
type exeID struct {
	Path  string `json:"path"`
	Size  int64  `json:"size"`
	MTime int64  `json:"mtime"`
}

func thisExe() exeID {
	exe, err := os.Executable()
	if err != nil {
		return exeID{}
	}
	return statExe(exe)
}

func statExe(path string) exeID {
	fi, err := os.Stat(path)
	if err != nil {
		return exeID{}
	}
	return exeID{Path: path, Size: fi.Size(), MTime: fi.ModTime().UnixNano()}
}

// indexName is the index file of the templates pinned under key.
func indexName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "template-" + hex.EncodeToString(sum[:8]) + ".json"
}

func isIndexName(name string) bool {
	return strings.HasPrefix(name, "template-") && strings.HasSuffix(name, ".json")
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
	if key == "" {
		return false
	}
	b, err := os.ReadFile(filepath.Join(t.dir, indexName(key)))
	if err != nil {
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
	go func() { done <- t.pin(ns, templateKey(lc), thisExe(), sources) }()
	if err := <-done; err != nil {
		t.pinErr = err
	}
	return true
}

// pin binds the namespace ns on a new file in t.dir and names it in key's
// index, replacing (and unpinning) key's previous one, then collects the
// pins of binaries that are gone (collect).
func (t *treeTemplate) pin(ns int, key string, exe exeID, sources map[string]fileID) error {
	if key == "" {
		return errors.New("no key for this host and binary")
	}
	if err := os.MkdirAll(t.dir, 0o700); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	unlock, err := flock.Lock(ctx, t.dir)
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
	idx := pinIndexFile{Key: key, Pin: name, NS: id, Exe: exe, Sources: map[string][2]uint64{}}
	for p, id := range sources {
		idx.Sources[p] = [2]uint64{id.dev, id.ino}
	}
	b, _ := json.Marshal(idx)
	index := filepath.Join(t.dir, indexName(key))
	old, _ := readIndex(index)
	tmp := filepath.Join(t.dir, ".tmp-"+name)
	if err = os.WriteFile(tmp, b, 0o600); err == nil {
		if err = os.Rename(tmp, index); err != nil {
			os.Remove(tmp)
		}
	}
	if err != nil {
		unpin(path)
		return err
	}
	if old.Pin != "" && old.Pin != name {
		unpin(filepath.Join(t.dir, old.Pin))
	}
	collect(t.dir, indexName(key))
	return nil
}

// readIndex reads an index; a Pin that is not a plain name in the
// directory reads as none.
func readIndex(path string) (pinIndexFile, error) {
	var idx pinIndexFile
	b, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(b, &idx)
	}
	if err != nil || filepath.Base(idx.Pin) != idx.Pin || !strings.HasPrefix(idx.Pin, "mnt-") {
		idx.Pin = ""
	}
	return idx, err
}

// collect removes, from dir, the templates of binaries that are gone or
// were replaced, then the oldest beyond maxPins (keep is never removed),
// and any pin no index names. The caller holds dir's lock.
func collect(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type live struct {
		name string
		mod  time.Time
	}
	var kept []live
	named := map[string]bool{}
	for _, e := range entries {
		name := e.Name()
		if !isIndexName(name) {
			continue
		}
		path := filepath.Join(dir, name)
		idx, _ := readIndex(path)
		if name != keep && (idx.Exe.Path == "" || statExe(idx.Exe.Path) != idx.Exe) {
			if idx.Pin != "" {
				unpin(filepath.Join(dir, idx.Pin))
			}
			os.Remove(path)
			continue
		}
		named[idx.Pin] = true
		if fi, err := e.Info(); err == nil && name != keep {
			kept = append(kept, live{name, fi.ModTime()})
		}
	}
	slices.SortFunc(kept, func(a, b live) int { return b.mod.Compare(a.mod) })
	for i := maxPins - 1; i < len(kept); i++ { // keep counts as one
		path := filepath.Join(dir, kept[i].name)
		if idx, _ := readIndex(path); idx.Pin != "" {
			unpin(filepath.Join(dir, idx.Pin))
			delete(named, idx.Pin)
		}
		os.Remove(path)
	}
	for _, e := range entries {
		if name := e.Name(); strings.HasPrefix(name, "mnt-") && !named[name] {
			unpin(filepath.Join(dir, name))
		}
	}
}

// unpin unmounts a pin and removes its file.
func unpin(path string) {
	_ = unix.Unmount(path, unix.MNT_DETACH)
	_ = os.Remove(path)
}

// PinnedTemplates counts the tree templates pinned in dir (a
// Config.TemplateDir), for managoat doctor.
func PinnedTemplates(dir string) int {
	entries, _ := os.ReadDir(dir)
	n := 0
	for _, e := range entries {
		if isIndexName(e.Name()) {
			n++
		}
	}
	return n
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
		switch name := e.Name(); {
		case strings.HasPrefix(name, "mnt-"):
			unpin(filepath.Join(dir, name))
		case isIndexName(name):
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
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
