package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

func home(t *testing.T) []string { return []string{"MANAGOAT_HOME=" + t.TempDir()} }

// TestQuietFallbacksAreSaid: what managoat does that a new user would not
// guess is said once on stderr. MANAGOAT_URL without MANAGOAT_API_KEY uses
// the local provider, and says so (not when a provider was chosen); enroll
// without --account enrolls for account local, and says so; the fake's
// refusal of a real command says the fake runs no program.
func TestQuietFallbacksAreSaid(t *testing.T) {
	env := []string{"MANAGOAT_HOME=" + t.TempDir(), "MANAGOAT_URL=http://127.0.0.1:1", "MANAGOAT_API_KEY="}
	const fallback = "managoat: note: MANAGOAT_URL is set but MANAGOAT_API_KEY is not: using the local provider on this machine, not the platform at http://127.0.0.1:1"
	_, e, code := runBinary(t, nil, env, "--mechanism", "trusted", "ls")
	if code != 0 || strings.Count(e, fallback) != 1 || strings.Count(e, "\n") != 1 {
		t.Errorf("ls with MANAGOAT_URL and no key: exit %d stderr %q, want one note of the fallback", code, e)
	}
	for _, chosen := range [][]string{{"--provider", "local"}, {"--provider=local"}} {
		if _, e, code := runBinary(t, nil, env, append(append([]string{"--mechanism", "trusted"}, chosen...), "ls")...); code != 0 || e != "" {
			t.Errorf("%v ls with MANAGOAT_URL and no key: exit %d stderr %q, want nothing said", chosen, code, e)
		}
	}
	if _, e, code := runBinary(t, nil, append(env, "MANAGOAT_PROVIDER=local"), "--mechanism", "trusted", "ls"); code != 0 || e != "" {
		t.Errorf("MANAGOAT_PROVIDER=local ls: exit %d stderr %q, want nothing said", code, e)
	}
	if _, e, code := runBinary(t, nil, env, "--mechanism", "trusted", "ls", "--provider", "local"); code != 0 || e != "" {
		t.Errorf("ls --provider local: exit %d stderr %q, want nothing said", code, e)
	}

	// MANAGOAT_URL unset: the platform's default address, said.
	_, e, _ = runBinary(t, nil, append(home(t), "MANAGOAT_URL=", "MANAGOAT_API_KEY=mgk_0000000000000000_x"), "--provider", "platform", "ls")
	if !strings.HasPrefix(e, "managoat: note: MANAGOAT_URL is not set: using the platform at http://127.0.0.1:8080") {
		t.Errorf("--provider platform without MANAGOAT_URL: stderr %q, want a note of the default address", e)
	}
	_, e, _ = runBinary(t, nil, append(home(t), "MANAGOAT_URL=", "MANAGOAT_RUNNER_TOKEN=x"), "--provider", "runner", "ls")
	if !strings.HasPrefix(e, "managoat: note: MANAGOAT_URL is not set: using the platform at http://127.0.0.1:8080") {
		t.Errorf("--provider runner without MANAGOAT_URL: stderr %q, want a note of the default address", e)
	}

	runners := filepath.Join(t.TempDir(), "runners.json")
	out, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "laptop")
	if code != 0 || !strings.HasPrefix(out, "mgr_") || !strings.Contains(e, `managoat: note: no --account: laptop serves account "local", the default`) ||
		!strings.Contains(e, "--account NAME") {
		t.Errorf("enroll without --account: exit %d stderr %q, want a note naming account local and --account", code, e)
	}
	if _, e, code := runBinary(t, nil, nil, "enroll", "--runners", runners, "--account", "alice", "desk"); code != 0 || strings.Contains(e, "note") ||
		!strings.Contains(e, `for account "alice"`) {
		t.Errorf("enroll --account alice: exit %d stderr %q", code, e)
	}

	_, e, code = runBinary(t, nil, nil, "--provider", "fake", "run", "--", "echo", "hi")
	if code != exitCouldNotRun || strings.Count(e, "\n") != 1 || !strings.Contains(e, "the fake provider runs no program") || !strings.Contains(e, "--provider local runs real commands") {
		t.Errorf("--provider fake run -- echo hi: exit %d stderr %q, want one line saying the fake runs no program", code, e)
	}
}

// TestHintsNameWhatHelps: each error's hint names what helps for that
// error; managoat doctor only for what this host cannot isolate. A platform
// that does not answer names MANAGOAT_URL and serve; a registry that does
// not answer names the image and the registry; a missing image names
// image ls, not ls.
func TestHintsNameWhatHelps(t *testing.T) {
	home := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"MANAGOAT_URL=http://127.0.0.1:1", "MANAGOAT_API_KEY=mgk_0000000000000000_x"}, []string{"ls"},
			"(unavailable transport); check that managoat serve runs at http://127.0.0.1:1 (MANAGOAT_URL), then try again"},
		{[]string{"MANAGOAT_URL=http://127.0.0.1:1", "MANAGOAT_RUNNER_TOKEN=x"}, []string{"--provider", "runner", "ls"},
			"(unavailable transport); check that managoat serve runs at http://127.0.0.1:1 (MANAGOAT_URL)"},
		{nil, []string{"image", "pull", "127.0.0.1:1/nothing"}, "(unavailable registry); check the image's name, and that this host reaches its registry"},
		{nil, []string{"image", "rm", "nosuch"}, "(not_found); managoat image ls lists the images here"},
	} {
		_, e, code := runBinary(t, nil, append(append([]string{}, home...), tc.env...), tc.args...)
		if code != exitCouldNotRun || strings.Count(e, "\n") != 1 || !strings.Contains(e, tc.want) || strings.Contains(e, "doctor") {
			t.Errorf("%v: exit %d stderr %q, want one line with %q and no doctor", tc.args, code, e, tc.want)
		}
	}
}

