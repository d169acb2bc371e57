package testenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Environment of an enclosed test binary.
const (
	// envEnclosure names the enclosure's cgroup; set, the process is inside
	// one, and so is every process it starts.
	envEnclosure = "MANAGOAT_TEST_ENCLOSURE"
	// envJoin tells the enclosed test binary to join the cgroup first.
	envJoin = "MANAGOAT_TEST_ENCLOSURE_JOIN"
)

// cgroupPrefix begins the name of every enclosure's cgroup; the guard's
// pid and its start time (clock ticks after boot) follow, so a pid reused
// since is not taken for the guard.
const cgroupPrefix = "managoat-enclosure-"

// tempPrefix begins the name of an enclosure's temporary directory: short,
// because a Unix socket's path must fit in 108 bytes and tests bind them
// in their t.TempDir.
const tempPrefix = "mge-"

// Enclose makes sure nothing this test binary starts outlives it,
// whatever ends it: a test timeout's panic, SIGKILL of go test, Ctrl-C.
// Call it in TestMain, after the re-exec hooks and before m.Run:
//
//	func TestMain(m *testing.M) {
//		testenv.Enclose()
//		os.Exit(m.Run())
//	}
//
// As root, Enclose does not return in the process go test started: that
// process becomes the enclosure's guard. It sweeps what enclosures of dead
// guards left (see Sweep), makes a cgroup and a temporary directory named
// for itself, and runs the same test binary again as its child, with the
// same arguments, in that cgroup (so every process it starts, sandboxes,
// supervisors and containers detached in sessions of their own included,
// is found by it) and with TMPDIR set to that directory (so every
// t.TempDir, and every mount a test makes in one, is found by it too).
// The guard is a child subreaper: whatever the tests start and leave
// behind is reparented to it, not to init. When the child ends, or the
// guard's own parent (go test) dies, or the guard is asked to stop
// (SIGINT, SIGTERM, SIGHUP, SIGQUIT, passed on to the child first), the
// guard kills every process left in the enclosure, removes its cgroups,
// unmounts what is mounted in its directory, removes that, and exits as
// the child did. If the guard itself is killed with SIGKILL, the next
// enclosure on this host sweeps what it left, and so does Sweep, which
// cmd internal/testsweep runs.
//
// (The tests do not get a mount namespace of their own: the kernel
// orders mount namespaces by an id that, from Linux 6.18, is not
// monotonic across CPUs, and refuses to bind a namespace's file, as the
// jail's pinned templates do, into a namespace whose id is not lower; in
// a private namespace that refusal came and went with scheduling.)
//
// In the child, and in every process the child starts, Enclose returns at
// once. Without root it returns at once too (tests that need root skip);
// under CI=true as root, a failure to enclose ends the binary.
//
// On a host whose own cgroup offers controllers in the unified tree (pure
// v2), the enclosure makes no cgroup (a process in it would forbid the
// sandboxes' limits below it, by the no-internal-process rule): there the
// subreaper and the directory alone do the work, and a killed guard
// leaves its processes for init.
func Enclose() {
	if os.Getenv(envEnclosure) != "" {
		if os.Getenv(envJoin) != "" {
			os.Unsetenv(envJoin)
			if err := join(os.Getenv(envEnclosure)); err != nil {
				fmt.Fprintln(os.Stderr, "testenv: enclose:", err)
				os.Exit(1)
			}
		}
		return
	}
	if os.Geteuid() != 0 || runtime.GOOS != "linux" {
		return
	}
	code, err := guard()
	if err != nil {
		if InCI() {
			fmt.Fprintln(os.Stderr, "testenv: enclose (under CI=true this is a failure):", err)
			os.Exit(1)
		}
		fmt.Fprintln(os.Stderr, "testenv: enclose: running the tests without an enclosure:", err)
		return
	}
	os.Exit(code)
}

// join is the enclosed child's first step: its cgroup (placement only).
func join(name string) error {
	if name == "-" {
		return nil
	}
	for _, dir := range enclosureDirs(name) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0); err != nil {
			return fmt.Errorf("join %s: %w", dir, err)
		}
	}
	return nil
}

