package local

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// cpuTicks is utime+stime of pid (fields 14 and 15 of /proc/PID/stat),
// in clock ticks; -1 when it cannot be read.
func cpuTicks(pid int) int64 {
	bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return -1
	}
	s := string(bs)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return -1
	}
	u, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return u + st
}

// BenchmarkIdleSandboxes (issue 32's idle cost): N sandboxes created one
// after the other (N from MANAGOAT_BENCH_IDLE_N, default 50), then their
// supervisors left idle for 3 s: the creation time each, the share of a
// core the supervisors take together while idle (utime+stime from
// /proc/PID/stat, USER_HZ 100), and the PSS each (smaps_rollup). Every
// sandbox is destroyed at the end.
//
//	MANAGOAT_BENCH_IDLE_N=1000 go test -run XXX -bench IdleSandboxes -benchtime 1x -timeout 30m ./provider/local/
func BenchmarkIdleSandboxes(b *testing.B) {
	n := 50
	if s := os.Getenv("MANAGOAT_BENCH_IDLE_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			b.Fatalf("MANAGOAT_BENCH_IDLE_N=%q: want a positive count", s)
		}
		n = v
	}
	const window = 3 * time.Second
	const userHZ = 100 // the kernel's USER_HZ, what /proc/PID/stat counts in
	for name, p := range benchProviders(b) {
		b.Run(name, func(b *testing.B) {
			for range b.N {
				ctx := context.Background()
				defer destroyAll(p)
				start := time.Now()
				var pids []int
				for j := 0; j < n; j++ {
					h, err := p.Create(ctx, fmt.Sprintf("idle-%d", j), sandbox.CreateOptions{})
					if err != nil {
						b.Fatalf("sandbox %d: %v", j, err)
					}
					pid, err := supervisorPid(ctx, p, h)
					if err != nil {
						b.Fatalf("sandbox %d's supervisor: %v", j, err)
					}
					pids = append(pids, pid)
				}
				created := time.Since(start)
				// The last ones settle (their directory watch) before the window.
				time.Sleep(300 * time.Millisecond)
				t0 := make([]int64, len(pids))
				for i, pid := range pids {
					t0[i] = cpuTicks(pid)
				}
				w0 := time.Now()
				time.Sleep(window)
				var ticks int64
				for i, pid := range pids {
					t1 := cpuTicks(pid)
					if t1 < 0 || t0[i] < 0 {
						b.Fatalf("supervisor %d is gone", pid)
					}
					ticks += t1 - t0[i]
				}
				share := float64(ticks) / userHZ / time.Since(w0).Seconds()
				b.ReportMetric(float64(n), "sandboxes")
				b.ReportMetric(created.Seconds()*1000/float64(n), "create-ms/sandbox")
				b.ReportMetric(created.Seconds(), "create-s-total")
				b.ReportMetric(share*100, "idle-%core-total")
				b.ReportMetric(float64(pssKiB(pids))/1024/float64(n), "PSS-MiB/supervisor")
			}
		})
	}
}
