package local

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/provider/local/supervisor"
	"github.com/managoat/managoat/sandbox"
)

// drain reads c's events to the end and returns the stdout bytes seen.
func drain(b testing.TB, c *sandbox.Command) int64 {
	var n int64
	for ev := range c.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			n += int64(len(ev.Data))
		case sandbox.Exit:
			if ev.Code != 0 {
				b.Fatalf("exit %d", ev.Code)
			}
		case sandbox.Error:
			b.Fatalf("error %v", ev.Err)
		}
	}
	return n
}

func benchProviders(b *testing.B) map[string]*Provider {
	return trustedAndJail(b)
}

const throughputBytes = 256 << 20

// BenchmarkSpawnThroughput: spawn output (through the supervisor's
// journal and the Command's events) against two pipes measured in the
// same run: the issue's `head -c N /dev/zero | cat`, read by this process
// (ratio-to-cat), and the stricter head's pipe read by this process
// directly (ratio).
func BenchmarkSpawnThroughput(b *testing.B) {
	size := strconv.Itoa(throughputBytes)
	pipe := func(args ...string) time.Duration {
		start := time.Now()
		cmd := exec.Command(args[0], args[1:]...)
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		n, _ := io.Copy(io.Discard, out)
		cmd.Wait()
		if n != throughputBytes {
			b.Fatalf("pipe read %d", n)
		}
		return time.Since(start)
	}
	// file: the same bytes through a pipe into a file in the state
	// directory, the file system the journal is on (head | cat > file: the
	// journal's path without the follower; cat writes 128 KiB at a time,
	// as the supervisor writes batches, where head > file would write 4 KiB).
	file := func(dir string) time.Duration {
		path := dir + "/throughput-baseline"
		start := time.Now()
		cmd := exec.Command("sh", "-c", `head -c "$1" /dev/zero | cat > "$2"`, "sh", size, path)
		if out, err := cmd.CombinedOutput(); err != nil {
			b.Fatalf("file baseline: %v %s", err, out)
		}
		d := time.Since(start)
		os.Remove(path)
		return d
	}
	for name, p := range benchProviders(b) {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			h, err := p.Create(ctx, "tp-"+name, sandbox.CreateOptions{})
			if err != nil {
				b.Fatal(err)
			}
			var ours, base, cat, disk time.Duration
			bestOurs, bestBase := time.Duration(1<<62), time.Duration(1<<62)
			b.SetBytes(throughputBytes)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				disk += file(p.state)
				cat += pipe("sh", "-c", `head -c "$1" /dev/zero | cat`, "sh", size)
				d := pipe("head", "-c", size, "/dev/zero")
				base += d
				bestBase = min(bestBase, d)
				start := time.Now()
				c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "head", Args: []string{"-c", size, "/dev/zero"}}, sandbox.SpawnOptions{})
				if err != nil {
					b.Fatal(err)
				}
				if n := drain(b, c); n != throughputBytes {
					b.Fatalf("spawn read %d", n)
				}
				ours += time.Since(start)
				bestOurs = min(bestOurs, time.Since(start))
				// Each run starts with the same page cache: the journal
				// goes, as the file baseline's file does.
				os.Remove(supervisor.JournalPath(p.sandboxDir(h.Name), c.SessionID))
			}
			mbps := func(d time.Duration) float64 { return float64(throughputBytes) * float64(b.N) / d.Seconds() / 1e6 }
			b.ReportMetric(mbps(ours), "spawn-MB/s")
			b.ReportMetric(mbps(base), "pipe-MB/s")
			b.ReportMetric(mbps(ours)/mbps(base), "ratio")
			b.ReportMetric(mbps(cat), "cat-MB/s")
			b.ReportMetric(mbps(ours)/mbps(cat), "ratio-to-cat")
			b.ReportMetric(mbps(disk), "file-MB/s")
			b.ReportMetric(mbps(ours)/mbps(disk), "ratio-to-file")
			// The best of each, less exposed to other load on a shared box.
			b.ReportMetric(float64(bestBase)/float64(bestOurs), "best-ratio")
		})
	}
}

// BenchmarkAttachReplay: Attach to a finished session with a 256 MiB
// journal and read it to the end.
func BenchmarkAttachReplay(b *testing.B) {
	p := newTrusted(b)
	ctx := context.Background()
	h, err := p.Create(ctx, "replay", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "head", Args: []string{"-c", strconv.Itoa(throughputBytes), "/dev/zero"}}, sandbox.SpawnOptions{})
	if err != nil {
		b.Fatal(err)
	}
	drain(b, c)
	st, _ := os.Stat(supervisor.JournalPath(p.sandboxDir(h.Name), c.SessionID))
	b.ReportMetric(float64(st.Size())/(1<<20), "journal-MiB")
	if os.Getenv("KEEP_JOURNAL") != "" {
		exec.Command("cp", supervisor.JournalPath(p.sandboxDir(h.Name), c.SessionID), os.Getenv("KEEP_JOURNAL")).Run()
	}
	b.SetBytes(throughputBytes)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		a, err := p.Attach(ctx, h, c.SessionID, sandbox.AttachOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if n := drain(b, a); n != throughputBytes {
			b.Fatalf("replayed %d", n)
		}
	}
}

