package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
)

// BenchmarkRunTrue measures `managoat run -- true` end to end (a process
// start, create, run, destroy) on the jail and on trusted, against
// `unshare --mount --pid --net --fork true`, with the state directory in
// the temporary directory, and on the jail again with it on tmpfs
// (jail-tmpfs). It also times `managoat version`, which does nothing but
// start and exit this binary: the floor under every arm, which no change
// to the sandbox's path can lower. Each iteration runs them all in turn,
// so that a shared machine's drift hits them alike; the ratios are of the
// medians (of the means too).
func BenchmarkRunTrue(b *testing.B) {
	testenv.RequireRoot(b)
	unshare, err := exec.LookPath("unshare")
	testenv.Require(b, err == nil, "unshare (util-linux) is not installed")
	home := b.TempDir()
	// The same with the state directory on tmpfs, when /dev/shm is one:
	// what the state directory's file system costs (this VM's ext4, with
	// online discard, takes 0.1-0.5 ms per directory made or removed).
	var shmHome string
	var fs unix.Statfs_t
	if unix.Statfs("/dev/shm", &fs) == nil && fs.Type == unix.TMPFS_MAGIC {
		d, err := os.MkdirTemp("/dev/shm", "managoat-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(d) })
		shmHome = d
	}
	// Run as an installed binary (one outside the temporary directory
	// pins the jail's tree template for the next processes).
	installed := installedCopy(b)
	once := func(home, name string, args ...string) time.Duration {
		c := exec.Command(name, args...)
		c.Env = append(os.Environ(), "MANAGOAT_HOME="+home)
		start := time.Now()
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatalf("%s %v: %v %s", name, args, err, out)
		}
		return time.Since(start)
	}
	mechs := []string{"jail", "trusted"}
	for _, m := range mechs { // warm up: the first run probes the host
		once(home, installed, "--mechanism", m, "run", "--", "true")
	}
	if shmHome != "" {
		once(shmHome, installed, "--mechanism", "jail", "run", "--", "true")
	}
	runs := map[string][]time.Duration{}
	for b.Loop() {
		runs["unshare"] = append(runs["unshare"], once(home, unshare, "--mount", "--pid", "--net", "--fork", "true"))
		runs["version"] = append(runs["version"], once(home, installed, "version"))
		for _, m := range mechs {
			runs[m] = append(runs[m], once(home, installed, "--mechanism", m, "run", "--", "true"))
		}
		if shmHome != "" {
			runs["jail-tmpfs"] = append(runs["jail-tmpfs"], once(shmHome, installed, "--mechanism", "jail", "run", "--", "true"))
		}
	}
	if shmHome != "" {
		mechs = append(mechs, "jail-tmpfs")
	}
	mechs = append(mechs, "version")
	median := func(d []time.Duration) time.Duration {
		s := slices.Clone(d)
		slices.Sort(s)
		return s[len(s)/2]
	}
	mean := func(d []time.Duration) time.Duration {
		var t time.Duration
		for _, x := range d {
			t += x
		}
		return t / time.Duration(len(d))
	}
	base := runs["unshare"]
	b.ReportMetric(float64(median(base).Microseconds())/1000, "ms/unshare")
	for _, m := range mechs {
		unit := "ms/run-" + m
		if m == "version" {
			unit = "ms/version"
		}
		b.ReportMetric(float64(median(runs[m]).Microseconds())/1000, unit)
		b.ReportMetric(float64(median(runs[m]))/float64(median(base)), "x-unshare-"+m)
		b.ReportMetric(float64(mean(runs[m]))/float64(mean(base)), "x-unshare-mean-"+m)
	}
}

// installedCopy copies the managoat binary out of the temporary directory,
// under the user's cache directory, removed when b ends.
func installedCopy(b *testing.B) string {
	cache, err := os.UserCacheDir()
	testenv.Require(b, err == nil, fmt.Sprintf("no cache directory for an installed copy: %v", err))
	dir, err := os.MkdirTemp(cache, "managoat-bench-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	data, err := os.ReadFile(binary)
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(dir, "managoat")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		b.Fatal(err)
	}
	return path
}

