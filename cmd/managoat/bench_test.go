package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// BenchmarkRunTrue measures `managoat run -- true` end to end (a process
// start, create, run, destroy) on the jail and on trusted, against
// `unshare --mount --pid --net --fork true`. Each iteration runs all three
// in turn, so that a shared machine's drift hits them alike; the ratios
// are of the medians (of the means too).
func BenchmarkRunTrue(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for the jail and unshare")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		b.Skip("unshare not installed")
	}
	home := b.TempDir()
	// Run as an installed binary (one outside the temporary directory
	// pins the jail's tree template for the next processes).
	installed := installedCopy(b)
	once := func(name string, args ...string) time.Duration {
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
		once(installed, "--mechanism", m, "run", "--", "true")
	}
	runs := map[string][]time.Duration{}
	for b.Loop() {
		runs["unshare"] = append(runs["unshare"], once(unshare, "--mount", "--pid", "--net", "--fork", "true"))
		for _, m := range mechs {
			runs[m] = append(runs[m], once(installed, "--mechanism", m, "run", "--", "true"))
		}
	}
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
		b.ReportMetric(float64(median(runs[m]).Microseconds())/1000, "ms/run-"+m)
		b.ReportMetric(float64(median(runs[m]))/float64(median(base)), "x-unshare-"+m)
		b.ReportMetric(float64(mean(runs[m]))/float64(mean(base)), "x-unshare-mean-"+m)
	}
}

// installedCopy copies the managoat binary out of the temporary directory,
// under the user's cache directory, removed when b ends.
func installedCopy(b *testing.B) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		b.Skip("no cache directory for an installed copy:", err)
	}
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
