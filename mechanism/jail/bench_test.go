package jail_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// runOnce returns the wall time of one run of argv (skipping the
// benchmark when the baseline tool is missing or fails).
func runOnce(b *testing.B, argv ...string) time.Duration {
	b.Helper()
	if _, err := exec.LookPath(argv[0]); err != nil {
		b.Skipf("baseline tool %s missing: %v", argv[0], err)
	}
	began := time.Now()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		b.Skipf("baseline %v failed: %v %s", argv, err, out)
	}
	return time.Since(began)
}

// coldStart provisions sandbox id of j with spec, starts it and runs
// /bin/true in it, and returns how long that took; the sandbox is
// destroyed after, untimed. The cold-start benchmarks time their variants
// with it, interleaved.
func coldStart(b *testing.B, j *jail.Jail, id string, spec mechanism.Spec) time.Duration {
	b.Helper()
	return coldStartPhases(b, j, id, spec, nil)
}

// phases are a cold start's steps, each run's: Provision (state, cgroup,
// the tree and its mounts), Start (namespaces, pivot_root, the init),
// Execute (/bin/true) and Destroy (teardown). steps are Start's own
// (jail.SetPhaseHook), each the time from Start's call to the step's
// end, in the order first seen.
type phases struct {
	provision, start, execute, destroy []time.Duration
	mu                                 sync.Mutex
	began                              time.Time
	order                              []string
	steps                              map[string][]time.Duration
}

// hook records a step of the start that began at ph.began.
func (ph *phases) hook(step string) {
	now := time.Now()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	if ph.began.IsZero() {
		return // not a timed start
	}
	if ph.steps == nil {
		ph.steps = map[string][]time.Duration{}
	}
	if _, ok := ph.steps[step]; !ok {
		ph.order = append(ph.order, step)
	}
	ph.steps[step] = append(ph.steps[step], now.Sub(ph.began))
}

func (ph *phases) mark(t time.Time) {
	ph.mu.Lock()
	ph.began = t
	ph.mu.Unlock()
}

