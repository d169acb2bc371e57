// Package mechanismtest is the breach conformance of mechanism.Mechanism:
// a limit or an isolation guarantee counts only when a breach was attempted
// and seen stopped. Use it like testing/fstest.TestFS:
//
//	func TestConformance(t *testing.T) {
//		mechanismtest.Run(t, func(t *testing.T) mechanism.Mechanism {
//			j, err := jail.New(jail.Config{StateDir: t.TempDir()})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return j
//		}, mechanismtest.Strict(testenv.InCI()))
//	}
//
// Every check is a named subtest with one of three outcomes: pass, fail,
// or NOT DEMONSTRATED. A check is not demonstrated when the mechanism
// refuses the limit at Provision (it does not enforce it), or does not
// claim the guarantee in GuaranteedCapabilities (the breach is then not
// attempted: a mechanism that claims nothing cannot break a claim), or when
// the host lacks what the check needs. Not demonstrated is reported with
// t.Skip and the reason, and counted in a summary logged at the end; it is
// never a pass. With Strict(true) it is a failure instead. A check of an
// optional interface the mechanism does not implement (freeze, for
// mechanism.Freezer) is NOT APPLICABLE: the mechanism promises nothing
// there, and strict mode does not count it.
//
// The checks need root for planting a setuid binary; commands inside the
// sandbox need /bin/sh, coreutils, bash and python3 (for the memory check).
// Every sandbox a check makes is destroyed; the factory is called once per
// check, so each gets a fresh mechanism (give it a fresh state directory).
// Every workload a check starts inside a sandbox ends on its own within 50
// seconds, and forks at most 200 processes (fewer under the pids cap), so
// one that a killed test leaves behind stops by itself within a minute.
package mechanismtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// Option tunes Run.
type Option func(*config)

type config struct {
	strict   bool
	internet *egresstest.Internet // Internet: the egress checks' stand-in (network.go)
}

// Strict makes "not demonstrated" a failure (use it under CI for a
// mechanism that must demonstrate everything).
func Strict(on bool) Option { return func(c *config) { c.strict = on } }

// Outcome of one check.
type Outcome string

// The outcomes. NotApplicable is a check of an optional interface the
// mechanism does not implement: it promises nothing there, and strict
// mode does not count it against it.
const (
	Pass            Outcome = "pass"
	Fail            Outcome = "fail"
	NotDemonstrated Outcome = "not demonstrated"
	NotApplicable   Outcome = "not applicable"
)

type kit struct {
	cfg     config
	factory func(t *testing.T) mechanism.Mechanism
	mu      sync.Mutex
	results map[string]Outcome
	seq     int
}

// notDemonstrated ends a check with the third outcome.
func (k *kit) notDemonstrated(t *testing.T, format string, args ...any) {
	t.Helper()
	msg := "NOT DEMONSTRATED: " + fmt.Sprintf(format, args...)
	k.mu.Lock()
	k.results[t.Name()] = NotDemonstrated
	k.mu.Unlock()
	if k.cfg.strict {
		t.Fatal(msg + " (strict mode: this is a failure)")
	}
	t.Skip(msg)
}

// notApplicable ends a check of an optional interface m lacks.
func (k *kit) notApplicable(t *testing.T, format string, args ...any) {
	t.Helper()
	k.mu.Lock()
	k.results[t.Name()] = NotApplicable
	k.mu.Unlock()
	t.Skip("NOT APPLICABLE: " + fmt.Sprintf(format, args...))
}

