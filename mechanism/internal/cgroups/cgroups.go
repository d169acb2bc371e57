// Package cgroups creates, limits, verifies, reads and removes the cgroups of
// managoat's sandboxes on cgroup v1, v2 and the hybrid layout (limits on v1,
// placement and kill on the controller-less v2 tree). It is written for this
// module rather than taken from a library because the maintained libraries
// either handle one layout or pull in systemd/dbus; here a cgroup is a few
// files and the layout is detected at run time from /proc/self/cgroup and
// the hierarchies' conventional mount points under /sys/fs/cgroup (checked
// by file system magic), or /proc/self/mountinfo when they are elsewhere.
package cgroups

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mode is the cgroup layout of the host.
type Mode string

// The layouts.
const (
	ModeNone   Mode = "none"
	ModeV1     Mode = "v1"
	ModeV2     Mode = "v2"
	ModeHybrid Mode = "hybrid"
)

// Layout is where this process's cgroups are, per controller.
type Layout struct {
	Mode Mode
	// V1 maps a v1 controller (memory, pids, cpu, cpuacct) to the directory
	// of this process's own cgroup in that hierarchy.
	V1 map[string]string
	// V2 is this process's own cgroup directory in the unified tree ("" if
	// there is none), and V2Controllers the controllers it offers.
	V2            string
	V2Controllers []string
}

// Controllers a sandbox uses.
var wanted = []string{"memory", "pids", "cpu", "cpuacct"}

// Detect reads the layout from /proc/self/cgroup, and the mount points of
// the hierarchies (see standardLayout).
func Detect() (*Layout, error) { return detect("/proc/self/cgroup", wanted) }

// Of reads the cgroups of another process (a container's init): the same
// layout, with V1 holding the given v1 controllers.
func Of(pid int, controllers ...string) (*Layout, error) {
	return detect(fmt.Sprintf("/proc/%d/cgroup", pid), controllers)
}

func detect(cgroupFile string, wanted []string) (*Layout, error) {
	cg, err := os.ReadFile(cgroupFile)
	if err != nil {
		return nil, err
	}
	own := ownCgroups(cg)
	l, ok := standardLayout(stdRoot, own, wanted)
	if !ok {
		mi, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return nil, err
		}
		l = mountinfoLayout(mi, own, wanted)
	}
	if l.V2 != "" {
		if b, err := os.ReadFile(filepath.Join(l.V2, "cgroup.controllers")); err == nil {
			l.V2Controllers = strings.Fields(string(b))
		}
	}
	switch {
	case l.V2 != "" && len(l.V1) == 0:
		l.Mode = ModeV2
	case l.V2 != "" && len(l.V1) > 0:
		l.Mode = ModeHybrid
	case len(l.V1) > 0:
		l.Mode = ModeV1
	default:
		l.Mode = ModeNone
	}
	return l, nil
}

// stdRoot is where cgroup hierarchies are conventionally mounted.
const stdRoot = "/sys/fs/cgroup"

// standardLayout finds the hierarchies of own at their conventional mount
// points: the unified tree at root (v2) or root/unified (hybrid), a v1
// controller at root/<controller>, each checked by its file system magic
// and checked to be mounted from its hierarchy's root (a v1 root alone has
// cgroup.sane_behavior; a v2 root alone has no cgroup.type), so a subtree
// mounted there, as in a container, is not taken for the whole tree; and
// each of own's directories must exist. ok is false when any wanted one is
// not found so: the caller reads mountinfo, which costs every process a
// traversal of its mount table (0.1-0.5 ms here). A hierarchy mounted
// under another controller's name would be taken for that controller; its
// limit files would be missing, which Create and Verify report.
func standardLayout(root string, own map[string]string, wanted []string) (*Layout, bool) {
	l := &Layout{V1: map[string]string{}}
	isDir := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && st.IsDir()
	}
	exists := func(p string) bool {
		_, err := os.Stat(p)
		return err == nil
	}
	var fs unix.Statfs_t
	if p, ok := own[""]; ok {
		mnt := ""
		for _, m := range []string{root, root + "/unified"} {
			if unix.Statfs(m, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
				mnt = m
				break
			}
		}
		if mnt == "" || exists(mnt+"/cgroup.type") || !isDir(filepath.Join(mnt, p)) {
			return nil, false
		}
		l.V2 = filepath.Join(mnt, p)
	}
	for _, c := range wanted {
		p, ok := own[c]
		if !ok {
			continue
		}
		// cpu and cpuacct are links to their co-mount (cpu,cpuacct):
		// named by the mount, as mountinfo names them.
		mnt, err := filepath.EvalSymlinks(root + "/" + c)
		if err != nil {
			return nil, false
		}
		if unix.Statfs(mnt, &fs) != nil || fs.Type != unix.CGROUP_SUPER_MAGIC ||
			!exists(mnt+"/cgroup.sane_behavior") || !isDir(filepath.Join(mnt, p)) {
			return nil, false
		}
		l.V1[c] = filepath.Join(mnt, p)
	}
	return l, true
}