// coldStartPhases is coldStart, recording each step's time in ph (when
// not nil); Destroy is timed too, outside the returned duration.
func coldStartPhases(b *testing.B, j *jail.Jail, id string, spec mechanism.Spec, ph *phases) time.Duration {
	b.Helper()
	ctx := context.Background()
	t0 := time.Now()
	if err := j.Provision(ctx, id, spec); err != nil {
		b.Fatal(err)
	}
	t1 := time.Now()
	if ph != nil {
		ph.mark(t1)
	}
	if err := j.Start(ctx, id); err != nil {
		b.Fatal(err)
	}
	t2 := time.Now()
	if ph != nil {
		ph.mark(time.Time{})
	}
	if _, err := j.Execute(ctx, id, []string{"/bin/true"}, mechanism.ExecOptions{}); err != nil {
		b.Fatal(err)
	}
	t3 := time.Now()
	d := t3.Sub(t0)
	b.StopTimer()
	defer b.StartTimer()
	if err := j.Destroy(ctx, id); err != nil {
		b.Fatal(err)
	}
	if ph != nil {
		ph.provision = append(ph.provision, t1.Sub(t0))
		ph.start = append(ph.start, t2.Sub(t1))
		ph.execute = append(ph.execute, t3.Sub(t2))
		ph.destroy = append(ph.destroy, time.Since(t3))
	}
	return d
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkColdStart: provision + start + first execute of /bin/true,
// against `unshare --mount --pid --net --fork true` and
// `bwrap --unshare-all --ro-bind / / true`. Each iteration runs one cold
// start and one of each baseline, interleaved, so that a shared machine's
// drift hits all three alike; the ratios are of the medians (the means are
// reported too). One sandbox is made and destroyed first, untimed: the
// once-per-process host probe of the capability gate (real namespace,
// cgroup, Landlock and seccomp operations, then cached) and the seccomp
// program's assembly are not a sandbox's cost.
func BenchmarkColdStart(b *testing.B) {
	j := newJail(b)
	ctx := context.Background()
	if err := j.Provision(ctx, "warm", mechanism.Spec{}); err != nil {
		b.Fatal(err)
	}
	if err := j.Start(ctx, "warm"); err != nil {
		b.Fatal(err)
	}
	if err := j.Destroy(ctx, "warm"); err != nil {
		b.Fatal(err)
	}
	_, haveBwrap := exec.LookPath("bwrap")
	// With the standalone init the default, the cgo-linked one is timed
	// too, interleaved: the standalone program's gain, measured.
	linked := slices.Contains(jail.InitModes(), "standalone") && slices.Contains(jail.InitModes(), "c") && os.Getenv(jail.InitEnv) == ""
	var cold, coldLinked, unshare, bwrap []time.Duration
	var ph phases
	jail.SetPhaseHook(b, ph.hook)
	n := 0
	once := func() time.Duration {
		n++
		return coldStart(b, j, fmt.Sprintf("b%d", n), mechanism.Spec{})
	}
	for b.Loop() {
		n++
		cold = append(cold, coldStartPhases(b, j, fmt.Sprintf("b%d", n), mechanism.Spec{}, &ph))
		if linked {
			os.Setenv(jail.InitEnv, "c")
			coldLinked = append(coldLinked, once())
			os.Unsetenv(jail.InitEnv)
		}
		unshare = append(unshare, runOnce(b, "unshare", "--mount", "--pid", "--net", "--fork", "true"))
		if haveBwrap == nil {
			bwrap = append(bwrap, runOnce(b, "bwrap", "--unshare-all", "--ro-bind", "/", "/", "true"))
		}
	}
	mean := func(d []time.Duration) time.Duration {
		var t time.Duration
		for _, x := range d {
			t += x
		}
		return t / time.Duration(len(d))
	}
	b.ReportMetric(float64(median(cold).Microseconds()), "µs/coldstart")
	// Where the time goes (medians of each step; destroy is not in
	// coldstart).
	b.ReportMetric(float64(median(ph.provision).Microseconds()), "µs/provision")
	b.ReportMetric(float64(median(ph.start).Microseconds()), "µs/start")
	b.ReportMetric(float64(median(ph.execute).Microseconds()), "µs/execute")
	b.ReportMetric(float64(median(ph.destroy).Microseconds()), "µs/destroy")
	// Start's steps, each the median time from Start's call to its end
	// (some overlap: the tree's thread runs beside the caller).
	for _, step := range ph.order {
		if d := ph.steps[step]; len(d) == len(ph.start) {
			b.ReportMetric(float64(median(d).Microseconds()), "µs/start-"+step)
		}
	}
	b.ReportMetric(float64(median(unshare).Microseconds()), "µs/unshare")
	b.ReportMetric(float64(median(cold))/float64(median(unshare)), "x-unshare")
	b.ReportMetric(float64(mean(cold))/float64(mean(unshare)), "x-unshare-mean")
	if len(coldLinked) > 0 {
		b.ReportMetric(float64(median(coldLinked).Microseconds()), "µs/coldstart-linked-init")
		b.ReportMetric(float64(median(cold))/float64(median(coldLinked)), "x-linked-init")
	}
	if len(bwrap) > 0 {
		b.ReportMetric(float64(median(bwrap).Microseconds()), "µs/bwrap")
		b.ReportMetric(float64(median(cold))/float64(median(bwrap)), "x-bwrap")
		b.ReportMetric(float64(mean(cold))/float64(mean(bwrap)), "x-bwrap-mean")
	} else {
		b.Log("bwrap missing: its baseline is skipped")
	}
}

// BenchmarkExecute: /bin/true in a running sandbox against a plain
// fork+exec of /bin/true, interleaved; the ratio is of the medians.
func BenchmarkExecute(b *testing.B) {
	j := newJail(b)
	started(b, j, "e", mechanism.Spec{})
	ctx := context.Background()
	var ours, plain []time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := j.Execute(ctx, "e", []string{"/bin/true"}, mechanism.ExecOptions{}); err != nil {
			b.Fatal(err)
		}
		ours = append(ours, time.Since(t0))
		plain = append(plain, runOnce(b, "/bin/true"))
	}
	b.ReportMetric(float64(median(ours).Microseconds()), "µs/execute")
	b.ReportMetric(float64(median(plain).Microseconds()), "µs/forkexec")
	b.ReportMetric(float64(median(ours))/float64(median(plain)), "x-forkexec")
}

// BenchmarkIdleRSS: the resident memory of an idle sandbox's processes
// outside the workload (its init; the jail has no other supervisor).
func BenchmarkIdleRSS(b *testing.B) {
	dir := b.TempDir()
	j, err := jail.New(jail.Config{StateDir: dir})
	if err != nil {
		b.Fatal(err)
	}
	started(b, j, "idle", mechanism.Spec{})
	if _, err := j.Execute(context.Background(), "idle", []string{"/bin/true"}, mechanism.ExecOptions{}); err != nil {
		b.Fatal(err)
	}
	var kb int
	for b.Loop() {
		kb = idleRSSKiB(b, filepath.Join(dir, "idle"))
	}
	b.ReportMetric(float64(kb)/1024, "MiB-RSS")
	if kb > 8<<10 {
		b.Errorf("idle init RSS %d KiB exceeds 8 MiB", kb)
	}
}

func idleRSSKiB(tb testing.TB, dir string) int {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var st struct {
		InitPid int `json:"initPid"`
	}
	if err := json.Unmarshal(raw, &st); err != nil || st.InitPid == 0 {
		tb.Fatalf("no init pid: %v", err)
	}
	s, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", st.InitPid))
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(string(s), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	tb.Fatal("no VmRSS")
	return 0
}