// Run runs every check against mechanisms made by factory, and returns
// each check's outcome by its name ("memory", "user_namespace", ...), so
// a caller can tell a check that does not apply (NotApplicable) from one
// its mechanism could not demonstrate.
func Run(t *testing.T, factory func(t *testing.T) mechanism.Mechanism, opts ...Option) map[string]Outcome {
	k := &kit{factory: factory, results: map[string]Outcome{}}
	for _, o := range opts {
		o(&k.cfg)
	}
	checks := []struct {
		name string
		f    func(*testing.T, *kit, mechanism.Mechanism)
	}{
		{"lifecycle", checkLifecycle},
		{"exit_status_and_streams", checkStreams},
		{"could_not_run", checkCouldNotRun},
		{"not_running_means_never_started", checkNotRunning},
		{"truncation", checkTruncation},
		{"on_output_64KiB_line", checkLongLine},
		{"memory", checkMemory},
		{"pids", checkPids},
		{"cpu", checkCPU},
		{"usage", checkUsage},
		{"wall_clock", checkWallClock},
		{"network_deny_all", checkNetwork},
		{"egress", checkEgress},
		{"filesystem", checkFilesystem},
		{"host_mounts", checkHostMounts}, // mounts.go
		{"processes", checkProcesses},
		{"privileges", checkPrivileges},
		{"user_namespace", checkUserns}, // userns.go
		{"freeze", checkFreeze},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				k.mu.Lock()
				defer k.mu.Unlock()
				if _, ok := k.results[t.Name()]; !ok {
					if t.Failed() || t.Skipped() {
						k.results[t.Name()] = Fail
					} else {
						k.results[t.Name()] = Pass
					}
				}
			}()
			m := factory(t)
			c.f(t, k, m)
		})
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	count := map[Outcome]int{}
	var lines []string
	for name, o := range k.results {
		count[o]++
		lines = append(lines, fmt.Sprintf("  %-16s %s", o, name))
	}
	slices.Sort(lines)
	t.Logf("mechanismtest summary: passed=%d failed=%d not_demonstrated=%d not_applicable=%d\n%s",
		count[Pass], count[Fail], count[NotDemonstrated], count[NotApplicable], strings.Join(lines, "\n"))
	out := make(map[string]Outcome, len(k.results))
	for name, o := range k.results {
		out[path.Base(name)] = o
	}
	return out
}

func (k *kit) id(prefix string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.seq++
	return fmt.Sprintf("mt-%s-%d-%d", prefix, os.Getpid(), k.seq)
}

// sandbox provisions and starts a sandbox, destroyed at cleanup. A
// capability refusal is the third outcome.
func (k *kit) sandbox(t *testing.T, m mechanism.Mechanism, prefix string, spec mechanism.Spec) string {
	t.Helper()
	id := k.id(prefix)
	ctx := context.Background()
	err := m.Provision(ctx, id, spec)
	if errors.Is(err, mechanism.ErrCapabilityUnavailable) {
		k.notDemonstrated(t, "%s refused the spec: %v", m.Name(), err)
	}
	if err != nil {
		t.Fatalf("provision: %v", err)
	}
	t.Cleanup(func() {
		if err := m.Destroy(context.Background(), id); err != nil {
			t.Errorf("destroy %s: %v", id, err)
		}
	})
	if err := m.Start(ctx, id); err != nil {
		if errors.Is(err, mechanism.ErrCapabilityUnavailable) {
			k.notDemonstrated(t, "%s refused to start: %v", m.Name(), err)
		}
		t.Fatalf("start: %v", err)
	}
	return id
}

// claims reports the third outcome unless m guarantees c.
func (k *kit) claims(t *testing.T, m mechanism.Mechanism, c mechanism.Capability) {
	t.Helper()
	if !slices.Contains(mechanism.Guaranteed(m), c) {
		k.notDemonstrated(t, "%s does not claim %s, so the breach is not attempted", m.Name(), c)
	}
}

func sh(ctx context.Context, m mechanism.Mechanism, id, script string, o mechanism.ExecOptions) (mechanism.Completion, error) {
	return m.Execute(ctx, id, []string{"/bin/sh", "-c", script}, o)
}

