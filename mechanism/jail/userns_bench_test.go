package jail_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// BenchmarkColdStartMapped: provision + start + first execute of
// /bin/true of a sandbox with a uid range of its own against one without
// (Config.IDMapDir "-", as before ranges existed), interleaved in one
// run; the ratio is of the medians. What a range costs a start: the
// claim (a file in the registry), the init's clone in a new user
// namespace (which os/exec cannot make with vfork: the child waits for
// its maps) and the init's lowering of its capabilities.
func BenchmarkColdStartMapped(b *testing.B) {
	mk := func(idmap string) *jail.Jail {
		j, err := jail.New(jail.Config{StateDir: b.TempDir(), IDMapDir: idmap})
		if err != nil {
			b.Fatal(err)
		}
		return j
	}
	newJail(b) // root, or skip
	mapped, plain := mk(""), mk("-")
	n := 0
	once := func(j *jail.Jail) time.Duration {
		n++
		return coldStart(b, j, fmt.Sprintf("m%d", n), mechanism.Spec{})
	}
	once(mapped) // the probes, once per process
	once(plain)
	var m, p []time.Duration
	for b.Loop() {
		m = append(m, once(mapped))
		p = append(p, once(plain))
	}
	b.ReportMetric(float64(median(m).Microseconds()), "µs/mapped")
	b.ReportMetric(float64(median(p).Microseconds()), "µs/unmapped")
	b.ReportMetric(float64(median(m))/float64(median(p)), "x-unmapped")
}