// ownCgroups parses /proc/<pid>/cgroup: controller (or "" for the unified
// tree) to the process's path in that hierarchy.
func ownCgroups(cg []byte) map[string]string {
	own := map[string]string{} // controller or "" (v2) -> path
	for _, line := range strings.Split(strings.TrimSpace(string(cg)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			own[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own
}

// mountinfoLayout finds the hierarchies of own in mountinfo.
func mountinfoLayout(mi []byte, own map[string]string, wanted []string) *Layout {
	l := &Layout{V1: map[string]string{}}
	for _, line := range strings.Split(string(mi), "\n") {
		f := strings.Fields(line)
		sep := -1
		for i, x := range f {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+3 > len(f) {
			continue
		}
		root, mnt, fstype, super := f[3], unescape(f[4]), f[sep+1], f[len(f)-1]
		switch fstype {
		case "cgroup2":
			if p, ok := own[""]; ok && l.V2 == "" {
				l.V2 = join(mnt, root, p)
			}
		case "cgroup":
			for _, opt := range strings.Split(super, ",") {
				for _, w := range wanted {
					if opt == w {
						if p, ok := own[w]; ok {
							if _, dup := l.V1[w]; !dup {
								l.V1[w] = join(mnt, root, p)
							}
						}
					}
				}
			}
		}
	}
	return l
}

// unescape decodes the octal escapes (\ooo) the kernel writes in
// mountinfo's paths for space, tab, newline and backslash.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

func join(mnt, root, p string) string {
	if root != "/" {
		if p == root || strings.HasPrefix(p, root+"/") {
			p = strings.TrimPrefix(p, root)
		}
	}
	return filepath.Join(mnt, p)
}

func (l *Layout) v2Has(c string) bool {
	for _, x := range l.V2Controllers {
		if x == c {
			return true
		}
	}
	return false
}

// Where returns where controller c lives: "v1", "v2" or "" (nowhere).
func (l *Layout) Where(c string) string {
	if l.v2Has(c) {
		return "v2"
	}
	if _, ok := l.V1[c]; ok {
		return "v1"
	}
	return ""
}

// Limits are the values a group is created with; zero means unlimited.
type Limits struct {
	MemoryBytes int64
	Pids        int64
	CPUMillis   int64
}

// CPUPeriod is the CFS period used for CPU quotas (100 ms).
const CPUPeriod = 100000

// Group is one sandbox's cgroups.
type Group struct {
	Name string
	V1   map[string]string // controller -> dir
	V2   string            // dir in the unified tree, or ""
	v2c  map[string]bool   // controllers served by V2
}

// Open returns the group called name (which may or may not exist) in every
// hierarchy that serves a controller a sandbox uses.
func (l *Layout) Open(name string) *Group {
	return l.OpenFor(name, Limits{MemoryBytes: 1, Pids: 1, CPUMillis: 1})
}

// OpenFor returns the group called name (which may or may not exist) as
// created for lim. A v1 hierarchy is used only for a controller that lim
// needs (joining a v1 cgroup costs the kernel an RCU synchronisation per
// hierarchy); cpuacct is joined only when there is no v2 tree to read CPU
// time from.
func (l *Layout) OpenFor(name string, lim Limits) *Group {
	g := &Group{Name: name, V1: map[string]string{}, v2c: map[string]bool{}}
	if l.V2 != "" {
		g.V2 = filepath.Join(l.V2, name)
	}
	need := map[string]bool{
		"memory": lim.MemoryBytes > 0, "pids": lim.Pids > 0, "cpu": lim.CPUMillis > 0,
		"cpuacct": l.V2 == "",
	}
	for _, c := range wanted {
		switch {
		case l.v2Has(c) || (c == "cpuacct" && l.v2Has("cpu")):
			g.v2c[c] = true
		case l.V1[c] != "" && need[c]:
			g.V1[c] = filepath.Join(l.V1[c], name)
		}
	}
	return g
}

// Create makes the group's directories and writes lim. Each non-zero limit
// needs its controller; a missing one is an error naming it. On error
// everything created is removed.
func (l *Layout) Create(name string, lim Limits) (g *Group, err error) {
	g = l.OpenFor(name, lim)
	need := map[string]bool{"memory": lim.MemoryBytes > 0, "pids": lim.Pids > 0, "cpu": lim.CPUMillis > 0}
	for c, n := range need {
		if n && !g.v2c[c] && g.V1[c] == "" {
			return nil, fmt.Errorf("cgroup controller %s is not available (layout %s)", c, l.Mode)
		}
	}
	created := g // the named result is nil on error returns
	defer func() {
		if err != nil {
			_ = created.Remove(context.Background())
		}
	}()
	if g.V2 != "" {
		var enable []string
		for c := range g.v2c {
			if c != "cpuacct" {
				enable = append(enable, "+"+c)
			}
		}
		if len(enable) > 0 {
			// Enable the controllers for our children; tolerated if
			// already enabled, reported if the no-internal-process rule
			// refuses it.
			sub := filepath.Join(l.V2, "cgroup.subtree_control")
			cur, _ := os.ReadFile(sub)
			for _, e := range enable {
				if !bytes.Contains(cur, []byte(e[1:])) {
					if werr := os.WriteFile(sub, []byte(e), 0); werr != nil {
						return nil, fmt.Errorf("enable %s in %s: %w", e, sub, werr)
					}
				}
			}
		}
		if err := os.Mkdir(g.V2, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	for _, d := range g.V1 {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	if lim.MemoryBytes > 0 {
		if g.v2c["memory"] {
			if err := write(g.V2, "memory.max", lim.MemoryBytes); err != nil {
				return nil, err
			}
			_ = write(g.V2, "memory.swap.max", 0)
			_ = os.WriteFile(filepath.Join(g.V2, "memory.oom.group"), []byte("1"), 0)
		} else {
			if err := write(g.V1["memory"], "memory.limit_in_bytes", lim.MemoryBytes); err != nil {
				return nil, err
			}
			if exists(filepath.Join(g.V1["memory"], "memory.memsw.limit_in_bytes")) {
				if err := write(g.V1["memory"], "memory.memsw.limit_in_bytes", lim.MemoryBytes); err != nil {
					return nil, err
				}
			}
		}
	}
	if lim.Pids > 0 {
		dir := g.V1["pids"]
		if g.v2c["pids"] {
			dir = g.V2
		}
		if err := write(dir, "pids.max", lim.Pids); err != nil {
			return nil, err
		}
	}
	if lim.CPUMillis > 0 {
		quota := lim.CPUMillis * CPUPeriod / 1000
		if quota < 1000 {
			quota = 1000 // the kernel's minimum quota is 1 ms
		}
		if g.v2c["cpu"] {
			if err := os.WriteFile(filepath.Join(g.V2, "cpu.max"), fmt.Appendf(nil, "%d %d", quota, CPUPeriod), 0); err != nil {
				return nil, err
			}
		} else {
			if err := write(g.V1["cpu"], "cpu.cfs_period_us", CPUPeriod); err != nil {
				return nil, err
			}
			if err := write(g.V1["cpu"], "cpu.cfs_quota_us", quota); err != nil {
				return nil, err
			}
		}
	}
	return g, nil
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func write(dir, file string, v int64) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(strconv.FormatInt(v, 10)), 0); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, file), err)
	}
	return nil
}

func readInt(p string) (int64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return 0, err
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return -1, nil
	}
	return strconv.ParseInt(s, 10, 64)
}

func readKey(p, key string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("%s: no key %s", p, key)
}

// V2FD opens the v2 directory for CLONE_INTO_CGROUP; -1 when there is none.
func (g *Group) V2FD() (int, error) {
	if g.V2 == "" {
		return -1, nil
	}
	return unix.Open(g.V2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
}

// AddProc writes pid into every v1 hierarchy's cgroup.procs (on v2 the
// process is placed at clone time with CLONE_INTO_CGROUP).
func (g *Group) AddProc(pid int) error {
	for c, d := range g.V1 {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("place pid %d in %s cgroup: %w", pid, c, err)
		}
	}
	return nil
}

// Verify reads back what is in force: every limit of lim, and that pid is
// a member of every directory of the group.
func (g *Group) Verify(lim Limits, pid int) error {
	page := int64(os.Getpagesize())
	if lim.MemoryBytes > 0 {
		var got int64
		var err error
		if g.v2c["memory"] {
			got, err = readInt(filepath.Join(g.V2, "memory.max"))
		} else {
			got, err = readInt(filepath.Join(g.V1["memory"], "memory.limit_in_bytes"))
		}
		if err != nil {
			return fmt.Errorf("memory limit unreadable: %w", err)
		}
		if got < 0 || got > lim.MemoryBytes || got < lim.MemoryBytes/page*page {
			return fmt.Errorf("memory limit in force is %d, want %d", got, lim.MemoryBytes)
		}
	}
	if lim.Pids > 0 {
		dir := g.V1["pids"]
		if g.v2c["pids"] {
			dir = g.V2
		}
		got, err := readInt(filepath.Join(dir, "pids.max"))
		if err != nil || got != lim.Pids {
			return fmt.Errorf("pids limit in force is %d (%v), want %d", got, err, lim.Pids)
		}
	}
	if lim.CPUMillis > 0 {
		var quota int64
		if g.v2c["cpu"] {
			b, err := os.ReadFile(filepath.Join(g.V2, "cpu.max"))
			if err != nil {
				return fmt.Errorf("cpu quota unreadable: %w", err)
			}
			f := strings.Fields(string(b))
			if len(f) == 2 && f[0] != "max" {
				quota, _ = strconv.ParseInt(f[0], 10, 64)
			}
		} else {
			q, err := readInt(filepath.Join(g.V1["cpu"], "cpu.cfs_quota_us"))
			if err != nil {
				return fmt.Errorf("cpu quota unreadable: %w", err)
			}
			quota = q
		}
		if quota <= 0 {
			return fmt.Errorf("cpu quota not in force")
		}
	}
	if pid > 0 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		if err != nil {
			return fmt.Errorf("cannot read cgroups of pid %d: %w", pid, err)
		}
		for c, d := range g.V1 {
			if !memberOf(d, pid) {
				return fmt.Errorf("pid %d is not in its %s cgroup %s (%s)", pid, c, d, strings.TrimSpace(string(b)))
			}
		}
		if g.V2 != "" && !memberOf(g.V2, pid) {
			return fmt.Errorf("pid %d is not in its v2 cgroup %s", pid, g.V2)
		}
	}
	return nil
}

func memberOf(dir string, pid int) bool {
	for _, p := range Procs(dir) {
		if p == pid {
			return true
		}
	}
	return false
}

// Procs lists the pids in dir's cgroup.procs.
func Procs(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			out = append(out, n)
		}
	}
	return out
}