func mustSh(t *testing.T, m mechanism.Mechanism, id, script string) mechanism.Completion {
	t.Helper()
	c, err := sh(context.Background(), m, id, script, mechanism.ExecOptions{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("%q: %v", script, err)
	}
	return c
}

func checkLifecycle(t *testing.T, k *kit, m mechanism.Mechanism) {
	ctx := context.Background()
	never := k.id("never")
	if s, err := m.Status(ctx, never); err != nil || s != mechanism.StatusAbsent {
		t.Fatalf("status of a never-provisioned sandbox = %s, %v; want absent", s, err)
	}
	id := k.id("life")
	if err := m.Provision(ctx, id, mechanism.Spec{}); err != nil {
		if errors.Is(err, mechanism.ErrCapabilityUnavailable) {
			k.notDemonstrated(t, "refused: %v", err)
		}
		t.Fatal(err)
	}
	defer m.Destroy(ctx, id)
	if err := m.Provision(ctx, id, mechanism.Spec{}); err != nil {
		t.Errorf("second provision of the same spec = %v, want adoption", err)
	}
	seen := map[mechanism.Status]bool{}
	s, _ := m.Status(ctx, id)
	seen[s] = true
	if s != mechanism.StatusProvisioned && s != mechanism.StatusRunning {
		t.Errorf("after provision: %s", s)
	}
	if err := m.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if s, _ = m.Status(ctx, id); s != mechanism.StatusRunning {
		t.Errorf("after start: %s", s)
	}
	seen[s] = true
	if l, err := m.ListRunning(ctx); err != nil || !slices.Contains(l, id) {
		t.Errorf("ListRunning = %v, %v; want it to contain %s", l, err, id)
	}
	if _, err := m.Usage(ctx, id); err != nil {
		t.Errorf("usage: %v", err)
	}
	if _, err := m.Usage(ctx, never); !errors.Is(err, mechanism.ErrNotFound) {
		t.Errorf("usage of a never-provisioned sandbox = %v, want ErrNotFound", err)
	}
	if err := m.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	if s, _ = m.Status(ctx, id); s != mechanism.StatusStopped {
		t.Errorf("after stop: %s", s)
	}
	seen[s] = true
	if l, _ := m.ListRunning(ctx); slices.Contains(l, id) {
		t.Errorf("ListRunning after stop still has %s", id)
	}
	if err := m.Start(ctx, id); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if err := m.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := m.Destroy(ctx, id); err != nil {
		t.Errorf("second destroy: %v", err)
	}
	if s, _ = m.Status(ctx, id); s != mechanism.StatusAbsent {
		t.Errorf("after destroy: %s, want absent", s)
	}
	seen[s] = true
	if l, _ := m.ListRunning(ctx); slices.Contains(l, id) {
		t.Errorf("ListRunning after destroy still has %s", id)
	}
	if len(seen) < 3 {
		t.Errorf("fewer than 3 distinct states over the lifecycle: %v", seen)
	}
	if err := m.Provision(ctx, "../escape", mechanism.Spec{}); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("provision of ../escape = %v, want ErrInvalid", err)
	}
}

func checkStreams(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "streams", mechanism.Spec{})
	c := mustSh(t, m, id, "printf OUT-MARKER; printf ERR-MARKER >&2; exit 42")
	if c.ExitStatus != 42 || string(c.Stdout) != "OUT-MARKER" || string(c.Stderr) != "ERR-MARKER" || c.Truncated {
		t.Fatalf("completion = %+v", c)
	}
	if _, err := m.HostPath(id, "/etc/passwd"); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("HostPath(/etc/passwd) = %v, want ErrInvalid", err)
	}
	if _, err := m.HostPath(id, "../../x"); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("HostPath(../../x) = %v, want ErrInvalid", err)
	}
}

func checkCouldNotRun(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "cnr", mechanism.Spec{})
	ctx := context.Background()
	c, err := m.Execute(ctx, id, []string{"definitely-not-a-binary-xyz"}, mechanism.ExecOptions{})
	if !errors.Is(err, mechanism.ErrCouldNotRun) {
		t.Errorf("missing binary: completion %+v, err %v; want CouldNotRun", c, err)
	}
	if _, err := m.Execute(ctx, id, []string{"/bin/sh", "-c", "exit 0"}, mechanism.ExecOptions{}); err != nil {
		t.Fatalf("exit 0 while alive: %v", err)
	}
	if err := m.Destroy(ctx, id); err != nil {
		t.Fatal(err)
	}
	c, err = m.Execute(ctx, id, []string{"/bin/sh", "-c", "exit 0"}, mechanism.ExecOptions{})
	if !errors.Is(err, mechanism.ErrCouldNotRun) {
		t.Errorf("destroyed sandbox: completion %+v, err %v; want CouldNotRun", c, err)
	}
	if errors.Is(err, mechanism.ErrLimitExceeded) {
		t.Errorf("destroyed sandbox reported a limit: %v", err)
	}
}

