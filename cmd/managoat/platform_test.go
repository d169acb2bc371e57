package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// TestPlatformTwoAccounts is the README's platform section with two
// accounts: serve admin makes each an account and a key, serve runs, and
// from "another terminal" each account's CLI (MANAGOAT_URL and
// MANAGOAT_API_KEY) creates, runs and lists; alice's runner daemon (her
// key in --token-file) adds a runner sandbox; each sees only its own
// sandboxes, every provider's, with their provider, and the other's is not
// found. No secret serve or a client holds reaches another process, a
// sandbox or a log.
func TestPlatformTwoAccounts(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	home := t.TempDir()
	base := []string{"MANAGOAT_HOME=" + home}
	keys := map[string]string{}
	for _, who := range []string{"alice", "bob"} {
		if out, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", who); code != 0 || !strings.HasPrefix(out, "acct_") {
			t.Fatalf("account create %s: %d %q %s", who, code, out, e)
		}
		out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", who, "--label", "e2e")
		if code != 0 || !strings.HasPrefix(out, "mgk_") {
			t.Fatalf("key create %s: %d %q %s", who, code, out, e)
		}
		keys[who] = strings.TrimSpace(out)
	}
	var logs func() string
	t.Cleanup(func() { // after serve's own cleanup has stopped it
		if logs == nil {
			return
		}
		for _, k := range keys {
			if strings.Contains(logs(), k) || strings.Contains(logs(), k[21:]) {
				t.Errorf("serve's log shows an API key")
			}
		}
		for _, s := range []string{"pg-e2e-secret", "spr-e2e-secret", "tok-e2e-static"} {
			if strings.Contains(logs(), s) {
				t.Errorf("serve's log shows a secret it was given: %s", s)
			}
		}
	})
	// Secrets serve is given: none may reach a process serve starts (a
	// sandbox's supervisor, its commands), nor serve's log.
	secrets := []string{"pg-e2e-secret", "spr-e2e-secret", "tok-e2e-static"}
	logs = startServe(t, append(append([]string{}, base...), "PGPASSWORD=pg-e2e-secret", "SPRITES_TOKEN=spr-e2e-secret",
		"SPRITES_API_URL=http://127.0.0.1:1", "MANAGOAT_RUNNER_TOKEN=tok-e2e-static"), addr)
	as := func(who string) []string {
		return append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+keys[who])
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, e, code := managoatEnv(t, as("alice"), "create", "box-a")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create box-a: %d %s", code, e)
		}
		time.Sleep(100 * time.Millisecond) // serve is starting
	}
	if _, e, code := managoatEnv(t, as("bob"), "create", "box-b"); code != 0 {
		t.Fatalf("create box-b: %d %s", code, e)
	}
	if out, e, code := managoatEnv(t, as("alice"), "exec", "box-a", "--", "sh", "-c", "echo hello from alice; exit 4"); code != 4 || out != "hello from alice\n" {
		t.Fatalf("exec: %d %q %s", code, out, e)
	}
	// alice's own machine serves her as a runner, with her key: her
	// runner sandboxes are listed beside her local ones.
	keyFile := filepath.Join(t.TempDir(), "alice.key")
	if err := os.WriteFile(keyFile, []byte(keys["alice"]+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	runnerLog := startDaemon(t, base, "runner", "--url", "http://"+addr, "--name", "alice-laptop", "--token-file", keyFile)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) { // the runner is connecting
		_, e, code := managoatEnv(t, as("alice"), "--provider", "platform:runner", "create", "box-r")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create box-r on alice's runner: %d %s", code, e)
		}
	}
	if out, e, code := managoatEnv(t, as("alice"), "exec", "box-r", "--", "echo", "on my runner"); code != 0 || out != "on my runner\n" {
		t.Fatalf("exec on the runner: %d %q %s", code, out, e)
	}
	secrets = append(secrets, keys["alice"], keys["bob"])
	if out, e, code := managoatEnv(t, as("alice"), "exec", "box-a", "--", "env"); code != 0 {
		t.Fatalf("exec env: %d %s", code, e)
	} else {
		for _, s := range secrets {
			if strings.Contains(out, s) {
				t.Errorf("a command in the sandbox sees a secret of serve or of a client: %q", s)
			}
		}
	}
	noSecretsInProcesses(t, home, addr, secrets)
	if l := runnerLog(); !strings.Contains(l, "runner connected") || strings.Contains(l, keys["alice"][21:]) {
		t.Errorf("the runner's log (want it connected, never showing its key):\n%s", l)
	}
	lists := map[string]string{}
	for who, want := range map[string]string{"alice": "box-a,box-r", "bob": "box-b"} {
		out, e, code := managoatEnv(t, as(who), "ls", "--json")
		if code != 0 {
			t.Fatalf("ls %s: %d %s", who, code, e)
		}
		var rows []struct {
			Name string `json:"name"`
		}
		var names []string
		if err := json.Unmarshal([]byte(out), &rows); err != nil {
			t.Fatalf("%s's ls = %s: %v", who, out, err)
		}
		for _, r := range rows {
			names = append(names, r.Name)
		}
		if slices.Sort(names); strings.Join(names, ",") != want {
			t.Fatalf("%s's ls = %s, want only %s", who, out, want)
		}
		lists[who] = out
	}
	if out, e, code := managoatEnv(t, as("alice"), "ls"); code != 0 || !regexp.MustCompile(`(?m)^NAME\s+STATUS\s+STATE\s+PROVIDER$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^box-a\s+running\s+\S+\s+local$`).MatchString(out) || !regexp.MustCompile(`(?m)^box-r\s+running\s+\S+\s+runner$`).MatchString(out) {
		t.Fatalf("alice's ls = %d %q %s, want a PROVIDER column saying local and runner", code, out, e)
	}
	if _, e, code := managoatEnv(t, as("bob"), "exec", "box-r", "--", "true"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Fatalf("bob's exec in alice's runner box = %d %s, want not_found", code, e)
	}
	if _, e, code := managoatEnv(t, as("bob"), "exec", "box-a", "--", "true"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Fatalf("bob's exec in alice's box = %d %s, want not_found", code, e)
	}
	if _, e, code := managoatEnv(t, as("bob"), "rm", "box-a"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Fatalf("bob's rm of alice's box = %d %s, want not_found", code, e)
	}
	if out, _, code := managoatEnv(t, as("alice"), "exec", "box-a", "--", "echo", "still here"); code != 0 || out != "still here\n" {
		t.Fatalf("alice's box after bob's rm: %d %q", code, out)
	}
	for _, wb := range [][2]string{{"alice", "box-a"}, {"bob", "box-b"}, {"alice", "box-r"}} {
		if _, e, code := managoatEnv(t, as(wb[0]), "rm", wb[1]); code != 0 {
			t.Fatalf("rm %s: %d %s", wb[1], code, e)
		}
	}
	// The admin commands work beside a running serve: bob's key, revoked
	// from another process, is refused at once.
	if _, e, code := managoatEnv(t, base, "serve", "admin", "key", "revoke", keys["bob"][4:20]); code != 0 {
		t.Fatalf("key revoke while serve runs: %d %s", code, e)
	}
	if _, e, code := managoatEnv(t, as("bob"), "ls"); code == 0 || !strings.Contains(e, "denied") || strings.Contains(e, keys["bob"][21:]) {
		t.Fatalf("ls with a revoked key: %d %s", code, e)
	}
	// A wrong key is refused, naming neither key.
	if _, e, code := managoatEnv(t, append(as("alice")[:len(as("alice"))-1], "MANAGOAT_API_KEY=mgk_0000000000000000_wrong"), "ls"); code == 0 || !strings.Contains(e, "denied") {
		t.Fatalf("ls with a wrong key: %d %s", code, e)
	}
}