// guard runs the tests in an enclosure and returns their exit code.
func guard() (int, error) {
	if _, err := Sweep(); err != nil {
		fmt.Fprintln(os.Stderr, "testenv: sweep of earlier enclosures:", err)
	}
	self := fmt.Sprintf("%d-%d", os.Getpid(), startTime(os.Getpid()))
	id := cgroupPrefix + self
	tmp := filepath.Join(os.TempDir(), tempPrefix+self)
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return 0, fmt.Errorf("the enclosure's temporary directory: %w", err)
	}
	defer removeTemp(tmp)
	name := "-"
	if hierarchiesOK() {
		name = id
		for _, dir := range enclosureDirs(name) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				removeCgroups(name)
				return 0, fmt.Errorf("make %s: %w", dir, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		removeCgroups(name)
		return 0, fmt.Errorf("child subreaper: %w", err)
	}
	exe, err := os.Executable()
	if err != nil {
		removeCgroups(name)
		return 0, err
	}
	parent := os.Getppid()
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	// The child dies with the guard (its parent death signal is tied to
	// the thread that forks it: this one, locked, stays until we return).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), envEnclosure+"="+name, envJoin+"=1", "TMPDIR="+tmp)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		removeCgroups(name)
		return 0, fmt.Errorf("start the enclosed tests: %w", err)
	}
	child := cmd.Process.Pid
	// Reap every process reparented to us; note the child's status.
	exits := make(chan reaped, 64)
	go func() {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil { // ECHILD: none left
				close(exits)
				return
			}
			exits <- reaped{pid, ws}
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	var status syscall.WaitStatus
	childDone := false
	for !childDone {
		select {
		case e, ok := <-exits:
			if !ok {
				childDone = true
				break
			}
			if e.pid == child {
				status, childDone = e.ws, true
			}
		case s := <-sigs:
			_ = syscall.Kill(child, s.(syscall.Signal))
		case <-tick.C:
			if os.Getppid() != parent { // go test is gone: so are we
				_ = syscall.Kill(child, syscall.SIGKILL)
			}
		}
	}
	killAll(name, exits)
	removeCgroups(name)
	switch {
	case status.Exited():
		return status.ExitStatus(), nil
	case status.Signaled():
		return 128 + int(status.Signal()), nil
	}
	return 1, nil
}

// reaped is a process the guard waited for.
type reaped struct {
	pid int
	ws  syscall.WaitStatus
}

// killAll kills what is left in the enclosure: every process in its
// cgroup, and every descendant of this process (the subreaper), until none
// is left or ten seconds passed; exits drains the reaper's reports.
func killAll(name string, exits <-chan reaped) {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		pids := descendants(os.Getpid())
		if name != "-" {
			for _, dir := range enclosureDirs(name) {
				pids = append(pids, procsBelow(dir)...)
			}
		}
		if len(pids) == 0 {
			break
		}
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
		drain(exits, 50*time.Millisecond)
	}
}

func drain[T any](c <-chan T, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case _, ok := <-c:
			if !ok {
				time.Sleep(d)
				return
			}
		case <-t.C:
			return
		}
	}
}

// descendants lists every process whose chain of parents reaches pid.
func descendants(pid int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	parent := map[int]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp := ppid(p); pp > 0 {
			parent[p] = pp
		}
	}
	var out []int
	for p := range parent {
		for q, n := parent[p], 0; q > 0 && n < 1<<12; q, n = parent[q], n+1 {
			if q == pid {
				out = append(out, p)
				break
			}
		}
	}
	return out
}

// stat returns the fields of /proc/pid/stat after the command's name.
func stat(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func ppid(pid int) int {
	f := stat(pid)
	if len(f) < 2 {
		return 0
	}
	n, _ := strconv.Atoi(f[1])
	return n
}

// startTime is the process's start time in clock ticks after boot (0 if
// it is gone).
func startTime(pid int) uint64 {
	f := stat(pid)
	if len(f) < 20 {
		return 0
	}
	n, _ := strconv.ParseUint(f[19], 10, 64)
	return n
}

// hierarchies returns this process's own cgroup directory in each
// hierarchy the enclosure uses: the unified tree and the v1 pids
// hierarchy. The enclosure's cgroup is made below it.
func hierarchies() []string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		var mnt string
		switch {
		case parts[0] == "0" && parts[1] == "":
			for _, m := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
				var fs unix.Statfs_t
				if unix.Statfs(m, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
					mnt = m
					break
				}
			}
		case slices.Contains(strings.Split(parts[1], ","), "pids"):
			mnt = "/sys/fs/cgroup/pids"
		}
		if mnt == "" {
			continue
		}
		dir := filepath.Join(mnt, parts[2])
		if _, err := os.Stat(dir); err == nil {
			out = append(out, dir)
		}
	}
	return out
}

// hierarchiesOK reports whether the enclosure may make its cgroups: some
// hierarchy to make them in, and no controller of the unified tree that a
// sandbox's limits would need below the test binary.
func hierarchiesOK() bool {
	hs := hierarchies()
	if len(hs) == 0 {
		return false
	}
	for _, own := range hs {
		b, _ := os.ReadFile(filepath.Join(own, "cgroup.controllers"))
		for _, c := range strings.Fields(string(b)) {
			if c == "memory" || c == "pids" || c == "cpu" {
				return false
			}
		}
	}
	return true
}

// enclosureDirs are the directories of the enclosure called name.
func enclosureDirs(name string) []string {
	var out []string
	for _, own := range hierarchies() {
		out = append(out, filepath.Join(own, name))
	}
	return out
}

// procsBelow lists the processes in dir and every cgroup below it.
func procsBelow(dir string) []int {
	var out []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return nil
		}
		b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
		return nil
	})
	return out
}

// removeCgroups removes the enclosure's cgroups, deepest first.
func removeCgroups(name string) {
	if name == "-" {
		return
	}
	removeEnclosure(enclosureDirs(name)...)
}