// checkNotRunning: Execute in a stopped sandbox is CouldNotRun and
// ErrNotRunning (the command never started, a caller may start the sandbox
// and try again); a command the sandbox stops under, after it started, is
// never reported so (a retry would run it twice): it ends with a
// completion, or an error that is not ErrNotRunning (ErrInterrupted, for
// the mechanisms of this module).
func checkNotRunning(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "nr", mechanism.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := m.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	c, err := sh(ctx, m, id, "echo ran >> $HOME/marks", mechanism.ExecOptions{})
	if !errors.Is(err, mechanism.ErrCouldNotRun) || !errors.Is(err, mechanism.ErrNotRunning) || errors.Is(err, mechanism.ErrInterrupted) {
		t.Errorf("stopped sandbox: completion %+v, err %v; want CouldNotRun and NotRunning", c, err)
	}
	if err := m.Start(ctx, id); err != nil {
		t.Fatal(err)
	}
	if c := mustSh(t, m, id, "cat $HOME/marks 2>/dev/null; true"); len(c.Stdout) != 0 {
		t.Errorf("the command refused in a stopped sandbox ran: marks %q", c.Stdout)
	}
	type result struct {
		c   mechanism.Completion
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := sh(ctx, m, id, "echo ran >> $HOME/marks; sleep 50", mechanism.ExecOptions{})
		done <- result{c, err}
	}()
	for {
		c, err := sh(ctx, m, id, "cat $HOME/marks 2>/dev/null; true", mechanism.ExecOptions{})
		if err != nil {
			t.Fatalf("looking for the mark: %v", err)
		}
		if len(c.Stdout) > 0 {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("the command ended before its mark: %+v, %v", r.c, r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := m.Stop(ctx, id); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if errors.Is(r.err, mechanism.ErrNotRunning) {
		t.Errorf("a command the sandbox stopped under: %v; it started, so not NotRunning", r.err)
	}
	if r.err == nil && r.c.ExitStatus == 0 && r.c.Signal == 0 {
		t.Errorf("a command the sandbox stopped under reported success: %+v", r.c)
	}
}

func checkTruncation(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "trunc", mechanism.Spec{})
	c, err := sh(context.Background(), m, id, "head -c 10240 /dev/zero; head -c 10 /dev/zero >&2", mechanism.ExecOptions{LimitBytes: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Truncated || len(c.Stdout) != 1024 || len(c.Stderr) != 10 || c.ExitStatus != 0 {
		t.Errorf("limit 1024: truncated=%v stdout=%d stderr=%d exit=%d", c.Truncated, len(c.Stdout), len(c.Stderr), c.ExitStatus)
	}
	c, err = sh(context.Background(), m, id, "head -c 3000000 /dev/zero", mechanism.ExecOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !c.Truncated || len(c.Stdout) != mechanism.DefaultLimitBytes || c.ExitStatus != 0 {
		t.Errorf("default limit: truncated=%v stdout=%d exit=%d", c.Truncated, len(c.Stdout), c.ExitStatus)
	}
	c = mustSh(t, m, id, "printf %s 1234")
	if c.Truncated {
		t.Errorf("4 bytes reported truncated")
	}
}

func checkLongLine(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "line", mechanism.Spec{})
	var got bytes.Buffer
	var chunks int
	c, err := sh(context.Background(), m, id, "head -c 65536 /dev/zero | tr '\\0' x; echo", mechanism.ExecOptions{
		OnOutput: func(s mechanism.Stream, b []byte) {
			if s == mechanism.Stdout {
				got.Write(b)
				chunks++
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Repeat("x", 65536) + "\n"
	if got.String() != want {
		t.Fatalf("OnOutput reassembled %d bytes (%d chunks), want the 65537-byte line unbroken", got.Len(), chunks)
	}
	if string(c.Stdout) != want {
		t.Fatalf("captured stdout differs from the line")
	}
	t.Logf("64 KiB line arrived in %d chunk(s), byte-identical", chunks)
}

// classifyStop requires err to be the LimitExceeded of limit and the output
// to lack the breach marker.
func classifyStop(t *testing.T, c mechanism.Completion, err error, limit mechanism.Limit, marker string) {
	t.Helper()
	if bytes.Contains(c.Stdout, []byte(marker)) || bytes.Contains(c.Stderr, []byte(marker)) {
		t.Fatalf("BREACHED: %s printed (completion %+v, err %v)", marker, c.ExitStatus, err)
	}
	var le *mechanism.LimitExceededError
	if !errors.As(err, &le) {
		t.Fatalf("err = %v (exit %d, stderr %q), want LimitExceeded %s", err, c.ExitStatus, c.Stderr, limit)
	}
	if le.Limit != limit {
		t.Fatalf("LimitExceeded %s, want %s", le.Limit, limit)
	}
	t.Logf("stopped: %v", le)
}

func checkMemory(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "mem", mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 64 << 20}})
	if _, err := m.Execute(context.Background(), id, []string{"python3", "-c", "pass"}, mechanism.ExecOptions{}); err != nil {
		k.notDemonstrated(t, "python3 cannot run in the sandbox: %v", err)
	}
	script := "b = bytearray(192 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('ALLOCATED-PAST-CAP')\n"
	c, err := m.Execute(context.Background(), id, []string{"python3", "-c", script}, mechanism.ExecOptions{Timeout: 60 * time.Second})
	classifyStop(t, c, err, mechanism.LimitMemory, "ALLOCATED-PAST-CAP")
	if c.Signal != syscall.SIGKILL && c.ExitStatus != 137 {
		t.Errorf("the allocating process was not seen killed: exit %d signal %v", c.ExitStatus, c.Signal)
	}
	// The sandbox survives its workload's OOM kill.
	mustSh(t, m, id, "true")
}

func checkPids(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "pids", mechanism.Spec{Limits: mechanism.Limits{Pids: 64}})
	// The sleeps hold no descriptor of the command's: it ends when its
	// loop does, not 30 s later when they do.
	script := `i=0; while [ $i -lt 200 ]; do sleep 30 </dev/null >/dev/null 2>&1 & i=$((i+1)); done; echo FORKED-PAST-CAP`
	c, err := sh(context.Background(), m, id, script, mechanism.ExecOptions{Timeout: 60 * time.Second})
	classifyStop(t, c, err, mechanism.LimitPids, "FORKED-PAST-CAP")
	// The bomb's sleeps still hold every task; destroying the sandbox
	// (at cleanup) must end them all.
}

// work is fixed work (not fixed duration) for the cpu check.
const work = `i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done; echo SPUN`

func checkCPU(t *testing.T, k *kit, m mechanism.Mechanism) {
	capped := k.sandbox(t, m, "cpu", mechanism.Spec{Limits: mechanism.Limits{CPUMillis: 100}})
	free := k.sandbox(t, m, "cpufree", mechanism.Spec{})
	// The uncapped time is the best of three runs, each the smaller of its
	// wall time and the CPU time it consumed (Usage), so a busy host that
	// slows the baseline cannot hide a missing cap.
	var base time.Duration
	for range 3 {
		u0, _ := m.Usage(context.Background(), free)
		c := mustSh(t, m, free, work)
		u1, _ := m.Usage(context.Background(), free)
		d := c.Duration
		if cpu := u1.CPUTime - u0.CPUTime; cpu > 0 && cpu < d {
			d = cpu
		}
		if base == 0 || d < base {
			base = d
		}
	}
	c, err := sh(context.Background(), m, capped, work, mechanism.ExecOptions{Timeout: 60 * time.Second})
	if err != nil {
		var le *mechanism.LimitExceededError
		if errors.As(err, &le) {
			t.Logf("stopped outright: %v", err)
			return
		}
		t.Fatal(err)
	}
	ratio := float64(c.Duration) / float64(base)
	t.Logf("fixed work: uncapped %v, under 100 millicores %v (%.1fx)", base, c.Duration, ratio)
	if ratio < 5 {
		t.Fatalf("BREACHED: fixed work under a 100-millicore cap took only %.1fx its uncapped time (want >= 5x)", ratio)
	}
}

// checkUsage: Usage reports current consumption that moves with the
// workload: DiskBytes grows by a file written under the home; where the
// mechanism measures by cgroup (it claims memory_cap and cpu_cap), a
// process that holds 64 MiB and spins raises MemoryBytes by most of that
// and CPUMillicores to a busy core's share, and both fall back when it is
// killed. All-zero usage of a busy sandbox fails.
func checkUsage(t *testing.T, k *kit, m mechanism.Mechanism) {
	ctx := context.Background()
	id := k.sandbox(t, m, "usage", mechanism.Spec{})
	u0, err := m.Usage(ctx, id)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	mustSh(t, m, id, `head -c 8388608 /dev/urandom > "$HOME/usage-blob" && sync`)
	u1, err := m.Usage(ctx, id)
	if err != nil {
		t.Fatalf("usage: %v", err)
	}
	if grew := u1.DiskBytes - u0.DiskBytes; grew < 7<<20 {
		t.Errorf("DiskBytes %d -> %d after 8 MiB written under the home: grew %d, want >= 7 MiB", u0.DiskBytes, u1.DiskBytes, grew)
	}
	g := mechanism.Guaranteed(m)
	if !slices.Contains(g, mechanism.MemoryCap) || !slices.Contains(g, mechanism.CPUCap) {
		t.Logf("%s claims no cgroup memory and cpu caps: CPU and memory figures not checked", m.Name())
		return
	}
	if _, err := m.Execute(ctx, id, []string{"python3", "-c", "pass"}, mechanism.ExecOptions{}); err != nil {
		k.notDemonstrated(t, "python3 cannot run in the sandbox: %v", err)
	}
	idle := u1
	mustSh(t, m, id, `setsid python3 -c 'b = bytearray(64 << 20)
for i in range(0, len(b), 4096): b[i] = 1
while True: pass' >/dev/null 2>&1 </dev/null & echo $! > "$HOME/usage.pid"`)
	t.Cleanup(func() {
		_, _ = sh(ctx, m, id, `kill $(cat "$HOME/usage.pid")`, mechanism.ExecOptions{Timeout: 10 * time.Second})
	})
	var busy mechanism.Usage
	for deadline := time.Now().Add(30 * time.Second); ; {
		if busy, err = m.Usage(ctx, id); err != nil {
			t.Fatalf("usage: %v", err)
		}
		if busy.MemoryBytes-idle.MemoryBytes >= 48<<20 && busy.CPUMillicores >= 100 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with a process holding 64 MiB and spinning: memory %d -> %d, cpu %d -> %d millicores; want +48 MiB and >= 100 millicores",
				idle.MemoryBytes, busy.MemoryBytes, idle.CPUMillicores, busy.CPUMillicores)
		}
	}
	if busy.CPUTime <= idle.CPUTime {
		t.Errorf("CPUTime did not grow: %v -> %v", idle.CPUTime, busy.CPUTime)
	}
	t.Logf("idle: %d millicores, %d MiB; busy: %d millicores, %d MiB", idle.CPUMillicores, idle.MemoryBytes>>20, busy.CPUMillicores, busy.MemoryBytes>>20)
	mustSh(t, m, id, `kill $(cat "$HOME/usage.pid")`)
	for deadline := time.Now().Add(30 * time.Second); ; {
		after, err := m.Usage(ctx, id)
		if err != nil {
			t.Fatalf("usage: %v", err)
		}
		if after.CPUMillicores < busy.CPUMillicores/3 && after.MemoryBytes < busy.MemoryBytes-(32<<20) {
			t.Logf("after the kill: %d millicores, %d MiB", after.CPUMillicores, after.MemoryBytes>>20)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the kill: %d millicores, %d MiB; want the busy %d millicores and %d MiB to fall",
				after.CPUMillicores, after.MemoryBytes>>20, busy.CPUMillicores, busy.MemoryBytes>>20)
		}
	}
}

func checkWallClock(t *testing.T, k *kit, m mechanism.Mechanism) {
	id := k.sandbox(t, m, "wall", mechanism.Spec{Limits: mechanism.Limits{WallClock: 2 * time.Second}})
	began := time.Now()
	c, err := sh(context.Background(), m, id, "sleep 50; echo SLEPT-PAST-BUDGET", mechanism.ExecOptions{})
	took := time.Since(began)
	classifyStop(t, c, err, mechanism.LimitWallClock, "SLEPT-PAST-BUDGET")
	if took > 4*time.Second {
		t.Fatalf("wall clock stop took %v, want within 4s", took)
	}
}

// outsideAddr returns a non-loopback address of this host, or "".
func outsideAddr() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
			return ipn.IP.String()
		}
	}
	return ""
}