// rssKiB sums VmRSS of pids.
func rssKiB(pids []int) int64 { return statusKiB(pids, "VmRSS:") }

// pssKiB sums the processes' proportional set sizes: each page shared by
// k processes (the binary's, mapped by every supervisor) counts 1/k.
func pssKiB(pids []int) int64 { return procKiB(pids, "smaps_rollup", "Pss:") }

// statusKiB sums one field of /proc/<pid>/status (RssAnon: private memory;
// VmRSS also counts the binary's shared pages).
func statusKiB(pids []int, field string) int64 { return procKiB(pids, "status", field) }

// procKiB sums the kB field named field of /proc/<pid>/<file>.
func procKiB(pids []int, file, field string) int64 {
	var total int64
	for _, pid := range pids {
		bs, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, file))
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(bs), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				total += n
			}
		}
	}
	return total
}

// Benchmark200Sandboxes: 200 sandboxes created concurrently, each with one
// idle session; reports the wall time and the supervisors' memory.
func Benchmark200Sandboxes(b *testing.B) {
	const n = 200
	for name, p := range benchProviders(b) {
		b.Run(name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				ctx := context.Background()
				start := time.Now()
				var wg sync.WaitGroup
				errs := make(chan error, n)
				sem := make(chan struct{}, 16)
				for j := 0; j < n; j++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						sem <- struct{}{}
						defer func() { <-sem }()
						h, err := p.Create(ctx, fmt.Sprintf("many-%d-%d", i, j), sandbox.CreateOptions{})
						if err != nil {
							errs <- err
							return
						}
						c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo ready; exec cat"}}, sandbox.SpawnOptions{Stdin: true})
						if err != nil {
							errs <- err
							return
						}
						<-c.Events() // ready
						c.Stop()
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				elapsed := time.Since(start)
				names, _ := p.ListAllNames(ctx)
				var pids []int
				for _, nm := range names {
					if pid, err := supervisorPid(ctx, p, sandbox.BuildHandle(Name, nm)); err == nil {
						pids = append(pids, pid)
					}
				}
				if len(pids) != n {
					b.Fatalf("%d supervisors answer, want %d", len(pids), n)
				}
				b.ReportMetric(elapsed.Seconds()*1000, "ms-total")
				b.ReportMetric(elapsed.Seconds()*1000/n, "ms/sandbox")
				b.ReportMetric(float64(rssKiB(pids))/1024, "supervisors-RSS-MiB")
				b.ReportMetric(float64(rssKiB(pids))/1024/n, "RSS-MiB/supervisor")
				b.ReportMetric(float64(statusKiB(pids, "RssAnon:"))/1024/n, "anon-MiB/supervisor")
				b.ReportMetric(float64(pssKiB(pids))/1024/n, "PSS-MiB/supervisor")
				dstart := time.Now()
				destroyAll(p)
				b.ReportMetric(time.Since(dstart).Seconds()*1000/n, "destroy-ms/sandbox")
			}
		})
	}
}

// BenchmarkRunTrue: create, exec /bin/true, destroy: the library's share
// of `managoat run -- true`, against `unshare --mount --pid --net --fork
// true` in the same run.
func BenchmarkRunTrue(b *testing.B) {
	unshare := func() time.Duration {
		start := time.Now()
		if err := exec.Command("unshare", "--mount", "--pid", "--net", "--fork", "true").Run(); err != nil {
			testenv.Require(b, false, "unshare: "+err.Error())
		}
		return time.Since(start)
	}
	ps := benchProviders(b)
	for _, mech := range []string{"trusted", "jail"} {
		if _, ok := ps[mech]; !ok {
			continue
		}
		p, err := New(Config{StateDir: b.TempDir(), MechanismName: mech, LazySupervisor: true})
		if err != nil {
			b.Fatal(err)
		}
		ps[mech+"-lazy"] = p
	}
	for name, p := range ps {
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			var ours, base, create time.Duration
			for i := 0; i < b.N; i++ {
				base += unshare()
				start := time.Now()
				h, err := p.Create(ctx, fmt.Sprintf("run-%d", i), sandbox.CreateOptions{})
				if err != nil {
					b.Fatal(err)
				}
				create += time.Since(start)
				if res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
					b.Fatal(res, err)
				}
				if err := p.Destroy(ctx, h); err != nil {
					b.Fatal(err)
				}
				ours += time.Since(start)
			}
			ms := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(b.N) }
			b.ReportMetric(ms(ours), "run-ms")
			b.ReportMetric(ms(create), "create-ms")
			b.ReportMetric(ms(base), "unshare-ms")
			b.ReportMetric(ms(ours)/ms(base), "ratio")
		})
	}
}