// Exists reports whether any directory of the group exists.
func (g *Group) Exists() bool {
	if g.V2 != "" && exists(g.V2) {
		return true
	}
	for _, d := range g.V1 {
		if exists(d) {
			return true
		}
	}
	return false
}

// Kill sends SIGKILL to every process in the group: cgroup.kill on v2 when
// the kernel has it, else each pid listed in each directory.
func (g *Group) Kill() {
	if g.V2 != "" && exists(filepath.Join(g.V2, "cgroup.kill")) {
		_ = os.WriteFile(filepath.Join(g.V2, "cgroup.kill"), []byte("1"), 0)
	}
	for _, d := range g.Dirs() {
		for _, p := range Procs(d) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

// Freeze stops (on) or continues every process of the group where it is.
// With a v2 directory that has cgroup.freeze, it is the kernel's freezer,
// and Freeze waits (until ctx ends) for cgroup.events to say "frozen 1".
// Without one (a host with v1 hierarchies only) it sends SIGSTOP, or
// SIGCONT, to each process of each directory, again until a pass finds no
// process it has not signalled: a stopped process forks no more, so the
// passes end. A process the freezer holds can still be killed.
func (g *Group) Freeze(ctx context.Context, on bool) error {
	if g.V2 != "" && exists(filepath.Join(g.V2, "cgroup.freeze")) {
		v := []byte("0")
		if on {
			v = []byte("1")
		}
		if err := os.WriteFile(filepath.Join(g.V2, "cgroup.freeze"), v, 0); err != nil {
			return fmt.Errorf("freeze %s: %w", g.V2, err)
		}
		for on {
			ev, err := os.ReadFile(filepath.Join(g.V2, "cgroup.events"))
			if err != nil {
				return fmt.Errorf("freeze %s: %w", g.V2, err)
			}
			if bytes.Contains(ev, []byte("frozen 1")) {
				break
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("freeze %s: not frozen yet: %w", g.V2, err)
			}
			time.Sleep(time.Millisecond)
		}
		return nil
	}
	sig := syscall.SIGCONT
	if on {
		sig = syscall.SIGSTOP
	}
	seen := map[int]bool{}
	for {
		fresh := false
		for _, d := range g.Dirs() {
			for _, p := range Procs(d) {
				if !seen[p] {
					seen[p], fresh = true, true
					_ = syscall.Kill(p, sig)
				}
			}
		}
		if !fresh {
			break
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("freeze %s: processes keep appearing: %w", g.Name, err)
		}
	}
	// A signal is delivered when its process next runs: wait until each
	// one is stopped (or running again), as the v2 freezer's wait does.
	for p := range seen {
		for {
			st, gone := stopped(p)
			if gone || st == on {
				break
			}
			if err := ctx.Err(); err != nil {
				return fmt.Errorf("freeze %s: pid %d not yet stopped=%v: %w", g.Name, p, on, err)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return nil
}

// stopped reports whether pid is in the stopped state (T), and whether it
// is gone (or a zombie): then it is neither to wait for.
func stopped(pid int) (stopped, gone bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	i := bytes.LastIndexByte(b, ')')
	if err != nil || i < 0 || i+2 >= len(b) {
		return false, true
	}
	switch b[i+2] {
	case 'T', 't':
		return true, false
	case 'Z', 'X':
		return false, true
	}
	return false, false
}

// Dirs are the group's directories, one per hierarchy (some may not
// exist).
func (g *Group) Dirs() []string {
	var ds []string
	for _, d := range g.V1 {
		ds = append(ds, d)
	}
	if g.V2 != "" {
		ds = append(ds, g.V2)
	}
	return ds
}

// Remove waits for the group to empty (killing stragglers) and removes
// every directory. Absent directories are fine.
func (g *Group) Remove(ctx context.Context) error {
	deadline := time.Now().Add(5 * time.Second)
	var last error
	for {
		last = nil
		for _, d := range g.Dirs() {
			if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
				last = fmt.Errorf("rmdir %s: %w", d, err)
			}
		}
		if last == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return last
		}
		g.Kill()
		time.Sleep(5 * time.Millisecond)
	}
}

// Stats are the group's counters.
type Stats struct {
	CPUTime     time.Duration
	MemoryBytes int64
	OOMKills    int64 // memory.events oom_kill (v2) or memory.oom_control oom_kill (v1)
	MemFailcnt  int64 // v1 memory.failcnt, or v2 memory.events max
	PidsMax     int64 // pids.events max: forks refused by pids.max
	Throttled   int64 // cpu.stat nr_throttled
}

// Stats reads the counters; missing files leave zeros.
func (g *Group) Stats() Stats {
	var s Stats
	if g.v2c["memory"] {
		s.MemoryBytes, _ = readInt(filepath.Join(g.V2, "memory.current"))
		s.OOMKills, _ = readKey(filepath.Join(g.V2, "memory.events"), "oom_kill")
		s.MemFailcnt, _ = readKey(filepath.Join(g.V2, "memory.events"), "max")
	} else if d := g.V1["memory"]; d != "" {
		s.MemoryBytes, _ = readInt(filepath.Join(d, "memory.usage_in_bytes"))
		s.OOMKills, _ = readKey(filepath.Join(d, "memory.oom_control"), "oom_kill")
		s.MemFailcnt, _ = readInt(filepath.Join(d, "memory.failcnt"))
	}
	if g.v2c["pids"] {
		s.PidsMax, _ = readKey(filepath.Join(g.V2, "pids.events"), "max")
	} else if d := g.V1["pids"]; d != "" {
		s.PidsMax, _ = readKey(filepath.Join(d, "pids.events"), "max")
	}
	if g.V2 != "" {
		// usage_usec is a core cgroup2 file, there with or without the
		// cpu controller.
		us, _ := readKey(filepath.Join(g.V2, "cpu.stat"), "usage_usec")
		s.CPUTime = time.Duration(us) * time.Microsecond
	} else if d := g.V1["cpuacct"]; d != "" {
		ns, _ := readInt(filepath.Join(d, "cpuacct.usage"))
		s.CPUTime = time.Duration(ns)
	}
	if g.v2c["cpu"] {
		s.Throttled, _ = readKey(filepath.Join(g.V2, "cpu.stat"), "nr_throttled")
	} else if d := g.V1["cpu"]; d != "" {
		s.Throttled, _ = readKey(filepath.Join(d, "cpu.stat"), "nr_throttled")
	}
	if s.MemoryBytes == 0 {
		s.MemoryBytes = g.rss()
	}
	return s
}

// rss sums the resident memory of the group's processes (used when no
// memory controller accounts for the group).
func (g *Group) rss() int64 {
	var total int64
	for _, d := range g.Dirs() {
		for _, p := range Procs(d) {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", p))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) > 1 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				total += n * int64(os.Getpagesize())
			}
		}
		break
	}
	return total
}