// TestServeRefusesADefaultThatIsOff: an explicit SANDBOX_PROVIDER whose
// provider is not enabled stops serve at start, naming the variable and
// what is missing; so does a switch that is not a boolean.
func TestServeRefusesADefaultThatIsOff(t *testing.T) {
	for _, env := range [][]string{
		{"SANDBOX_PROVIDER=e2b", "E2B_API_KEY="},
		{"SANDBOX_RUNNERS_ENABLED=perhaps"},
	} {
		name := strings.SplitN(env[0], "=", 2)[0]
		_, e, code := managoatEnv(t, append([]string{"MANAGOAT_HOME=" + t.TempDir()}, env...), "serve", "--listen", freeAddr(t))
		if code != exitUsage || !strings.Contains(e, name) {
			t.Errorf("serve with %v = exit %d %q, want a usage error naming %s", env, code, e, name)
		}
	}
}

// noSecretsInProcesses checks every process of this platform (those whose
// environment names its MANAGOAT_HOME) but serve itself, whose starting
// environment cannot be taken back: no secret is in its command line or
// environment. It fails when it finds no such process (a sandbox's
// supervisor must be there), so it cannot pass by seeing nothing.
func noSecretsInProcesses(t *testing.T, home, addr string, secrets []string) {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, en := range entries {
		if _, err := strconv.Atoi(en.Name()); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + en.Name() + "/cmdline")
		environ, err := os.ReadFile("/proc/" + en.Name() + "/environ")
		if err != nil || !bytes.Contains(append([]byte{0}, environ...), []byte("\x00MANAGOAT_HOME="+home+"\x00")) {
			continue
		}
		if bytes.Contains(cmdline, []byte("\x00serve\x00--listen\x00"+addr)) {
			continue // serve itself
		}
		seen++
		for _, s := range secrets {
			if bytes.Contains(cmdline, []byte(s)) || bytes.Contains(environ, []byte(s)) {
				t.Errorf("process %s (%q) holds a secret (%.12s...) in its command line or environment", en.Name(), bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), s)
			}
		}
	}
	if seen == 0 {
		t.Error("no process of the platform but serve was found: the check saw nothing")
	}
}

