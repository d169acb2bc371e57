package mechanism

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// BootCache is a Prober that remembers, in a file, the capabilities its
// underlying Prober found available during the current boot, so that a
// short-lived process (one `managoat run`) does not pay the host probes
// (they create namespaces, cgroups, seccomp and Landlock rulesets: ~8 ms
// here) on every start.
//
// Only verdicts of available are kept: an unavailable capability is probed
// again each time, so a host that gains one is seen at once. A capability
// the host has lost since is caught by the mechanism anyway, which fails
// closed on the real operation (a cgroup it cannot create or whose limit
// does not read back, a ruleset or filter that does not load); the
// mechanism then calls Forget, and the next gate probes for real. The
// verdicts are keyed by the boot id, the kernel release, the effective uid
// and the running executable (path, size, modification time), so a
// reboot, a kernel or binary upgrade or another user starts afresh; the
// file keeps the verdicts of the last 8 keys, so binaries used in turn do
// not undo each other's. A file that is missing, unreadable, corrupt or in
// a directory others may write is ignored.
type BootCache struct {
	Path string // the cache file; empty disables the cache
	P    Prober

	mu     sync.Mutex
	loaded bool
	key    string
	avail  map[Capability]string
}

// bootCacheFile holds the verdicts of up to bootCacheKeys keys, the most
// recently written first: two binaries used in turn (an installed one and
// `go run`) each keep theirs rather than probing again after the other.
type bootCacheFile struct {
	Entries []bootCacheEntry `json:"entries"`
}

type bootCacheEntry struct {
	Key       string                `json:"key"`
	Available map[Capability]string `json:"available"`
}

const bootCacheKeys = 8

// BootKey identifies this boot, kernel, effective user and binary; "" when
// unknown. What is derived from the host and this binary, and kept across
// processes until the host reboots (the probe verdicts of BootCache, the
// jail's tree template), is valid only under the same key. It is computed
// once per process: the binary this process runs is the one it started
// with, whatever has been installed over its path since.
func BootKey() string { return bootKey() }

var bootKey = sync.OnceValue(func() string {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var rel strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		rel.WriteByte(byte(c))
	}
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	st, err := os.Stat(exe)
	if err != nil {
		return ""
	}
	return "v1 boot=" + strings.TrimSpace(string(boot)) + " kernel=" + rel.String() +
		" euid=" + strconv.Itoa(os.Geteuid()) + " exe=" + exe + " size=" + strconv.FormatInt(st.Size(), 10) +
		" mtime=" + strconv.FormatInt(st.ModTime().UnixNano(), 10)
})

// safeDir reports whether dir is owned by the effective uid and not
// writable by group or others: a file there was written by this user.
func safeDir(dir string) bool {
	st, err := os.Lstat(dir)
	if err != nil || !st.IsDir() || st.Mode().Perm()&0o022 != 0 {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	return ok && int(sys.Uid) == os.Geteuid()
}

func (c *BootCache) load() {
	if c.loaded {
		return
	}
	c.loaded = true
	c.avail = map[Capability]string{}
	if c.Path == "" {
		return
	}
	c.key = BootKey()
	if c.key == "" || !safeDir(filepath.Dir(c.Path)) {
		c.Path = ""
		return
	}
	for k, v := range c.read()[c.key] {
		c.avail[k] = v
	}
}

// read returns the file's entries by key (none for a missing, unreadable or
// corrupt file).
func (c *BootCache) read() map[string]map[Capability]string {
	b, err := os.ReadFile(c.Path)
	if err != nil {
		return nil
	}
	var f bootCacheFile
	if json.Unmarshal(b, &f) != nil {
		return nil
	}
	m := map[string]map[Capability]string{}
	for _, e := range f.Entries {
		if _, dup := m[e.Key]; !dup && e.Key != "" {
			m[e.Key] = e.Available
		}
	}
	return m
}

// Probe implements Prober.
func (c *BootCache) Probe(ctx context.Context, name Capability) Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.load()
	if d, ok := c.avail[name]; ok {
		return Report{Name: name, Available: true, Detail: d}
	}
	r := c.P.Probe(ctx, name)
	if r.Available && c.Path != "" {
		c.avail[name] = r.Detail
		c.save()
	}
	return r
}

// save writes the verdicts in a new file renamed over the old one, so a
// reader sees one whole file; two processes racing lose nothing worse
// than a verdict the next one probes again.
func (c *BootCache) save() {
	f := bootCacheFile{Entries: []bootCacheEntry{{Key: c.key, Available: c.avail}}}
	if b, err := os.ReadFile(c.Path); err == nil {
		var old bootCacheFile
		if json.Unmarshal(b, &old) == nil {
			for _, e := range old.Entries {
				if e.Key != c.key && e.Key != "" && len(f.Entries) < bootCacheKeys {
					f.Entries = append(f.Entries, e)
				}
			}
		}
	}
	b, err := json.Marshal(f)
	if err != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(c.Path), ".probes-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(b)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), c.Path) != nil {
		os.Remove(tmp.Name())
	}
}

// Forget drops every remembered verdict, in memory and on disk.
func (c *BootCache) Forget() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.avail = map[Capability]string{}
	if c.Path != "" {
		if err := os.Remove(c.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			c.Path = "" // cannot forget on disk: stop trusting the file
		}
	}
	if f, ok := c.P.(Forgetter); ok {
		f.Forget()
	}
}

// Forgetter is a Prober that remembers verdicts and can drop them; a
// mechanism calls Forget when an operation the gate passed fails on the
// host, so the next gate probes for real.
type Forgetter interface {
	Forget()
}

// Forget drops every cached verdict (and the underlying Prober's, if it
// remembers any).
func (c *CachingProber) Forget() {
	c.mu.Lock()
	c.m = nil
	c.mu.Unlock()
	if f, ok := c.P.(Forgetter); ok {
		f.Forget()
	}
}

// ForgetProbes calls Forget on p when it remembers verdicts.
func ForgetProbes(p Prober) {
	if f, ok := p.(Forgetter); ok {
		f.Forget()
	}
}

// DefaultRunDir is where managoat keeps its run-time files (control
// sockets, the probe cache): /run/managoat as root, else
// $XDG_RUNTIME_DIR/managoat, else <tmp>/managoat-<uid>, which inTemp
// reports.
func DefaultRunDir() (dir string, inTemp bool) {
	switch {
	case os.Geteuid() == 0:
		return "/run/managoat", false
	case os.Getenv("XDG_RUNTIME_DIR") != "":
		return filepath.Join(os.Getenv("XDG_RUNTIME_DIR"), "managoat"), false
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("managoat-%d", os.Getuid())), true
}

// DefaultBootCachePath is where HostProber keeps its verdicts: in
// DefaultRunDir, "" (no file) when that is under the temporary directory.
// The directory is created 0700.
func DefaultBootCachePath() string {
	dir, inTemp := DefaultRunDir()
	if inTemp {
		return ""
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return ""
	}
	return filepath.Join(dir, "probes.json")
}
