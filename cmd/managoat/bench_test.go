package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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
