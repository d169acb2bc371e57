package main

import (
	"archive/tar"
	"debug/buildinfo"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
)

// TestExitCodesAsUsersKnowThem: 127 for a command that is not there, 126
// for one that cannot be run, 124 when --timeout ended it, 137 with a line
// saying "out of memory" when the memory limit killed it, 125 when
// managoat itself failed; each error is one line naming the taxonomy kind
// and what to do next, with no prefix twice.
func TestExitCodesAsUsersKnowThem(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--", "no-such-command"}, 127, "(invalid could_not_run); check the command's name"},
		{[]string{"run", "--", "/etc/passwd"}, 126, "permission denied (invalid could_not_run); make it executable"},
		{[]string{"run", "--timeout", "300ms", "--", "sleep", "5"}, 124, "(unavailable exec_timeout); give it a longer --timeout"},
		{[]string{"exec", "nope", "--", "true"}, 125, `sandbox "nope": not found (not_found); managoat ls lists`},
		{[]string{"--provider", "bogus", "ls"}, 125, "(invalid provider); pick one with --provider or MANAGOAT_PROVIDER"},
	} {
		out, e, code := managoatEnv(t, env, tc.args...)
		if code != tc.code || out != "" || strings.Count(e, "\n") != 1 || !strings.Contains(e, tc.want) {
			t.Errorf("%v: exit %d stdout %q stderr %q, want %d and one line with %q", tc.args, code, out, e, tc.code, tc.want)
		}
		if regexp.MustCompile(`sandbox: |mechanism: |managoat \w+: \w+: \w+: `).MatchString(e) {
			t.Errorf("%v: a prefix repeats in %q", tc.args, e)
		}
	}
	// The memory limit kills: the real 137, and the line says why, on the
	// direct path (run) and through a sandbox's supervisor (exec).
	// tail(1) keeps the last line of what it reads: /dev/zero has no end of
	// line, so it holds all it reads.
	_, e, code := managoatEnv(t, env, "run", "--memory", "32M", "--", "tail", "/dev/zero")
	if code != 137 || !strings.Contains(e, "managoat: out of memory") {
		t.Errorf("run --memory 32M of a hog: exit %d stderr %q", code, e)
	}
	if _, e, code := managoatEnv(t, env, "create", "--memory", "32M", "oom"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "oom") })
	_, e, code = managoatEnv(t, env, "exec", "oom", "--", "tail", "/dev/zero")
	if code != 137 || !strings.Contains(e, "managoat: out of memory") {
		t.Errorf("exec of a hog under --memory 32M: exit %d stderr %q", code, e)
	}
}

