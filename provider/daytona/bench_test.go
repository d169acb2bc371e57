package daytona

import (
	"bytes"
	"testing"
	"time"
)

var sink []byte

// BenchmarkPoll measures one journal-mode LogStream poll's local work (the
// path of an older shim's session; spawns read the shim's files) — demultiplexing
// the whole journal and skipping what was delivered — on a 1 MiB journal of
// 4 KiB chunks, as a ratio to merely copying those bytes (the baseline,
// measured in the same run). The network transfer of the whole journal on
// every poll (Daytona serves no ranges) is not included.
func BenchmarkPoll(b *testing.B) {
	var j []byte
	chunk := bytes.Repeat([]byte("output line é€\n"), 4096/18)
	for i := 0; len(j) < 1<<20; i++ {
		m := byte(1 + i%2)
		j = append(j, m, m, m)
		j = append(j, chunk...)
	}
	var c cursor
	c.advance(demux(j[:len(j)-4096], false)) // all but the last chunk delivered
	const baseRounds = 200
	t0 := time.Now()
	for range baseRounds {
		sink = bytes.Clone(j)
	}
	base := float64(time.Since(t0).Nanoseconds()) / baseRounds
	b.ResetTimer()
	for b.Loop() {
		cc := c
		if len(cc.advance(demux(j, false))) == 0 {
			b.Fatal("nothing new")
		}
	}
	per := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	b.ReportMetric(per/base, "x-copy")
	b.ReportMetric(float64(len(j))/per*1e9/(1<<20), "MiB/s")
}