// removeEnclosure removes an enclosure's cgroups (dirs, one per
// hierarchy), deepest first, and their namesakes elsewhere: a runtime
// (runc, runsc) makes a container's cgroup under its own cgroup in every
// hierarchy, and the jail its limits' in v1 ones, outside the enclosure;
// the same names, empty once their processes are dead.
func removeEnclosure(dirs ...string) {
	names := map[string]bool{}
	for _, dir := range dirs {
		namesBelow(dir, names)
		removeTree(dir)
	}
	removeNamesakes(names)
}

// namesBelow adds the names of the cgroups below dir to names.
func namesBelow(dir string, names map[string]bool) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != dir {
			names[d.Name()] = true
		}
		return nil
	})
}

func removeTree(dir string) {
	var dirs []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = os.Remove(dirs[i])
	}
}

// Sweep kills every process of every enclosure whose guard is gone (its
// pid ended, or was reused since: the start time in the name differs) and
// removes its cgroups and its temporary directory (unmounting what is
// mounted there first), and returns what it removed. An enclosure whose
// processes keep a cgroup busy after ten seconds is reported, not hidden.
func Sweep() ([]string, error) {
	var removed []string
	var errs []error
	for _, own := range hierarchies() {
		// Enclosures are made below the guard's own cgroup: look there,
		// and in its parent (a sweep from inside an enclosure).
		for _, base := range []string{own, filepath.Dir(own)} {
			ents, err := os.ReadDir(base)
			if err != nil {
				continue
			}
			for _, e := range ents {
				if !e.IsDir() || !strings.HasPrefix(e.Name(), cgroupPrefix) || live(e.Name()) {
					continue
				}
				dir := filepath.Join(base, e.Name())
				deadline := time.Now().Add(10 * time.Second)
				for {
					pids := procsBelow(dir)
					if len(pids) == 0 {
						break
					}
					if time.Now().After(deadline) {
						errs = append(errs, fmt.Errorf("%s: processes %v survive SIGKILL", dir, pids))
						break
					}
					if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err != nil {
						for _, p := range pids {
							_ = syscall.Kill(p, syscall.SIGKILL)
						}
					}
					time.Sleep(20 * time.Millisecond)
				}
				removeEnclosure(dir)
				if _, err := os.Stat(dir); err == nil {
					errs = append(errs, fmt.Errorf("%s: not removed", dir))
				} else {
					removed = append(removed, dir)
				}
			}
		}
	}
	// Their temporary directories, with whatever is mounted in them.
	ents, _ := os.ReadDir(os.TempDir())
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), tempPrefix) && !live(e.Name()) {
			dir := filepath.Join(os.TempDir(), e.Name())
			if err := removeTemp(dir); err != nil {
				errs = append(errs, err)
			} else {
				removed = append(removed, dir)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// removeTemp unmounts everything mounted below dir, deepest first, and
// removes it.
func removeTemp(dir string) error {
	for range 10 {
		mounts := mountsBelow(dir)
		if len(mounts) == 0 {
			break
		}
		for _, m := range mounts {
			_ = unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if m := mountsBelow(dir); len(m) > 0 {
		return fmt.Errorf("%s: mounts left: %v", dir, m)
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	}
	return nil
}

// mountsBelow lists the mount points of this mount namespace below dir,
// deepest first.
func mountsBelow(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeOctal(f[4])
		if strings.HasPrefix(mp, dir+"/") || mp == dir {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// unescapeOctal undoes mountinfo's \ooo escapes (of space, tab, newline
// and backslash).
func unescapeOctal(s string) string {
	if !strings.Contains(s, "\\") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// removeNamesakes removes the empty cgroups called one of names, up to
// four levels deep in every hierarchy under /sys/fs/cgroup.
func removeNamesakes(names map[string]bool) {
	if len(names) == 0 {
		return
	}
	var found []string
	var walk func(dir string, depth int)
	walk = func(dir string, depth int) {
		ents, err := os.ReadDir(dir)
		if err != nil {
			return
		}
		for _, e := range ents {
			if !e.IsDir() {
				continue
			}
			p := filepath.Join(dir, e.Name())
			if names[e.Name()] {
				found = append(found, p)
			} else if depth < 4 {
				walk(p, depth+1)
			}
		}
	}
	walk("/sys/fs/cgroup", 0)
	for _, p := range found {
		removeTree(p)
	}
}

// live reports whether the guard named in an enclosure's name runs. A
// name that is not an enclosure's (prefix, pid, start time) counts as
// live: the sweep never touches what it did not make.
func live(name string) bool {
	rest, ok := strings.CutPrefix(name, cgroupPrefix)
	if !ok {
		rest, ok = strings.CutPrefix(name, tempPrefix)
	}
	f := strings.Split(rest, "-")
	if !ok || len(f) != 2 {
		return true
	}
	pid, err1 := strconv.Atoi(f[0])
	st, err2 := strconv.ParseUint(f[1], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return true
	}
	if pid == os.Getpid() {
		return true
	}
	ps := stat(pid)
	if len(ps) < 20 || ps[0] == "Z" || ps[0] == "X" { // gone, or dead and not yet reaped
		return false
	}
	n, _ := strconv.ParseUint(ps[19], 10, 64)
	return n == st
}
