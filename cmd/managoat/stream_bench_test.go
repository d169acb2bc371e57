package main

import (
	"io"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// streamBenchBytes is how much each arm of BenchmarkStreamThroughput
// streams: 500 MiB (issue 31's figure), or MANAGOAT_BENCH_STREAM_BYTES.
func streamBenchBytes(b *testing.B) int64 {
	n := int64(500 << 20)
	if s := os.Getenv("MANAGOAT_BENCH_STREAM_BYTES"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			b.Fatalf("MANAGOAT_BENCH_STREAM_BYTES=%q", s)
		}
		n = v
	}
	return n
}

// BenchmarkStreamThroughput streams N bytes (500 MiB unless
// MANAGOAT_BENCH_STREAM_BYTES) of `head -c N /dev/zero` to this process
// through a pipe, read as fast as it can, three ways in each iteration
// (so a shared machine's swings hit them alike): head's own pipe (the
// baseline), `managoat run -- head ...` on the jail (the direct path, no
// supervisor) and `managoat exec BOX -- head ...` (the supervisor's
// journal, then managoat's stdout). pct-pipe-run and pct-pipe-exec are
// their throughputs as percentages of the pipe's (issue 31's target: at
// least 70).
func BenchmarkStreamThroughput(b *testing.B) {
	testenv.RequireRoot(b)
	n := streamBenchBytes(b)
	home := b.TempDir()
	installed := installedCopy(b)
	env := append(os.Environ(), "MANAGOAT_HOME="+home, "MANAGOAT_CONFIG=/nonexistent/managoat-test-config")
	once := func(name string, args ...string) time.Duration {
		c := exec.Command(name, args...)
		c.Env = env
		out, err := c.StdoutPipe()
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		got, _ := io.CopyBuffer(io.Discard, out, make([]byte, 256<<10))
		if err := c.Wait(); err != nil || got != n {
			b.Fatalf("%s %v: %d bytes, want %d: %v", name, args, got, n, err)
		}
		return time.Since(start)
	}
	size := strconv.FormatInt(n, 10)
	cmd := func(args ...string) *exec.Cmd {
		c := exec.Command(installed, args...)
		c.Env = env
		return c
	}
	if out, err := cmd("--mechanism", "jail", "create", "bench-box").CombinedOutput(); err != nil {
		b.Fatalf("create: %v %s", err, out)
	}
	b.Cleanup(func() { _ = cmd("rm", "-f", "bench-box").Run() })
	head, err := exec.LookPath("head")
	if err != nil {
		b.Fatal(err)
	}
	arms := []struct {
		name string
		run  func() time.Duration
	}{
		{"pipe", func() time.Duration { return once(head, "-c", size, "/dev/zero") }},
		{"run", func() time.Duration {
			return once(installed, "--mechanism", "jail", "run", "--", "head", "-c", size, "/dev/zero")
		}},
		{"exec", func() time.Duration {
			return once(installed, "exec", "bench-box", "--", "head", "-c", size, "/dev/zero")
		}},
	}
	for _, a := range arms { // warm up
		a.run()
	}
	total := map[string]time.Duration{}
	b.ResetTimer()
	for b.Loop() {
		for _, a := range arms {
			total[a.name] += a.run()
		}
	}
	b.StopTimer()
	mibs := func(d time.Duration) float64 { return float64(n) * float64(b.N) / d.Seconds() / (1 << 20) }
	for _, a := range arms {
		b.ReportMetric(mibs(total[a.name]), "MiB/s-"+a.name)
	}
	b.ReportMetric(100*float64(total["pipe"])/float64(total["run"]), "pct-pipe-run")
	b.ReportMetric(100*float64(total["pipe"])/float64(total["exec"]), "pct-pipe-exec")
}