// TestCreateMakesItsWorkingDir: the README's create -w /home/sprite/app
// makes the directory, owned by the sandbox's user, so that later execs
// start there (they failed with "not a directory"); run -w does the same; a
// directory the sandbox's user cannot make refuses the create, naming it,
// and leaves no sandbox.
func TestCreateMakesItsWorkingDir(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--label", "team=a", "-e", "LANG=C.UTF-8", "-w", "/home/sprite/app", "box1"); code != 0 {
		t.Fatalf("create -w /home/sprite/app: exit %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "box1") })
	if out, e, code := managoatEnv(t, env, "exec", "box1", "--", "sh", "-c", "pwd; stat -c %U .; touch mine"); code != 0 || out != "/home/sprite/app\nsprite\n" {
		t.Errorf("exec in box1: exit %d stdout %q stderr %q, want it in its own /home/sprite/app", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "run", "-w", "/home/sprite/new/deep", "--", "pwd"); code != 0 || out != "/home/sprite/new/deep\n" {
		t.Errorf("run -w /home/sprite/new/deep: exit %d stdout %q stderr %q", code, out, e)
	}
	_, e, code := managoatEnv(t, env, "create", "-w", "/etc/managoat-nope", "box2")
	if code != exitCouldNotRun || strings.Count(e, "\n") != 1 || !strings.Contains(e, "working directory /etc/managoat-nope cannot be made") || !strings.Contains(e, "(invalid dir); give -w") {
		t.Errorf("create -w /etc/managoat-nope: exit %d stderr %q, want one line refusing it", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls"); strings.Contains(out, "box2") {
		t.Errorf("a refused create left its sandbox: %q", out)
	}
}

// TestSurfacesAgree: a multi-line command is one row of the sessions
// table (escaped, as is an escape sequence, which never reaches the
// terminal raw); ls -q prints the names alone; bash completion completes a
// sandbox's name for the commands that take one (not after --, nor for
// create, whose name is new).
func TestSurfacesAgree(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, n := range []string{"alpha", "beta"} {
		if _, e, code := managoatEnv(t, env, "create", n); code != 0 {
			t.Fatalf("create %s: %s", n, e)
		}
		t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", n) })
	}
	if _, e, code := managoatEnv(t, env, "exec", "alpha", "--", "sh", "-c", "echo one\necho two\n: \x1b[2J"); code != 0 {
		t.Fatalf("exec of a multi-line command: %s", e)
	}
	out, e, code := managoatEnv(t, env, "sessions", "alpha")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if code != 0 || len(lines) != 2 || !strings.HasSuffix(lines[1], `sh -c echo one\necho two\n: \x1b[2J`) || strings.Contains(out, "\x1b") {
		t.Errorf("sessions after a multi-line command: exit %d stderr %q, want a header and one escaped row:\n%s", code, e, out)
	}
	if out, _, _ := managoatEnv(t, env, "sessions", "-o", "json", "alpha"); !strings.Contains(out, `"command":"sh -c echo one\necho two\n: \u001b[2J"`) {
		t.Errorf("sessions -o json keeps the command whole: %s", out)
	}
	if out, e, code := managoatEnv(t, env, "ls", "-q"); code != 0 || out != "alpha\nbeta\n" {
		t.Errorf("ls -q: exit %d %q %s", code, out, e)
	}
	bash, err := exec.LookPath("bash")
	testenv.Require(t, err == nil, "bash runs the completion script")
	script, _, _ := managoatEnv(t, nil, "completion", "bash")
	complete := func(words ...string) string {
		t.Helper()
		c := exec.Command(bash, append([]string{"-c", script + "\nCOMP_WORDS=(\"$0\" \"$@\"); COMP_CWORD=$#; _managoat; echo \"${COMPREPLY[@]}\"", binary}, words...)...)
		c.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), env...)
		out, err := c.Output()
		if err != nil {
			t.Fatalf("completion of %v: %v", words, err)
		}
		return strings.TrimSpace(string(out))
	}
	for words, want := range map[string]string{
		"exec |":                "alpha beta",
		"exec a|":               "alpha",
		"rm alpha |":            "alpha beta",
		"--provider local rm |": "alpha beta",
		"checkpoint |":          "create ls restore alpha beta",
		"exec alpha -- |":       "",
		"create |":              "!alpha", // its flags, no existing name
		"rm --f|":               "--force",
		"exe|":                  "exec",
	} {
		// | is the cursor: the word it ends is the one completed.
		pre := strings.TrimSuffix(words, "|")
		w := strings.Fields(pre)
		if strings.HasSuffix(pre, " ") {
			w = append(w, "")
		}
		if got := complete(w...); got != want && !(strings.HasPrefix(want, "!") && got != "" && !strings.Contains(got, want[1:])) {
			t.Errorf("completion of %q: %q, want %q", words, got, want)
		}
	}
}

// TestPlatformSurfacesAgree: through the platform (MANAGOAT_URL and
// MANAGOAT_API_KEY), rm of several sandboxes destroys each (the key was
// read once and taken out of the environment, so the second name found it
// unset); checkpoint ls lists a sandbox's checkpoints, as it does on the
// local provider; a runner sandbox with no runner online says how to start
// one, not doctor.
func TestPlatformSurfacesAgree(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "me"); code != 0 {
		t.Fatalf("account create: %s", e)
	}
	key, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "me")
	if code != 0 {
		t.Fatalf("key create: %s", e)
	}
	startServe(t, base, addr)
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+strings.TrimSpace(key))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) { // serve is starting
		_, e, code := managoatEnv(t, as, "create", "a")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create a: %d %s", code, e)
		}
	}
	if _, e, code := managoatEnv(t, as, "create", "b"); code != 0 {
		t.Fatalf("create b: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, as, "rm", "-f", "a", "b") })
	if _, e, code := managoatEnv(t, as, "exec", "a", "--", "sh", "-c", "echo one > f"); code != 0 {
		t.Fatalf("exec: %s", e)
	}
	id, e, code := managoatEnv(t, as, "checkpoint", "create", "a")
	if code != 0 || !strings.HasPrefix(id, "cp-") {
		t.Fatalf("checkpoint create through the platform: exit %d %q %s", code, id, e)
	}
	if out, e, code := managoatEnv(t, as, "checkpoint", "ls", "a"); code != 0 || out != "CHECKPOINT\n"+id {
		t.Errorf("checkpoint ls through the platform: exit %d stdout %q stderr %q, want the id", code, out, e)
	}
	if out, e, code := managoatEnv(t, as, "checkpoint", "ls", "--json", "a"); code != 0 || out != `[{"id":"`+strings.TrimSpace(id)+`"}]`+"\n" {
		t.Errorf("checkpoint ls --json through the platform: exit %d %q %s", code, out, e)
	}
	_, e, code = managoatEnv(t, as, "--provider", "platform:runner", "create", "r")
	if code != exitCouldNotRun || !strings.Contains(e, "no_runner_online") || !strings.Contains(e, "start a runner for this account") || strings.Contains(e, "doctor") {
		t.Errorf("a runner sandbox with no runner: exit %d %q, want how to start one", code, e)
	}
	// serve admin deletes an account: not while it holds sandboxes (named),
	// and then with its keys and its runners' enrolments.
	if _, e, code := managoatEnv(t, base, "enroll", "--account", "me", "mine"); code != 0 {
		t.Fatalf("enroll --account me: %s", e)
	}
	if _, e, code := managoatEnv(t, base, "enroll", "--account", "other", "theirs"); code != 0 {
		t.Fatalf("enroll --account other: %s", e)
	}
	_, e, code = managoatEnv(t, base, "serve", "admin", "account", "delete", "me")
	if code != exitCouldNotRun || !strings.Contains(e, `account "me" holds sandboxes (a, b): destroy them first`) || !strings.Contains(e, "(invalid account_in_use)") {
		t.Errorf("account delete with sandboxes: exit %d %q, want refused naming them", code, e)
	}
	if out, e, code := managoatEnv(t, as, "rm", "a", "b"); code != 0 || out != "" || e != "" {
		t.Fatalf("rm a b through the platform: exit %d stdout %q stderr %q", code, out, e)
	}
	if out, e, code := managoatEnv(t, as, "ls", "-q"); code != 0 || out != "" {
		t.Errorf("ls after rm a b: exit %d %q %s", code, out, e)
	}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "delete", "me"); code != 0 || !strings.Contains(e, "account me") || !strings.Contains(e, "enrolments revoked: 1 [mine]") {
		t.Fatalf("account delete: exit %d %s", code, e)
	}
	if out, _, _ := managoatEnv(t, base, "serve", "admin", "account", "ls"); strings.Contains(out, "me ") {
		t.Errorf("account ls after the delete: %s", out)
	}
	if _, e, code := managoatEnv(t, as, "ls"); code == 0 || !strings.Contains(e, "denied") {
		t.Errorf("the deleted account's key: exit %d %s, want denied", code, e)
	}
	runners, err := os.ReadFile(filepath.Join(strings.TrimPrefix(base[0], "MANAGOAT_HOME="), "platform", "runners.json"))
	if err != nil || strings.Contains(string(runners), `"mine"`) || !strings.Contains(string(runners), `"theirs"`) {
		t.Errorf("the runners' file after the delete (want mine gone, theirs kept): %v %s", err, runners)
	}
}