func checkNetwork(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.NetworkRestriction)
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		k.notDemonstrated(t, "cannot listen on the host: %v", err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	targets := []string{"127.0.0.1"}
	if a := outsideAddr(); a != "" {
		targets = append(targets, a)
	} else {
		t.Log("no non-loopback address on this host; only the loopback leg runs")
	}
	// Controls: the host itself reaches each target.
	for _, h := range targets {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(h, fmt.Sprint(port)), 2*time.Second)
		if err != nil {
			k.notDemonstrated(t, "host control: cannot reach %s:%d itself: %v", h, port, err)
		}
		c.Close()
	}
	// The host is out of reach with the mechanism's default network
	// (egress, where it gives one) and with none.
	for _, spec := range []mechanism.Spec{{}, {Network: mechanism.NetworkNone}} {
		id := k.sandbox(t, m, "net", spec)
		for _, h := range targets {
			script := fmt.Sprintf(`timeout 3 bash -c 'exec 3<>/dev/tcp/%s/%d' && echo CONNECTED || echo REFUSED`, h, port)
			c := mustSh(t, m, id, script)
			if bytes.Contains(c.Stdout, []byte("CONNECTED")) {
				t.Errorf("BREACHED: connected to %s:%d from inside a sandbox (network %q)", h, port, spec.Network)
			} else if !bytes.Contains(c.Stdout, []byte("REFUSED")) {
				t.Errorf("probe of %s inconclusive: %q %q", h, c.Stdout, c.Stderr)
			} else {
				t.Logf("%s:%d refused (network %q): %s", h, port, spec.Network, bytes.TrimSpace(c.Stderr))
			}
		}
	}
}

