package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// managoatEnv runs the binary with extra environment and no stdin.
func managoatEnv(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBinary(t, nil, env, args...)
}

// TestLocalSessionOutlivesCLI: spawn --detach from one process, attach
// from another, and see every byte and the real exit code; ls and rm
// tell the truth afterwards.
func TestLocalSessionOutlivesCLI(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, env, "create", "e2e-box"); code != 0 {
		t.Fatalf("create: %d %s %s", code, out, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "e2e-box") })
	id, e, code := managoatEnv(t, env, "spawn", "--detach", "e2e-box", "--", "sh", "-c", "for i in 1 2 3; do echo line $i; sleep 0.1; done; echo err >&2; exit 7")
	if code != 0 || strings.TrimSpace(id) == "" {
		t.Fatalf("spawn --detach: %d %q %s", code, id, e)
	}
	out, errOut, code := managoatEnv(t, env, "attach", "e2e-box", strings.TrimSpace(id))
	if code != 7 || out != "line 1\nline 2\nline 3\n" || errOut != "err\n" {
		t.Fatalf("attach: exit %d stdout %q stderr %q", code, out, errOut)
	}
	if out, _, _ := managoatEnv(t, env, "ls"); !strings.Contains(out, "e2e-box") {
		t.Fatalf("ls: %q", out)
	}
	if _, e, code := managoatEnv(t, env, "attach", "e2e-box", "no-such-session"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Fatalf("attach unknown: %d %q", code, e)
	}
	if _, e, code := managoatEnv(t, env, "rm", "e2e-box"); code != 0 {
		t.Fatalf("rm: %d %s", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls"); strings.Contains(out, "e2e-box") {
		t.Fatalf("ls after rm: %q", out)
	}
}

// freeAddr is a loopback address with a port nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeRunnerRoundTrip: a platform, a runner dialling into it, and a
// CLI process running a command on the runner through the platform. The
// token never reaches a process the runner starts, and a password in the
// runner's --url never reaches its log.
func TestServeRunnerRoundTrip(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	home := t.TempDir()
	env := append(os.Environ(), "MANAGOAT_HOME="+home, "MANAGOAT_RUNNER_TOKEN=tok-e2e", "MANAGOAT_URL=http://"+addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logMu sync.Mutex
	var logs strings.Builder
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
				logMu.Lock()
				logs.WriteString(s.Text() + "\n")
				logMu.Unlock()
			}
		}()
		return c
	}
	serve := start("serve", "--listen", addr)
	defer serve.Wait()
	// The runner shows its own credential, not the client token.
	secret, e, code := managoatEnv(t, env[len(os.Environ()):], "enroll", "e2e")
	if code != 0 || !strings.HasPrefix(secret, "mgr_") {
		t.Fatalf("enroll: exit %d %q %s", code, secret, e)
	}
	credFile := filepath.Join(t.TempDir(), "cred")
	if err := os.WriteFile(credFile, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	rn := start("runner", "--url", "http://someone:pw-e2e-secret@"+addr, "--name", "e2e", "--token-file", credFile)
	defer rn.Wait()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, e, code := managoatEnv(t, env[len(os.Environ()):], "--provider", "runner", "run", "--", "sh", "-c", "echo via runner; exit 5")
		if code == 5 && out == "via runner\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run through the runner: exit %d stdout %q stderr %q", code, out, e)
		}
		time.Sleep(200 * time.Millisecond) // polling for the runner to connect
	}
	// cp works on the runner both ways (issue 22 item 3): a directory in,
	// with its modes, and back out.
	renv := env[len(os.Environ()):]
	name, e, code := managoatEnv(t, renv, "--provider", "runner", "create")
	if code != 0 {
		t.Fatalf("create on the runner: %s", e)
	}
	name = strings.TrimSpace(name)
	removed := false
	defer func() { // on a failure before the rm below, while serve is up
		if !removed {
			managoatEnv(t, renv, "--provider", "runner", "rm", "-f", name)
		}
	}()
	src := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(src+"/sub", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src+"/sub/run.sh", []byte("#!/bin/sh\necho ran on the runner\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, e, code := managoatEnv(t, renv, "--provider", "runner", "cp", src, name+":/tmp/tree"); code != 0 {
		t.Fatalf("cp to the runner: %s", e)
	}
	if out, e, code := managoatEnv(t, renv, "--provider", "runner", "exec", name, "--", "/tmp/tree/sub/run.sh"); code != 0 || out != "ran on the runner\n" {
		t.Fatalf("the copy on the runner: exit %d %q %s", code, out, e)
	}
	back := t.TempDir()
	if _, e, code := managoatEnv(t, renv, "--provider", "runner", "cp", name+":/tmp/tree", back); code != 0 {
		t.Fatalf("cp from the runner: %s", e)
	}
	if st, err := os.Stat(back + "/tree/sub/run.sh"); err != nil || st.Mode() != 0o755 {
		t.Fatalf("downloaded from the runner: %v %v", st, err)
	}
	// While a command runs on the runner, no process but serve and the
	// runner themselves holds the token in its environment: not the
	// sandbox's supervisor, not the command.
	bg := exec.Command(binary, "--provider", "runner", "run", "--", "sleep", "3")
	bg.Env = env
	if err := bg.Start(); err != nil {
		t.Fatal(err)
	}
	sawSupervisor := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		entries, _ := os.ReadDir("/proc")
		for _, en := range entries {
			pid, err := strconv.Atoi(en.Name())
			if err != nil || pid == serve.Process.Pid || pid == rn.Process.Pid || pid == bg.Process.Pid {
				continue
			}
			cmdline, _ := os.ReadFile("/proc/" + en.Name() + "/cmdline")
			if strings.Contains(string(cmdline), "managoat-supervisor\x00"+home) {
				sawSupervisor = true
			}
			if b, err := os.ReadFile("/proc/" + en.Name() + "/environ"); err == nil && strings.Contains(string(b), "tok-e2e") &&
				strings.Contains(string(cmdline), home) {
				t.Errorf("process %d (%q) inherited the runner's token", pid, cmdline)
			}
		}
	}
	if !sawSupervisor {
		t.Error("no supervisor of the runner's sandbox was seen: the check saw nothing")
	}
	// The client token connects no runner: an impostor is refused for good.
	if _, e, code := managoatEnv(t, env[len(os.Environ()):], "runner", "--url", "http://"+addr, "--name", "impostor"); code == 0 || !strings.Contains(e, "refused") {
		t.Errorf("a runner with the client token: exit %d: %s", code, e)
	}
	// The sandboxes go while serve and the runner are up (after cancel,
	// an rm could not reach them, and a teardown left running raced the
	// removal of the test's directory).
	if err := bg.Wait(); err != nil {
		t.Errorf("run -- sleep 3 on the runner: %v", err)
	}
	if _, e, code := managoatEnv(t, renv, "--provider", "runner", "rm", "-f", name); code != 0 {
		t.Errorf("rm on the runner: %s", e)
	}
	removed = true
	cancel()
	_ = rn.Wait()
	_ = serve.Wait()
	waitNoProcessUnder(t, home, 15*time.Second)
	logMu.Lock()
	defer logMu.Unlock()
	if strings.Contains(logs.String(), "pw-e2e-secret") || strings.Contains(logs.String(), "tok-e2e") {
		t.Errorf("a secret is in the logs:\n%s", logs.String())
	}
	// A token on the command line is refused before anything runs.
	if _, e, code := managoatEnv(t, nil, "runner", "--url", "http://"+addr, "--token", "tok-e2e"); code != 2 || !strings.Contains(e, "--token-file") {
		t.Errorf("runner --token: exit %d: %s", code, e)
	}
}