// TestEnvironmentFlags: -e, --env-file (docker's format), -w and -u on
// run, as the sandbox's defaults on create, and overridden per exec and
// spawn; a -u the sandbox cannot honour is refused, never dropped.
func TestEnvironmentFlags(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir(), "HOSTV=from-managoat"}
	file := filepath.Join(t.TempDir(), "env")
	if err := os.WriteFile(file, []byte("# a comment\nFROMFILE=1\nA=file\n\nHOSTV\nQ=\"kept as is\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, e, code := managoatEnv(t, env, "run", "--env-file", file, "-e", "A=flag", "-w", "/tmp", "-u", "sprite", "--",
		"sh", "-c", `echo "$FROMFILE $A $HOSTV $Q"; pwd; id -un`)
	if code != 0 || out != "1 flag from-managoat \"kept as is\"\n/tmp\nsprite\n" {
		t.Fatalf("run -e/--env-file/-w/-u: exit %d stdout %q stderr %q", code, out, e)
	}
	if _, e, code := managoatEnv(t, env, "create", "-e", "D=default", "--dir", "/tmp", "defaults"); code != 0 {
		t.Fatalf("create -e -w: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "defaults") })
	if out, e, code := managoatEnv(t, env, "exec", "defaults", "--", "sh", "-c", "echo $D; pwd"); code != 0 || out != "default\n/tmp\n" {
		t.Errorf("exec with the sandbox's defaults: exit %d stdout %q stderr %q", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "exec", "-e", "D=mine", "-w", "/", "defaults", "--", "sh", "-c", "echo $D; pwd"); code != 0 || out != "mine\n/\n" {
		t.Errorf("exec -e -w over the defaults: exit %d stdout %q stderr %q", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "spawn", "--env", "D=spawned", "-w", "/", "defaults", "--", "sh", "-c", "echo $D; pwd"); code != 0 || out != "spawned\n/\n" {
		t.Errorf("spawn --env -w: exit %d stdout %q stderr %q", code, out, e)
	}
	if _, e, code := managoatEnv(t, env, "exec", "-u", "root", "defaults", "--", "id"); code != exitCouldNotRun || !strings.Contains(e, "(invalid user)") {
		t.Errorf("exec -u root: exit %d stderr %q, want %d and invalid user", code, e, exitCouldNotRun)
	}
	if _, e, code := managoatEnv(t, env, "run", "-e", "=x", "--", "true"); code != exitUsage {
		t.Errorf("run -e =x: exit %d stderr %q", code, e)
	}
}

// TestSafety: create with options that differ from the existing sandbox's
// is refused naming the difference (the same options, or none, adopt it);
// rm of a sandbox with a running session needs -f; version prints the VCS
// revision; completion prints a script for each shell naming every
// command; MANAGOAT_PROVIDER is the default provider.
func TestSafety(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--memory", "100M", "safe"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "safe") })
	_, e, code := managoatEnv(t, env, "create", "--memory", "200M", "--pids", "7", "safe")
	if code != exitCouldNotRun || !strings.Contains(e, "(already_exists)") || !strings.Contains(e, "memory bytes 209715200 asked, the existing one has 104857600") ||
		!strings.Contains(e, "pids 7 asked") {
		t.Errorf("create with another --memory: exit %d stderr %q", code, e)
	}
	for _, args := range [][]string{{"create", "safe"}, {"create", "--memory", "100M", "safe"}} {
		if out, e, code := managoatEnv(t, env, args...); code != 0 || out != "safe\n" {
			t.Errorf("%v: exit %d stdout %q stderr %q", args, code, out, e)
		}
	}
	id, e, code := managoatEnv(t, env, "spawn", "--detach", "safe", "--", "sleep", "100")
	if code != 0 {
		t.Fatalf("spawn: %s", e)
	}
	_, e, code = managoatEnv(t, env, "rm", "safe")
	if code != exitCouldNotRun || !strings.Contains(e, "running sessions ("+strings.TrimSpace(id)+")") || !strings.Contains(e, "rm -f") {
		t.Errorf("rm with a running session: exit %d stderr %q", code, e)
	}
	if _, e, code := managoatEnv(t, env, "rm", "-f", "safe"); code != 0 {
		t.Errorf("rm -f: exit %d stderr %q", code, e)
	}
	if out, _, _ := managoatEnv(t, env, "ls"); strings.Contains(out, "safe") {
		t.Errorf("ls after rm -f: %q", out)
	}

	out, _, code := managoatEnv(t, nil, "version")
	if code != 0 || !strings.HasPrefix(out, "managoat ") {
		t.Errorf("version: exit %d %q", code, out)
	}
	// version says the revision the binary's build info holds (a build
	// in a git checkout stamps it).
	bi, err := buildinfo.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	rev := ""
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			rev = s.Value
		}
	}
	if rev != "" && !strings.Contains(out, "(revision "+rev[:12]) {
		t.Errorf("version %q does not name the revision %s", out, rev)
	}
	if rev == "" && strings.Contains(out, "revision") {
		t.Errorf("version %q names a revision the build info does not hold", out)
	}
	if bi.Main.Version != "" && !strings.Contains(out, bi.Main.Version) {
		t.Errorf("version %q does not name the module version %s", out, bi.Main.Version)
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, e, code := managoatEnv(t, nil, "completion", sh)
		if code != 0 {
			t.Fatalf("completion %s: %s", sh, e)
		}
		for _, c := range commands {
			if !strings.Contains(out, " "+c.name) {
				t.Errorf("completion %s does not name %s", sh, c.name)
			}
		}
	}
	if bash, err := exec.LookPath("bash"); err == nil {
		script, _, _ := managoatEnv(t, nil, "completion", "bash")
		c := exec.Command(bash, "-c", script+"\nCOMP_WORDS=(managoat exe); COMP_CWORD=1; _managoat; echo \"${COMPREPLY[@]}\"\n"+
			"COMP_WORDS=(managoat rm --f); COMP_CWORD=2; _managoat; echo \"${COMPREPLY[@]}\"")
		if out, err := c.Output(); err != nil || string(out) != "exec\n--force\n" {
			t.Errorf("bash completion: %v %q", err, out)
		}
	}
	if _, e, code := managoatEnv(t, nil, "completion", "tcsh"); code != exitUsage {
		t.Errorf("completion tcsh: exit %d %s", code, e)
	}
	// MANAGOAT_PROVIDER: the fake has no sandbox nope; --provider still wins.
	if _, e, code := managoatEnv(t, append(env, "MANAGOAT_PROVIDER=fake"), "exec", "nope", "--", "emit"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Errorf("MANAGOAT_PROVIDER=fake exec nope: exit %d %s", code, e)
	}
	if _, e, code := managoatEnv(t, append(env, "MANAGOAT_PROVIDER=nosuch"), "ls"); !strings.Contains(e, `unknown provider "nosuch"`) {
		t.Errorf("MANAGOAT_PROVIDER=nosuch ls: exit %d %s", code, e)
	}
	if _, e, code := managoatEnv(t, append(env, "MANAGOAT_PROVIDER=nosuch"), "--provider", "fake", "ls"); code != 0 {
		t.Errorf("MANAGOAT_PROVIDER=nosuch --provider fake ls: exit %d %s", code, e)
	}
	// The configuration file's provider is the default under the
	// variable's.
	conf := filepath.Join(t.TempDir(), "config")
	if err := os.WriteFile(conf, []byte("# defaults\nprovider = fake\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cenv := append(env, "MANAGOAT_CONFIG="+conf)
	if _, e, code := managoatEnv(t, cenv, "exec", "nope", "--", "emit"); code != exitCouldNotRun || !strings.Contains(e, "not_found") {
		t.Errorf("provider = fake in the config file, exec nope: exit %d %s", code, e)
	}
	if _, e, _ := managoatEnv(t, append(cenv, "MANAGOAT_PROVIDER=nosuch"), "ls"); !strings.Contains(e, `unknown provider "nosuch"`) {
		t.Errorf("MANAGOAT_PROVIDER over the config file: %s", e)
	}
}

// TestLogsAndSessions: sessions shows each session's state, exit code and
// start, newest last (and as JSON with snake_case keys); logs prints a
// session's output (the newest's without SESSION), its last lines with
// --tail, every session since T with --since, and tails with --follow;
// the journals' size bound prunes the oldest finished session, whose
// attach says it was pruned.
func TestLogsAndSessions(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "--journal-max-size", "300K", "logbox"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "logbox") })
	for i, args := range [][]string{
		{"exec", "logbox", "--", "sh", "-c", "head -c 200000 /dev/zero; exit 3"},
		{"exec", "logbox", "--", "head", "-c", "200000", "/dev/zero"},
		{"exec", "logbox", "--", "sh", "-c", "for i in 1 2 3 4 5; do echo line $i; done"},
	} {
		if _, e, code := managoatEnv(t, env, args...); code != []int{3, 0, 0}[i] {
			t.Fatalf("%v: exit %d %s", args, code, e)
		}
	}
	id, e, code := managoatEnv(t, env, "spawn", "--detach", "logbox", "--", "sh", "-c", "echo first; sleep 1; echo second")
	if code != 0 || strings.TrimSpace(id) != "s4" {
		t.Fatalf("spawn: %q %s", id, e)
	}
	out, e, code := managoatEnv(t, env, "sessions", "logbox")
	if code != 0 || !regexp.MustCompile(`(?s)^SESSION\s+STATE\s+EXIT\s+STARTED\s+COMMAND\n`+
		`s1\s+exited\s+3\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+sh -c head.*\n`+
		`s2\s+exited\s+0\s.*\n`+
		`s3\s+exited\s+0\s.*\n`+
		`s4\s+running\s+-\s.*echo second\n$`).MatchString(out) {
		t.Errorf("sessions: exit %d stderr %q:\n%s", code, e, out)
	}
	out, _, _ = managoatEnv(t, env, "sessions", "-o", "json", "logbox")
	if !strings.Contains(out, `{"id":"s1","state":"exited","exit_code":3,"created_at":"`) {
		t.Errorf("sessions -o json: %s", out)
	}
	// s1 and s2 held 400 KB together: the oldest went.
	_, e, code = managoatEnv(t, env, "attach", "logbox", "s1")
	if code != exitCouldNotRun || !strings.Contains(e, "pruned by the sandbox's journal retention") || !strings.Contains(e, "not_found") {
		t.Errorf("attach of a pruned session: exit %d %q", code, e)
	}
	if out, _, code := managoatEnv(t, env, "logs", "logbox", "s2"); code != 0 || len(out) != 200000 {
		t.Errorf("logs s2: exit %d, %d bytes", code, len(out))
	}
	if out, e, code := managoatEnv(t, env, "logs", "--tail", "2", "logbox", "s3"); code != 0 || out != "line 4\nline 5\n" {
		t.Errorf("logs --tail 2: exit %d %q %s", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "logs", "-f", "logbox"); code != 0 || out != "first\nsecond\n" {
		t.Errorf("logs -f of the newest: exit %d %q %s", code, out, e)
	}
	if out, e, code := managoatEnv(t, env, "logs", "--since", "1h", "--tail", "1", "logbox"); code != 0 ||
		!strings.HasSuffix(out, "==> s3 <==\nline 5\n\n==> s4 <==\nsecond\n") || !strings.Contains(e, `session "s1"`) || !strings.Contains(e, "pruned") {
		t.Errorf("logs --since 1h: exit %d %q %s", code, out, e)
	}
	if _, e, code := managoatEnv(t, env, "logs", "--since", "2999-01-01T00:00:00Z", "logbox"); code != exitCouldNotRun || !strings.Contains(e, "no session") {
		t.Errorf("logs --since the future: exit %d %s", code, e)
	}
}

// TestCpTrees: cp copies a directory in and out with modes, links and
// modification times kept (an uploaded run.sh stays executable), renames
// onto a path that is not a directory, reaches paths outside the home the
// sandbox's user may write or read, and takes - for a tar stream on stdin
// or stdout; what the user may not read is denied, one line.
func TestCpTrees(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	src := filepath.Join(t.TempDir(), "src")
	for _, d := range []string{src, src + "/sub"} {
		if err := os.Mkdir(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(src+"/run.sh", []byte("#!/bin/sh\necho ran\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(src+"/sub/secret", []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("run.sh", src+"/link"); err != nil {
		t.Fatal(err)
	}
	if _, e, code := managoatEnv(t, env, "create", "cpbox"); code != 0 {
		t.Fatalf("create: %s", e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "cpbox") })
	mg := func(args ...string) string {
		t.Helper()
		out, e, code := managoatEnv(t, env, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, e)
		}
		return out
	}
	mg("cp", src, "cpbox:/tmp/tree") // /tmp/tree does not exist: the copy is it
	mg("cp", src+"/run.sh", "cpbox:")
	out := mg("exec", "cpbox", "--", "sh", "-c", "/tmp/tree/run.sh && ./run.sh && stat -c '%n %a' /tmp/tree /tmp/tree/sub /tmp/tree/sub/secret && readlink /tmp/tree/link")
	if out != "ran\nran\n/tmp/tree 750\n/tmp/tree/sub 750\n/tmp/tree/sub/secret 600\nrun.sh\n" {
		t.Errorf("in the sandbox after cp:\n%s", out)
	}
	back := t.TempDir()
	mg("cp", "cpbox:/tmp/tree", back) // an existing directory: into it
	mg("cp", "cpbox:/etc/hostname", back+"/hostname")
	for p, want := range map[string]fs.FileMode{"tree": fs.ModeDir | 0o750, "tree/run.sh": 0o755, "tree/sub/secret": 0o600, "hostname": 0o644} {
		st, err := os.Lstat(filepath.Join(back, p))
		if err != nil || st.Mode() != want {
			t.Errorf("%s on the host: %v %v, want %v", p, err, st, want)
		}
	}
	if l, err := os.Readlink(back + "/tree/link"); err != nil || l != "run.sh" {
		t.Errorf("link on the host: %q %v", l, err)
	}
	// - is a tar stream: out to stdout, and back in from stdin.
	stream := mg("cp", "cpbox:/tmp/tree", "-")
	names := []string{}
	tr := tar.NewReader(strings.NewReader(stream))
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		names = append(names, h.Name)
	}
	if !slices.Contains(names, "tree/sub/secret") || !slices.Contains(names, "tree/run.sh") {
		t.Errorf("cp NAME:DIR - wrote a tar of %v", names)
	}
	mg("exec", "cpbox", "--", "mkdir", "/tmp/again")
	if _, e, code := runBinary(t, strings.NewReader(stream), env, "cp", "-", "cpbox:/tmp/again"); code != 0 {
		t.Fatalf("cp - NAME:DIR: %s", e)
	}
	if out := mg("exec", "cpbox", "--", "stat", "-c", "%a", "/tmp/again/tree/run.sh"); out != "755\n" {
		t.Errorf("after cp -: %q", out)
	}
	if _, e, code := managoatEnv(t, env, "cp", "cpbox:/root", back+"/r"); code != exitCouldNotRun || !strings.Contains(e, "Permission denied (denied)") || strings.Count(e, "\n") != 1 {
		t.Errorf("cp of /root: exit %d %q", code, e)
	}
	if _, e, code := managoatEnv(t, env, "cp", "cpbox:/nonexistent", back+"/n"); code != exitCouldNotRun || !strings.Contains(e, "(not_found)") {
		t.Errorf("cp of /nonexistent: exit %d %q", code, e)
	}
}

// TestCheckpoints: checkpoint create prints an id, ls lists it (and as
// JSON), restore rolls the home back to it; an unknown id is not_found
// with what to do next.
func TestCheckpoints(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	mg := func(args ...string) string {
		t.Helper()
		out, e, code := managoatEnv(t, env, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d %s", args, code, e)
		}
		return out
	}
	mg("create", "ckbox")
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "ckbox") })
	mg("exec", "ckbox", "--", "sh", "-c", "echo one > f")
	id := strings.TrimSpace(mg("checkpoint", "create", "--comment", "before", "ckbox"))
	if !strings.HasPrefix(id, "cp-") {
		t.Fatalf("checkpoint create printed %q", id)
	}
	mg("exec", "ckbox", "--", "sh", "-c", "echo two > f; echo new > g")
	if out := mg("checkpoint", "ls", "ckbox"); out != "CHECKPOINT\n"+id+"\n" {
		t.Errorf("checkpoint ls: %q", out)
	}
	if out := mg("checkpoint", "ls", "--json", "ckbox"); out != `[{"id":"`+id+`"}]`+"\n" {
		t.Errorf("checkpoint ls --json: %q", out)
	}
	mg("checkpoint", "restore", "ckbox", id)
	if out := mg("exec", "ckbox", "--", "sh", "-c", "cat f; ls"); out != "one\nf\n" {
		t.Errorf("after restore: %q", out)
	}
	if _, e, code := managoatEnv(t, env, "checkpoint", "restore", "ckbox", "cp-nope"); code != exitCouldNotRun || !strings.Contains(e, "(not_found); managoat checkpoint ls") {
		t.Errorf("restore cp-nope: exit %d %q", code, e)
	}
	if _, e, code := managoatEnv(t, env, "checkpoint", "list", "ckbox"); code != exitUsage {
		t.Errorf("checkpoint list: exit %d %q", code, e)
	}
}