func checkFilesystem(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.FilesystemConfinement)
	secretDir := t.TempDir()
	os.Chmod(secretDir, 0o755)
	secret := secretDir + "/secret"
	token := fmt.Sprintf("HOST-SECRET-%d", time.Now().UnixNano())
	if err := os.WriteFile(secret, []byte(token), 0o644); err != nil {
		t.Fatal(err)
	}
	a := k.sandbox(t, m, "fsa", mechanism.Spec{})
	b := k.sandbox(t, m, "fsb", mechanism.Spec{})
	c := mustSh(t, m, a, "cat "+secret+" /etc/shadow 2>&1; ls / 2>&1")
	if bytes.Contains(c.Stdout, []byte(token)) {
		t.Errorf("BREACHED: the host secret %s was read", secret)
	}
	if bytes.Contains(c.Stdout, []byte("root:")) {
		t.Errorf("BREACHED: /etc/shadow was read")
	}
	// Nothing outside home and /tmp is writable.
	dirs := []string{"/", "/etc", "/usr", "/usr/bin", "/usr/local", "/var", "/root", "/opt", "/dev", "/run", "/home", "/proc/sys/kernel", secretDir}
	script := "for d in " + strings.Join(dirs, " ") + "; do (echo x > $d/.mg-write-probe) 2>/dev/null && echo WROTE:$d; done; " +
		"(echo evil > /proc/sys/kernel/hostname) 2>/dev/null && echo WROTE:hostname; " +
		"echo ok > $HOME/.mg-ok && echo ok > /tmp/.mg-ok && echo HOME-TMP-OK"
	c = mustSh(t, m, a, script)
	if bytes.Contains(c.Stdout, []byte("WROTE:")) {
		t.Errorf("BREACHED: wrote outside home and /tmp: %s", c.Stdout)
	}
	if !bytes.Contains(c.Stdout, []byte("HOME-TMP-OK")) {
		t.Errorf("home or /tmp not writable: %q %q", c.Stdout, c.Stderr)
	}
	// One sandbox cannot read another's files.
	bHome, err := m.HostPath(b, mechanism.Home)
	if err != nil {
		t.Fatal(err)
	}
	marker := "CROSS-SANDBOX-" + b
	mustSh(t, m, b, "echo "+marker+" > $HOME/marker; echo "+marker+" > /tmp/marker")
	c = mustSh(t, m, a, "cat $HOME/marker /tmp/marker "+bHome+"/marker 2>&1")
	if bytes.Contains(c.Stdout, []byte(marker)) {
		t.Errorf("BREACHED: sandbox %s read sandbox %s's files", a, b)
	}
}

