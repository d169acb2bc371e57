package main

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// BenchmarkRunTrue measures `managoat run -- true` end to end (a process
// start, create, run, destroy) on the embedded default, against
// `unshare --mount --pid --net --fork true` in the same run.
func BenchmarkRunTrue(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root for the jail and unshare")
	}
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		b.Skip("unshare not installed")
	}
	home := b.TempDir()
	timeIt := func(n int, name string, args ...string) time.Duration {
		start := time.Now()
		for range n {
			c := exec.Command(name, args...)
			c.Env = append(os.Environ(), "MANAGOAT_HOME="+home)
			if out, err := c.CombinedOutput(); err != nil {
				b.Fatalf("%s %v: %v %s", name, args, err, out)
			}
		}
		return time.Since(start) / time.Duration(n)
	}
	n := max(b.N, 10)
	base := timeIt(n, unshare, "--mount", "--pid", "--net", "--fork", "true")
	for _, mech := range []string{"jail", "trusted"} {
		b.Run(mech, func(b *testing.B) {
			timeIt(2, binary, "--mechanism", mech, "run", "--", "true") // warm up
			per := timeIt(n, binary, "--mechanism", mech, "run", "--", "true")
			b.ReportMetric(float64(per.Microseconds())/1000, "ms/run")
			b.ReportMetric(float64(base.Microseconds())/1000, "ms/unshare")
			b.ReportMetric(float64(per)/float64(base), "x-unshare")
		})
	}
}