// TestKillNineLosesNothing: kill -9 of the sandbox's supervisor (the
// process holding the session's pipes) after output was journaled; ls then
// says running (the sandbox ran on, and a new supervisor adopted it),
// attach replays every byte and reports the unknown exit as an error,
// never a made-up code, and the next exec works.
func TestKillNineLosesNothing(t *testing.T) {
	testenv.RequireRoot(t)
	home := t.TempDir()
	env := []string{"MANAGOAT_HOME=" + home}
	if _, e, code := managoatEnv(t, env, "create", "k9"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "k9") })
	id, e, code := managoatEnv(t, env, "spawn", "--detach", "k9", "--", "sh", "-c", "for i in 1 2 3; do echo line $i; done; sleep 100")
	if code != 0 {
		t.Fatalf("spawn: %s", e)
	}
	id = strings.TrimSpace(id)
	var sup int
	for deadline := time.Now().Add(10 * time.Second); ; {
		entries, _ := os.ReadDir("/proc")
		for _, en := range entries {
			b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline")
			if err == nil && strings.Contains(string(b), "managoat-supervisor\x00"+home) {
				fmt.Sscan(en.Name(), &sup)
			}
		}
		j, _ := os.ReadFile(home + "/sandboxes/k9/sessions/" + id + "/journal")
		if sup != 0 && strings.Contains(string(j), "line 3") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("supervisor %d, journal %q", sup, j)
		}
		time.Sleep(20 * time.Millisecond) // polling for the journal
	}
	if err := syscall.Kill(sup, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); syscall.Kill(sup, 0) == nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("supervisor survived SIGKILL")
		}
	}
	// The sandbox runs on: ls says so, a new supervisor having adopted it.
	if out, _, _ := managoatEnv(t, env, "ls", "--json"); !strings.Contains(out, `"status":"running"`) {
		t.Fatalf("ls after kill -9: %s", out)
	}
	out, e, code := managoatEnv(t, env, "attach", "k9", id)
	if out != "line 1\nline 2\nline 3\n" || code != exitCouldNotRun || !strings.Contains(e, "closed_before_exit") {
		t.Fatalf("attach after kill -9: exit %d stdout %q stderr %q", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "exec", "k9", "--", "echo", "back"); code != 0 || out != "back\n" {
		t.Fatalf("exec after kill -9: %d %q %q", code, out, e)
	}
}