func checkProcesses(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.ProcessSeparation)
	tag := fmt.Sprintf("3599.%d", time.Now().UnixNano()%100000)
	sentinel := exec.Command("sleep", tag)
	if err := sentinel.Start(); err != nil {
		k.notDemonstrated(t, "cannot start a host sentinel: %v", err)
	}
	defer func() { sentinel.Process.Kill(); sentinel.Wait() }()
	id := k.sandbox(t, m, "proc", mechanism.Spec{})
	c := mustSh(t, m, id, "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '; echo; ls -d /proc/[0-9]* | wc -l")
	if bytes.Contains(c.Stdout, []byte(tag)) {
		t.Errorf("BREACHED: host process 'sleep %s' visible inside", tag)
	}
	t.Logf("processes visible inside: %s", bytes.TrimSpace(c.Stdout[bytes.LastIndexByte(bytes.TrimSpace(c.Stdout), '\n')+1:]))
	c, err := sh(context.Background(), m, id, "kill -9 1; kill -9 -1; echo SENT", mechanism.ExecOptions{Timeout: 10 * time.Second})
	t.Logf("kill -9 1; kill -9 -1: exit %d, err %v, stderr %q", c.ExitStatus, err, c.Stderr)
	if err := sentinel.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("BREACHED: the host sentinel died: %v", err)
	}
	if _, err := os.Stat("/proc/1"); err != nil {
		t.Errorf("host init gone?")
	}
}

