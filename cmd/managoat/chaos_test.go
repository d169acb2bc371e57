package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// chaosBytes is the payload each session of TestChaosKillEachProcess
// streams: 64 MiB of random bytes (issue 31's chaos harness).
const chaosBytes = 64 << 20

// TestChaosKillEachProcess is the chaos harness of the runner path: while
// a session on a runner streams a known random payload (64 MiB, 1 MiB
// every 30 ms) through `managoat serve` to `managoat attach`, each
// managoat process in turn is killed with SIGKILL: the CLI, the runner
// daemon, serve, and the sandbox's supervisor. What a user or a service
// manager would restart is restarted (the daemon, serve), the CLI attaches
// again, and sha256 says what arrived: where the workload lives on (the
// CLI, the daemon, serve) the whole payload exactly once and in order,
// then its exit; where it cannot (its supervisor, which holds its pipes)
// exactly the bytes journaled before the kill, in order, and an error,
// never an exit. Nothing is left running afterwards. Kills across
// replicas and of a NATS node are natshost's TestNATSNodeDiesMidStream and
// TestReplicaAndNATSNodeDieMidStream.
func TestChaosKillEachProcess(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	home := t.TempDir()
	env := append(os.Environ(), "MANAGOAT_HOME="+home, "MANAGOAT_RUNNER_TOKEN=tok-chaos", "MANAGOAT_URL=http://"+addr)
	renv := env[len(os.Environ()):]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := func(args ...string) *exec.Cmd {
		c := exec.CommandContext(ctx, binary, args...)
		c.Env = env
		c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
		c.WaitDelay = 10 * time.Second
		pr, err := c.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			for s := bufio.NewScanner(pr); s.Scan(); {
				t.Log(args[0], ":", s.Text())
			}
		}()
		return c
	}
	kill9 := func(c *exec.Cmd) {
		t.Helper()
		_ = c.Process.Signal(syscall.SIGKILL)
		_ = c.Wait()
	}
	serve := start("serve", "--listen", addr)
	secret, e, code := managoatEnv(t, renv, "enroll", "chaos")
	if code != 0 || !strings.HasPrefix(secret, "mgr_") {
		t.Fatalf("enroll: exit %d %q %s", code, secret, e)
	}
	credFile := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(credFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	runnerArgs := []string{"runner", "--url", "http://" + addr, "--name", "chaos", "--token-file", credFile}
	rn := start(runnerArgs...)
	var name string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) { // polling for the runner
		out, e, code := managoatEnv(t, renv, "--provider", "runner", "create")
		if code == 0 {
			name = strings.TrimSpace(out)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create on the runner: exit %d %s", code, e)
		}
	}
	defer func() {
		managoatEnv(t, renv, "--provider", "runner", "rm", "-f", name)
		cancel()
		_ = rn.Wait()
		_ = serve.Wait()
		waitNoProcessUnder(t, home, 20*time.Second)
	}()
	payload := make([]byte, chaosBytes)
	_, _ = rand.Read(payload)
	src := filepath.Join(t.TempDir(), "payload")
	if err := os.WriteFile(src, payload, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, e, code := managoatEnv(t, renv, "--provider", "runner", "cp", src, name+":/tmp/payload"); code != 0 {
		t.Fatalf("cp the payload: %s", e)
	}
	wantSum := sha256.Sum256(payload)
	script := "for i in $(seq 0 " + strconv.Itoa(chaosBytes>>20-1) + "); do dd if=/tmp/payload bs=1M skip=$i count=1 2>/dev/null; sleep 0.03; done"

	// attach runs `managoat attach` and counts and hashes what it prints.
	type attached struct {
		cmd  *exec.Cmd
		n    atomic.Int64
		sum  []byte
		out  bytes.Buffer // the bytes, when kept
		done chan error
	}
	attach := func(sid string, keep bool) *attached {
		a := &attached{done: make(chan error, 1)}
		a.cmd = exec.CommandContext(ctx, binary, "--provider", "runner", "attach", name, sid)
		a.cmd.Env = env
		var stderr bytes.Buffer
		a.cmd.Stderr = &stderr
		pr, err := a.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() {
			h := sha256.New()
			buf := make([]byte, 256<<10)
			for {
				n, err := pr.Read(buf)
				h.Write(buf[:n])
				if keep {
					a.out.Write(buf[:n])
				}
				a.n.Add(int64(n))
				if err != nil {
					break
				}
			}
			a.sum = h.Sum(nil)
			err := a.cmd.Wait()
			if err != nil && stderr.Len() > 0 {
				err = &exitErr{err, stderr.String()}
			}
			a.done <- err
		}()
		return a
	}
	waitFor := func(a *attached, n int64) {
		t.Helper()
		for deadline := time.Now().Add(60 * time.Second); a.n.Load() < n; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("attach delivered %d bytes, waited for %d", a.n.Load(), n)
			}
		}
	}
	spawn := func() string {
		t.Helper()
		out, e, code := managoatEnv(t, renv, "--provider", "runner", "spawn", "--detach", name, "--", "sh", "-c", script)
		if code != 0 {
			t.Fatalf("spawn: exit %d %s", code, e)
		}
		return strings.TrimSpace(out)
	}
	whole := func(what, sid string) {
		t.Helper()
		var a *attached
		for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			a = attach(sid, false)
			err := <-a.done
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: attach again: %v after %d bytes", what, err, a.n.Load())
			}
			t.Logf("%s: attach again: %v (retrying while the path comes back)", what, err)
		}
		if a.n.Load() != chaosBytes || !bytes.Equal(a.sum, wantSum[:]) {
			t.Errorf("%s: the attach after the kill got %d bytes, sha256 match %v: want all %d bytes once, in order", what, a.n.Load(), bytes.Equal(a.sum, wantSum[:]), chaosBytes)
		}
	}

	t.Run("CLI", func(t *testing.T) {
		sid := spawn()
		a := attach(sid, false)
		waitFor(a, 8<<20)
		_ = a.cmd.Process.Signal(syscall.SIGKILL) // its reader waits for it
		<-a.done
		whole("kill -9 of the CLI", sid)
	})
	t.Run("RunnerDaemon", func(t *testing.T) {
		sid := spawn()
		a := attach(sid, false)
		waitFor(a, 8<<20)
		kill9(rn)
		<-a.done // the platform ends the stream: runner_disconnected
		rn = start(runnerArgs...)
		whole("kill -9 of the runner daemon", sid)
	})
	t.Run("Serve", func(t *testing.T) {
		sid := spawn()
		a := attach(sid, false)
		waitFor(a, 8<<20)
		kill9(serve)
		<-a.done
		serve = start("serve", "--listen", addr)
		whole("kill -9 of serve", sid)
	})
	t.Run("Supervisor", func(t *testing.T) {
		sid := spawn()
		a := attach(sid, true)
		waitFor(a, 8<<20)
		var sup int
		entries, _ := os.ReadDir("/proc")
		for _, en := range entries {
			b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline")
			if err == nil && strings.Contains(string(b), "managoat-supervisor\x00"+home) {
				sup, _ = strconv.Atoi(en.Name())
			}
		}
		if sup == 0 {
			t.Fatal("no supervisor of the runner's sandbox found")
		}
		if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		err := <-a.done
		got := a.out.Bytes()
		if err == nil || len(got) == 0 || !bytes.Equal(got, payload[:len(got)]) {
			t.Fatalf("kill -9 of the supervisor: the attach ended with %v after %d bytes, a prefix of the payload: %v (want an error, never an exit, after the bytes in order)",
				err, len(got), len(got) > 0 && bytes.Equal(got, payload[:len(got)]))
		}
		// Attached again: what was journaled before the kill, in order,
		// and again an error.
		b := attach(sid, true)
		err = <-b.done
		again := b.out.Bytes()
		if err == nil || len(again) < len(got) || !bytes.Equal(again, payload[:len(again)]) {
			t.Errorf("attach after the supervisor's kill: %v after %d bytes (the first attach had %d), a prefix of the payload: %v",
				err, len(again), len(got), bytes.Equal(again, payload[:min(len(again), len(payload))]))
		}
	})
}

type exitErr struct {
	err    error
	stderr string
}

func (e *exitErr) Error() string { return e.err.Error() + ": " + strings.TrimSpace(e.stderr) }