// startDaemon runs the binary with args and env (beside the test's own)
// until the test ends, logging its stderr; it returns the stderr so far.
func startDaemon(t *testing.T, env []string, args ...string) func() string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := exec.CommandContext(ctx, binary, args...)
	c.Env = append(os.Environ(), env...)
	c.Cancel = func() error { return c.Process.Signal(os.Interrupt) }
	c.WaitDelay = 10 * time.Second
	pr, err := c.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs strings.Builder
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for s := bufio.NewScanner(pr); s.Scan(); {
			t.Log(args[0], ":", s.Text())
			mu.Lock()
			logs.WriteString(s.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = c.Wait()
		<-logged
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
}

// TestServeWithNothingEnabled: serve with no provider enabled starts, says
// so, and a create through it fails naming what to set.
func TestServeWithNothingEnabled(t *testing.T) {
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_RUNNERS_ENABLED=false", "SANDBOX_LOCAL_ENABLED=false",
		"SPRITES_TOKEN=", "E2B_API_KEY=", "DAYTONA_API_KEY=", "SANDBOX_PROVIDER="}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Fatalf("account create: %d %s", code, e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "me")
	if code != 0 {
		t.Fatalf("key create: %d %s", code, e)
	}
	logs := startServe(t, base, addr)
	env := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+strings.TrimSpace(key))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		_, e, code = managoatEnv(t, env, "create", "box")
		if !strings.Contains(e, "connection refused") || time.Now().After(deadline) {
			break // serve is up, or never came up
		}
	}
	if code == 0 {
		t.Fatal("a create succeeded with no provider enabled")
	}
	for _, w := range []string{"no sandbox provider is enabled", "SPRITES_TOKEN", "E2B_API_KEY", "DAYTONA_API_KEY", "SANDBOX_RUNNERS_ENABLED"} {
		if !strings.Contains(e, w) {
			t.Errorf("the refused create says %q, without %q", e, w)
		}
	}
	if out, e, code := managoatEnv(t, env, "ls"); code != 0 || strings.Contains(out, "box") {
		t.Errorf("ls after the refused create: %d %q %s", code, out, e)
	}
	if !strings.Contains(logs(), "default: none") {
		t.Errorf("serve's start does not say nothing is enabled:\n%s", logs())
	}
}

// TestServeKeepsPasswordsOutOfPs: a database or NATS URL with a password
// is refused as a flag (ps shows flags), naming the variable to use; from
// the variable it is taken, and an error about it shows no password.
func TestServeKeepsPasswordsOutOfPs(t *testing.T) {
	home := "MANAGOAT_HOME=" + t.TempDir()
	for _, tc := range []struct {
		flag, url, env string
	}{
		{"--db", "postgres://u:pw-e2e-secret@127.0.0.1:1/db", "MANAGOAT_DATABASE_URL"},
		{"--nats", "nats://u:pw-e2e-secret@127.0.0.1:1", "MANAGOAT_NATS_URL"},
	} {
		_, e, code := managoatEnv(t, []string{home}, "serve", "--listen", "127.0.0.1:0", tc.flag, tc.url)
		if code != exitUsage || !strings.Contains(e, tc.env) || strings.Contains(e, "pw-e2e-secret") {
			t.Errorf("serve %s URL-with-password = exit %d %q, want a usage error naming %s, without the password", tc.flag, code, e, tc.env)
		}
		// From the variable: taken, and the server is not there.
		_, e, code = managoatEnv(t, []string{home, tc.env + "=" + tc.url, envClusterKey + "=" + testClusterKey}, "serve", "--listen", "127.0.0.1:0")
		if code == 0 || code == exitUsage || strings.Contains(e, "pw-e2e-secret") {
			t.Errorf("serve with %s (nothing listening) = exit %d %q, want a failure to connect without the password", tc.env, code, e)
		}
	}
}

// TestServeBoundFlags: serve's --failed-auth-burst and --failed-auth-rate
// reach the API: past the burst, a source address's requests are 429 with
// Retry-After, its good key too.
func TestServeBoundFlags(t *testing.T) {
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir(), "SANDBOX_RUNNERS_ENABLED=false", "SANDBOX_LOCAL_ENABLED=false",
		"SPRITES_TOKEN=", "E2B_API_KEY=", "DAYTONA_API_KEY=", "SANDBOX_PROVIDER="}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Fatalf("account create: %d %s", code, e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "me")
	if code != 0 {
		t.Fatalf("key create: %d %s", code, e)
	}
	startServeCmd(t, base, addr, "--failed-auth-burst", "2", "--failed-auth-rate", "0.01")
	get := func(k string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+k)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			r, err := http.DefaultClient.Do(req)
			if err == nil {
				r.Body.Close()
				return r
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
		}
	}
	if r := get(strings.TrimSpace(key)); r.StatusCode != http.StatusOK {
		t.Fatalf("a good key: %s", r.Status)
	}
	for i := range 2 {
		if r := get("mg_wrong"); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("bad key %d: %s, want 401 within the burst", i, r.Status)
		}
	}
	for _, k := range []string{"mg_wrong", strings.TrimSpace(key)} {
		if r := get(k); r.StatusCode != http.StatusTooManyRequests || r.Header.Get("Retry-After") == "" {
			t.Fatalf("past the burst: %s (Retry-After %q), want 429 with Retry-After", r.Status, r.Header.Get("Retry-After"))
		}
	}
}
