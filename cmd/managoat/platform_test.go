package main

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// TestPlatformTwoAccounts is the README's platform section with two
// accounts: serve admin makes each an account and a key, serve runs, and
// from "another terminal" each account's CLI (MANAGOAT_URL and
// MANAGOAT_API_KEY) creates, runs and lists; each sees only its own
// sandboxes, with their provider, and the other's is not found.
func TestPlatformTwoAccounts(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	home := t.TempDir()
	base := []string{"MANAGOAT_HOME=" + home, "SANDBOX_RUNNERS_ENABLED=false"}
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
	lists := map[string]string{}
	for who, want := range map[string]string{"alice": "box-a", "bob": "box-b"} {
		out, e, code := managoatEnv(t, as(who), "ls", "--json")
		if code != 0 {
			t.Fatalf("ls %s: %d %s", who, code, e)
		}
		var rows []struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal([]byte(out), &rows); err != nil || len(rows) != 1 || rows[0].Name != want {
			t.Fatalf("%s's ls = %s (%v), want only %s", who, out, err, want)
		}
		lists[who] = out
	}
	if out, e, code := managoatEnv(t, as("alice"), "ls"); code != 0 || !regexp.MustCompile(`(?m)^NAME\s+STATUS\s+STATE\s+PROVIDER$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^box-a\s+running\s+\S+\s+local$`).MatchString(out) {
		t.Fatalf("alice's ls = %d %q %s, want a PROVIDER column saying local", code, out, e)
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
	for who, box := range map[string]string{"alice": "box-a", "bob": "box-b"} {
		if _, e, code := managoatEnv(t, as(who), "rm", box); code != 0 {
			t.Fatalf("rm %s: %d %s", box, code, e)
		}
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