// snakeKeysOnly fails t when any object key in the JSON document is not
// snake_case.
func snakeKeysOnly(t *testing.T, what, doc string) {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(doc), &v); err != nil {
		t.Errorf("%s: not JSON (%v): %q", what, err, doc)
		return
	}
	key := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	var walk func(any)
	walk = func(x any) {
		switch x := x.(type) {
		case map[string]any:
			for k, e := range x {
				if !key.MatchString(k) {
					t.Errorf("%s: key %q is not snake_case", what, k)
				}
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
}

// TestMachineOutput: every command that prints data prints JSON with
// --json and with -o json, all keys snake_case; ls -o wide shows provider,
// mechanism, limits, creation time and labels; labels given at create are
// what ls --filter label=k=v (or label=k) selects by.
func TestMachineOutput(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	for _, args := range [][]string{{"create", "--label", "team=a", "--label", "tier=gold", "--memory", "64M", "m1"}, {"create", "--label", "team=b", "m2"}} {
		if _, e, code := managoatEnv(t, env, args...); code != 0 {
			t.Fatalf("%v: %s", args, e)
		}
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "m1", "m2") })
	if _, e, code := managoatEnv(t, env, "exec", "m1", "--", "true"); code != 0 {
		t.Fatal(e)
	}
	for _, args := range [][]string{
		{"ls"}, {"sessions", "m1"}, {"create", "m1"}, {"spawn", "--detach", "m1", "--", "true"}, {"version"}, {"doctor"},
		{"checkpoint", "create", "m1"}, {"checkpoint", "ls", "m1"},
	} {
		for _, flag := range [][]string{{"--json"}, {"-o", "json"}} {
			a := append(append([]string{args[0]}, flag...), args[1:]...)
			out, e, code := managoatEnv(t, env, a...)
			if code != 0 {
				t.Errorf("%v: exit %d %s", a, code, e)
				continue
			}
			snakeKeysOnly(t, strings.Join(a, " "), out)
		}
	}
	out, _, _ := managoatEnv(t, env, "ls", "-o", "wide")
	if !regexp.MustCompile(`(?m)^NAME\s+STATUS\s+STATE\s+MEMORY\s+PIDS\s+CPU\s+DISK\s+TIMEOUT\s+PROVIDER\s+MECHANISM\s+CREATED\s+LABELS\s+ALLOW$`).MatchString(out) ||
		!regexp.MustCompile(`(?m)^m1\s+running\s+-\s+64M\s+\d+\s+-\s+\S+\s+-\s+local\s+jail\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+team=a,tier=gold\s+-$`).MatchString(out) {
		t.Errorf("ls -o wide:\n%s", out)
	}
	for filter, want := range map[string]string{"label=team=a": "m1", "label=team=b": "m2", "label=tier": "m1", "label=team=c": ""} {
		out, e, code := managoatEnv(t, env, "ls", "--filter", filter, "-o", "json")
		var rows []struct {
			Name string `json:"name"`
		}
		if code != 0 || json.Unmarshal([]byte(out), &rows) != nil {
			t.Errorf("ls --filter %s: exit %d %q %s", filter, code, out, e)
			continue
		}
		var names []string
		for _, r := range rows {
			names = append(names, r.Name)
		}
		if strings.Join(names, ",") != want {
			t.Errorf("ls --filter %s: %v, want %s", filter, names, want)
		}
	}
	if out, _, _ := managoatEnv(t, env, "ls", "--filter", "label=team", "--filter", "label=tier=gold"); !strings.Contains(out, "m1") || strings.Contains(out, "m2") {
		t.Errorf("two filters: %s", out)
	}
	if _, e, code := managoatEnv(t, env, "ls", "--filter", "name=m1"); code != exitUsage {
		t.Errorf("ls --filter name=m1: exit %d %s", code, e)
	}
	if _, e, code := managoatEnv(t, env, "--provider", "fake", "create", "--label", "a=b", "x"); code != exitCouldNotRun || !strings.Contains(e, "(invalid labels)") {
		t.Errorf("--label on the fake: exit %d %s", code, e)
	}
}
