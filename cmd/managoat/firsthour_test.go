package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

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