// Each `managoat run` is a fresh process whose first sandbox is its only
// one: what a start does once per process (making the jail's init
// executable from memory, adopting or pinning the tree template) is
// exercised every time, with whatever descriptor numbers that process
// happens to have. Bounded: 60 runs.
func TestRunRepeatedlyOnTheJail(t *testing.T) {
	testenv.RequireRoot(t)
	home := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for i := range 60 {
		out, errOut, code := managoatEnv(t, home, "run", "--", "sh", "-c", "cat /etc/hostname >/dev/null && echo ok")
		if code != 0 || out != "ok\n" {
			t.Fatalf("run %d: exit %d, stdout %q, stderr %q", i, code, out, errOut)
		}
	}
}

// doctor names the jail's init and where its tree templates are pinned.
func TestDoctorNamesTheJailInit(t *testing.T) {
	testenv.RequireRoot(t)
	out, errOut, code := managoatEnv(t, nil, "doctor")
	if code != 0 {
		t.Fatalf("doctor: exit %d: %s", code, errOut)
	}
	for _, want := range []string{"\n  jail init: ", "\n  jail tree templates"} {
		if !strings.Contains(out, want) {
			t.Fatalf("doctor's output has no %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, "default limits of a sandbox made without any") {
		t.Fatalf("doctor does not show the default limits:\n%s", out)
	}
	out, _, _ = managoatEnv(t, []string{"MANAGOAT_JAIL_INIT=go"}, "doctor", "--json")
	var r struct {
		JailInit string `json:"jail_init"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil || r.JailInit != "Go (MANAGOAT_JAIL_INIT=go)" {
		t.Fatalf("doctor --json with MANAGOAT_JAIL_INIT=go: %v %q", err, r.JailInit)
	}
}

// TestRunBudgetSpentBeforeTheStart: a budget too short for the command to
// start is reported as the timeout it is, not as an unreachable sandbox.
func TestRunBudgetSpentBeforeTheStart(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, d := range []string{"1ns", "1us"} {
		_, e, code := managoatEnv(t, env, "run", "--timeout", d, "--", "true")
		if code != exitTimeout || !strings.Contains(e, "exec_timeout") || strings.Contains(e, "init") {
			t.Errorf("run --timeout %s: exit %d: %s", d, code, e)
		}
	}
}

// TestLsWideShowsLimits: ls -o wide shows each sandbox's limits, the
// defaults of one made without any among them (LABELS and ALLOW last, - for none).
func TestLsWideShowsLimits(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, args := range [][]string{{"create", "plain"}, {"create", "--pids", "50", "--memory", "100M", "--timeout", "30s", "capped"}} {
		if _, e, code := managoatEnv(t, env, args...); code != 0 {
			t.Fatalf("%v: %s", args, e)
		}
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "plain", "capped") })
	out, e, code := managoatEnv(t, env, "ls", "-o", "wide")
	if code != 0 {
		t.Fatalf("ls -o wide: %s", e)
	}
	if !strings.Contains(out, "MEMORY") || !regexp.MustCompile(`(?m)^capped\s+running\s+-\s+100M\s+50\s+-\s+\S+\s+30s\s+local\s+jail\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+-\s+-$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^plain\s+running\s+-\s+\d+M\s+1024\s+-\s+\S+\s+-\s+local\s+jail\s`).MatchString(out) {
		t.Fatalf("ls -o wide:\n%s", out)
	}
}

// waitNoProcessUnder waits until no process's command line names dir (a
// supervisor, a sandbox's init) and fails the test naming those left.
func waitNoProcessUnder(t *testing.T, dir string, limit time.Duration) {
	t.Helper()
	var left []string
	for deadline := time.Now().Add(limit); ; time.Sleep(100 * time.Millisecond) {
		left = left[:0]
		entries, _ := os.ReadDir("/proc")
		for _, en := range entries {
			if _, err := strconv.Atoi(en.Name()); err != nil {
				continue
			}
			if b, err := os.ReadFile("/proc/" + en.Name() + "/cmdline"); err == nil && strings.Contains(string(b), dir) {
				left = append(left, en.Name()+" "+strings.ReplaceAll(string(b), "\x00", " "))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("processes left under %s after %v: %q", dir, limit, left)
			return
		}
	}
}