func checkPrivileges(t *testing.T, k *kit, m mechanism.Mechanism) {
	k.claims(t, m, mechanism.PrivilegeSeparation)
	if os.Geteuid() != 0 {
		k.notDemonstrated(t, "planting a setuid-root binary needs root")
	}
	id := k.sandbox(t, m, "priv", mechanism.Spec{})
	c := mustSh(t, m, id, "id -u")
	if strings.TrimSpace(string(c.Stdout)) == "0" {
		t.Logf("workload runs as uid 0 of its namespace")
	}
	dst, err := m.HostPath(id, "suid-id")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.Open("/usr/bin/id")
	if err != nil {
		k.notDemonstrated(t, "no /usr/bin/id on the host: %v", err)
	}
	defer src.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, src); err != nil {
		t.Fatal(err)
	}
	out.Close()
	if err := os.Chown(dst, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dst, 0o4755|os.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	before := strings.TrimSpace(string(c.Stdout))
	c = mustSh(t, m, id, "$HOME/suid-id -u")
	after := strings.TrimSpace(string(c.Stdout))
	if after != before {
		t.Errorf("BREACHED: a setuid-root binary changed euid from %s to %s", before, after)
	}
	if before == "0" {
		k.notDemonstrated(t, "the workload already runs as euid 0, so elevation cannot be observed")
	}
	c = mustSh(t, m, id, "grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status")
	if !bytes.Contains(c.Stdout, []byte("CapEff:\t0000000000000000")) || !bytes.Contains(c.Stdout, []byte("CapPrm:\t0000000000000000")) {
		t.Errorf("the workload holds capabilities: %s", c.Stdout)
	}
}

// checkFreeze: a mechanism.Freezer holds every process of the sandbox, one
// in a session of its own (setsid) included, from Freeze to Thaw; Status
// answers meanwhile; after Thaw they run on; a frozen sandbox can be
// stopped, and starts again. The daemon stamps the time
// every 20 ms: no stamp may fall well inside the frozen span.
func checkFreeze(t *testing.T, k *kit, m mechanism.Mechanism) {
	f, ok := m.(mechanism.Freezer)
	if !ok {
		k.notApplicable(t, "%s does not implement mechanism.Freezer", m.Name())
	}
	id := k.sandbox(t, m, "freeze", mechanism.Spec{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mustSh(t, m, id, `setsid sh -c 'end=$(($(date +%s) + 50)); while [ $(date +%s) -lt $end ]; do date +%s%N >> $HOME/stamps; sleep 0.02; done' >/dev/null 2>&1 </dev/null &`)
	stamps := func() []time.Time {
		c := mustSh(t, m, id, "cat $HOME/stamps 2>/dev/null; true")
		var out []time.Time
		for _, l := range strings.Fields(string(c.Stdout)) {
			var ns int64
			if _, err := fmt.Sscan(l, &ns); err == nil {
				out = append(out, time.Unix(0, ns))
			}
		}
		return out
	}
	for deadline := time.Now().Add(30 * time.Second); len(stamps()) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the daemon never stamped")
		}
	}
	if err := f.Freeze(ctx, id); err != nil {
		t.Fatalf("freeze: %v", err)
	}
	from := time.Now()
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	if s, err := m.Status(sctx, id); err != nil || s != mechanism.StatusRunning {
		t.Errorf("status of a frozen sandbox: %s, %v; want running, at once", s, err)
	}
	scancel()
	time.Sleep(400 * time.Millisecond) // 20 stamps, were anything running
	to := time.Now()
	if err := f.Thaw(ctx, id); err != nil {
		t.Fatalf("thaw: %v", err)
	}
	for _, st := range stamps() {
		if st.After(from.Add(100*time.Millisecond)) && st.Before(to.Add(-100*time.Millisecond)) {
			t.Fatalf("a process of the frozen sandbox ran: a stamp %v after the freeze, %v before the thaw", st.Sub(from), to.Sub(st))
		}
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ss := stamps()
		if len(ss) > 0 && ss[len(ss)-1].After(to) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the daemon did not run on after the thaw")
		}
	}
	// A frozen sandbox can still be stopped, and starts again unfrozen.
	if err := f.Freeze(ctx, id); err != nil {
		t.Fatalf("freeze again: %v", err)
	}
	if err := m.Stop(ctx, id); err != nil {
		t.Fatalf("stop of a frozen sandbox: %v", err)
	}
	if s, err := m.Status(ctx, id); err != nil || s != mechanism.StatusStopped {
		t.Fatalf("status after the stop of a frozen sandbox: %s, %v", s, err)
	}
	if err := m.Start(ctx, id); err != nil {
		t.Fatalf("start after the stop of a frozen sandbox: %v", err)
	}
	mustSh(t, m, id, "true")
}