// BenchmarkManySandboxes: a CLI command's cost does not grow with the
// number of sandboxes. It creates MANAGOAT_BENCH_SANDBOXES (1,000 by
// default) jail sandboxes with the real defaults, sequentially from the
// CLI (reported: s/create-all), and 10 in another state directory; then
// each iteration times, in turn, `exec BOX -- true` and `create` in each
// (the sandbox made removed after, untimed) and `managoat version`. The
// ratios are of the medians: x-exec-many (with N against with 10),
// x-create-many, x-exec-version (exec against version, the Go start-up
// floor). Before the loop, the N idle sandboxes' processes (supervisors
// and everything under them) are watched for 10 s: core-idle is the
// fraction of one core they used, MiB-pss-each their proportional memory
// each. load1-begin and load1-end are the host's load average.
func BenchmarkManySandboxes(b *testing.B) {
	testenv.RequireRoot(b)
	n := 1000
	if v := os.Getenv("MANAGOAT_BENCH_SANDBOXES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 10 {
			b.Fatalf("MANAGOAT_BENCH_SANDBOXES=%q: want a number >= 10", v)
		}
	}
	// Metrics reported before b.Loop are reset by it: kept until after.
	pre := map[string]float64{"load1-begin": load1()}
	installed := installedCopy(b)
	few, many := b.TempDir(), b.TempDir()
	mg := func(home string, args ...string) time.Duration {
		b.Helper()
		c := exec.Command(installed, args...)
		c.Env = append(os.Environ(), "MANAGOAT_HOME="+home)
		start := time.Now()
		if out, err := c.CombinedOutput(); err != nil {
			b.Fatalf("managoat %v: %v %s", args, err, out)
		}
		return time.Since(start)
	}
	removeAll := func(home string, names []string) {
		for len(names) > 0 {
			k := min(len(names), 200)
			c := exec.Command(installed, append([]string{"rm"}, names[:k]...)...)
			c.Env = append(os.Environ(), "MANAGOAT_HOME="+home)
			if out, err := c.CombinedOutput(); err != nil {
				b.Errorf("managoat rm: %v %s", err, out)
			}
			names = names[k:]
		}
	}
	var made []string
	b.Cleanup(func() { removeAll(many, made) })
	began := time.Now()
	for i := range n {
		name := fmt.Sprintf("s%d", i)
		mg(many, "create", name)
		made = append(made, name)
	}
	pre["s/create-all"] = time.Since(began).Seconds()
	var fewMade []string
	b.Cleanup(func() { removeAll(few, fewMade) })
	for i := range 10 {
		name := fmt.Sprintf("s%d", i)
		mg(few, "create", name)
		fewMade = append(fewMade, name)
	}
	cpu, pss, procs := idleCost(b, filepath.Join(many, "sandboxes")+"/", 10*time.Second)
	pre["core-idle"] = cpu
	pre["MiB-pss-each"] = pss / float64(n)
	pre["procs-each"] = float64(procs) / float64(n)
	runs := map[string][]time.Duration{}
	i := 0
	for b.Loop() {
		i++
		name := fmt.Sprintf("t%d", i)
		runs["exec-few"] = append(runs["exec-few"], mg(few, "exec", "s5", "--", "true"))
		runs["exec-many"] = append(runs["exec-many"], mg(many, "exec", fmt.Sprintf("s%d", n/2), "--", "true"))
		runs["version"] = append(runs["version"], mg(few, "version"))
		runs["create-few"] = append(runs["create-few"], mg(few, "create", name))
		runs["create-many"] = append(runs["create-many"], mg(many, "create", name))
		b.StopTimer()
		mg(few, "rm", name)
		mg(many, "rm", name)
		b.StartTimer()
	}
	med := func(k string) float64 {
		s := slices.Clone(runs[k])
		slices.Sort(s)
		return float64(s[len(s)/2].Microseconds()) / 1000
	}
	for _, k := range []string{"exec-few", "exec-many", "create-few", "create-many", "version"} {
		b.ReportMetric(med(k), "ms/"+k)
	}
	b.ReportMetric(med("exec-many")/med("exec-few"), "x-exec-many")
	b.ReportMetric(med("create-many")/med("create-few"), "x-create-many")
	b.ReportMetric(med("exec-few")/med("version"), "x-exec-version")
	b.ReportMetric(load1(), "load1-end")
	for k, v := range pre {
		b.ReportMetric(v, k)
	}
}

// load1 is the host's one-minute load average.
func load1() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// idleCost watches, for d, the processes whose command line names a
// directory under prefix (the supervisors of a state directory's
// sandboxes) and all their descendants, and returns the fraction of one
// core they used together, their PSS in MiB, and how many there are.
func idleCost(b *testing.B, prefix string, d time.Duration) (cpu, pssMiB float64, procs int) {
	b.Helper()
	var roots []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmd), "\x00"+prefix) {
			roots = append(roots, pid)
		}
	}
	seen := map[int]bool{}
	var walk func(int)
	walk = func(pid int) {
		if seen[pid] {
			return
		}
		seen[pid] = true
		tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
		for _, t := range tasks {
			c, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(c)) {
				if k, err := strconv.Atoi(f); err == nil {
					walk(k)
				}
			}
		}
	}
	for _, r := range roots {
		walk(r)
	}
	ticks := func() int64 {
		var t int64
		for pid := range seen {
			s, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				continue
			}
			f := strings.Fields(string(s[strings.LastIndexByte(string(s), ')')+1:]))
			u, _ := strconv.ParseInt(f[11], 10, 64)
			k, _ := strconv.ParseInt(f[12], 10, 64)
			t += u + k
		}
		return t
	}
	t0, w0 := ticks(), time.Now()
	time.Sleep(d)
	t1, w1 := ticks(), time.Now()
	var pss int64
	for pid := range seen {
		s, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(s), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
				v, _ := strconv.ParseInt(f[1], 10, 64)
				pss += v
			}
		}
	}
	// USER_HZ is 100 on Linux.
	return float64(t1-t0) / 100 / w1.Sub(w0).Seconds(), float64(pss) / 1024, len(seen)
}
