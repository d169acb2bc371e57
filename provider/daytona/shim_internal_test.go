package daytona

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "''"},
		{"plain", "'plain'"},
		{"it's fine", `'it'\''s fine'`},
		{"''", `''\'''\'''`},
		{"a\nb", "'a\nb'"},
		{`$HOME "x" \n`, `'$HOME "x" \n'`},
	} {
		if got := quote(tc.in); got != tc.want {
			t.Errorf("quote(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		c    sandbox.Cmd
		env  []string
		dir  string
		want string
		bad  bool
	}{
		{c: sandbox.Cmd{Name: "bash", Args: []string{"-lc", "x"}}, want: `'bash' '-lc' 'x'`},
		{c: sandbox.Cmd{Name: "echo", Args: []string{"it's fine"}}, want: `'echo' 'it'\''s fine'`},
		{c: sandbox.Cmd{Name: "env"}, env: []string{"A=1", "B=x y"}, dir: "/tmp/a b", want: `cd '/tmp/a b' && A='1' B='x y' 'env'`},
		{c: sandbox.Cmd{Name: "env"}, env: []string{"A=it's"}, want: `A='it'\''s' 'env'`},
		{c: sandbox.Cmd{}, bad: true},
		{c: sandbox.Cmd{Name: "a\x00b"}, bad: true},
		{c: sandbox.Cmd{Name: "x"}, env: []string{"NOEQUALS"}, bad: true},
		{c: sandbox.Cmd{Name: "x"}, env: []string{"BAD-KEY=1"}, bad: true},
		{c: sandbox.Cmd{Name: "x"}, env: []string{"1A=1"}, bad: true},
		{c: sandbox.Cmd{Name: "x"}, dir: "a\x00", bad: true},
	} {
		got, err := commandLine(tc.c, tc.env, tc.dir)
		if tc.bad {
			var iv *sandbox.InvalidError
			if err == nil || !asInvalid(err, &iv) {
				t.Errorf("commandLine(%v, %q, %q) = %q, %v; want InvalidError", tc.c, tc.env, tc.dir, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("commandLine(%v, %q, %q) = %q, %v; want %q", tc.c, tc.env, tc.dir, got, err, tc.want)
		}
	}
}

func asInvalid(err error, iv **sandbox.InvalidError) bool {
	v, ok := err.(*sandbox.InvalidError)
	*iv = v
	return ok
}

// TestEnvelopeSurvivesDaemonParser checks that the envelope is one argv for
// Daytona's naive /process/execute parser and that a real sh, given that
// argv, runs the script with every byte intact.
func TestEnvelopeSurvivesDaemonParser(t *testing.T) {
	args := []string{"it's", "two words", "new\nline", "\xff\xfe raw", `"dq" \ $x`, ""}
	line, err := commandLine(sandbox.Cmd{Name: "printf", Args: append([]string{`%s|`}, args...)}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	wire, err := envelope(line, "managoat", base64Std("shown"))
	if err != nil {
		t.Fatal(err)
	}
	argv := naiveParse(wire)
	if len(argv) != 5 || argv[0] != "sh" || argv[1] != "-c" || argv[3] != "managoat" {
		t.Fatalf("daemon parse of the envelope = %q", argv)
	}
	if s, ok := unwrap(wire); !ok || s != line {
		t.Fatalf("unwrap = %q, %v", s, ok)
	}
	if got := displayCommand(wire); got != "shown" {
		t.Fatalf("displayCommand = %q", got)
	}
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Join(args, "|") + "|"; string(out) != want {
		t.Fatalf("process saw %q, want %q", out, want)
	}
}

// naiveParse is Daytona's /process/execute splitter, as documented in
// daytonatest.
func naiveParse(command string) []string {
	var args []string
	var cur strings.Builder
	var q rune
	for _, r := range command {
		switch {
		case r == '"' || r == '\'':
			switch q {
			case 0:
				q = r
			case r:
				q = 0
			default:
				cur.WriteRune(r)
			}
		case r == ' ' && q == 0:
			if cur.Len() > 0 {
				args = append(args, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		args = append(args, cur.String())
	}
	return args
}

func TestShimsAreLintFree(t *testing.T) {
	base := shimBase("", "managoat-1")
	for name, s := range map[string]string{
		"exec":       execScript(`'true'`, false),
		"spawn":      spawnScript(base, `'cat'`, true),
		"spawnPlain": spawnScript(base, `'true'`, false),
		"stdin":      stdinScript(base, []byte("x")),
		"close":      closeScript(base),
		"probe":      probeScript(base),
	} {
		// dash -n parses without running: a bashism or a quoting slip fails.
		if out, err := exec.Command("sh", "-n", "-c", s).CombinedOutput(); err != nil {
			t.Errorf("%s script does not parse under sh: %v\n%s\n%s", name, err, out, s)
		}
	}
	if !strings.Contains(spawnScript(base, `'cat'`, true), `tail -c +1 -f "$B.in"`) {
		t.Errorf("stdin shim lacks the tail-fed FIFO")
	}
	if strings.Contains(spawnScript(base, `'cat'`, false), "tail") {
		t.Errorf("plain shim uses tail")
	}
	if got := shimBase("/var/x/", "t"); got != "'/var/x/t'" {
		t.Errorf("shimBase = %s", got)
	}
}

// TestShimHonoursEarlyStdinAndClose runs the stdin shim for real after a
// write and a close that both came before it started: the write is read
// and the close is a real EOF.
func TestShimHonoursEarlyStdinAndClose(t *testing.T) {
	dir := t.TempDir()
	base := shimBase(dir, "managoat-early")
	for _, s := range []string{stdinScript(base, []byte("early\x00\xff")), closeScript(base)} {
		if out, err := exec.Command("sh", "-c", s).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	if out, err := exec.Command("sh", "-c", spawnScript(base, `'cat'`, true)).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("shim printed %q, %v (its output belongs in its files)", out, err)
	}
	if out, err := os.ReadFile(filepath.Join(dir, "managoat-early.out")); err != nil || string(out) != "early\x00\xff" {
		t.Fatalf("shim output %q, %v", out, err)
	}
	probe, err := exec.Command("sh", "-c", probeScript(base)).Output()
	if err != nil || string(probe) != "dead\n0\n" {
		t.Fatalf("probe after exit = %q, %v", probe, err)
	}
	exited, err := exec.Command("sh", "-c", stdinScript(base, []byte("late"))).Output()
	if err != nil || !strings.Contains(string(exited), markExited) {
		t.Fatalf("write after exit = %q, %v", exited, err)
	}
	// The plain shim records the status too.
	plainBase := shimBase(dir, "managoat-plain")
	if err := exec.Command("sh", "-c", spawnScript(plainBase, `'sh' '-c' 'exit 9'`, false)).Run(); err == nil {
		t.Fatal("plain shim hid the status")
	}
	probe, _ = exec.Command("sh", "-c", probeScript(plainBase)).Output()
	if string(probe) != "dead\n9\n" {
		t.Fatalf("plain probe = %q", probe)
	}
}

// TestPollNeverTakesAStartingShimForDead: a pid file caught empty (a shim
// of an earlier version writing it in place, between the truncation and
// the write) reads as not started, never as dead — a dead verdict ends the
// stream with closed_before_exit and deletes the session, whose process
// group the daemon then kills. The shim itself publishes its pid files by
// rename, so a reader sees them whole or not at all.
func TestPollNeverTakesAStartingShimForDead(t *testing.T) {
	dir := t.TempDir()
	base := shimBase(dir, "managoat-starting")
	pid := filepath.Join(dir, "managoat-starting.pid")
	state := func() (string, string) {
		t.Helper()
		probe, err := exec.Command("sh", "-c", probeScript(base)).Output()
		if err != nil {
			t.Fatal(err)
		}
		read, err := exec.Command("sh", "-c", readScript(base, [2]int{}, 16)).Output()
		if err != nil {
			t.Fatal(err)
		}
		s, _, _, _, err := parseRead(string(read))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(probe)), s
	}
	if p, r := state(); p != "nopid" || r != "nopid" {
		t.Fatalf("no pid file: probe %q, read %q; want nopid", p, r)
	}
	if err := os.WriteFile(pid, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, r := state(); p != "nopid" || r != "nopid" {
		t.Fatalf("empty pid file: probe %q, read %q; want nopid (a starting shim is not dead)", p, r)
	}
	if err := os.WriteFile(pid, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if p, r := state(); p != "alive" || r != "alive" {
		t.Fatalf("live pid: probe %q, read %q; want alive", p, r)
	}
	for _, f := range []string{".pid", ".hold", ".tailpid"} {
		if strings.Contains(spawnScript(base, `'cat'`, true), `>"$B`+f+`"`) {
			t.Errorf("the shim writes <base>%s in place; a poll could read it empty", f)
		}
	}
}

// TestCloseAfterExitKillsNothing: once the sentinel exists, CloseStdin
// kills no pid from the shim's files — the holder and the tail are gone,
// and their pids may belong to other processes by now (here, a live sleep
// stands for such a process).
func TestCloseAfterExitKillsNothing(t *testing.T) {
	dir := t.TempDir()
	base := shimBase(dir, "managoat-ended")
	bystander := exec.Command("sleep", "30")
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- bystander.Wait() }()
	t.Cleanup(func() {
		_ = bystander.Process.Kill()
		<-waited
	})
	p := []byte(strconv.Itoa(bystander.Process.Pid) + "\n")
	for name, b := range map[string][]byte{".hold": p, ".tailpid": p, ".code": []byte("0\n")} {
		if err := os.WriteFile(filepath.Join(dir, "managoat-ended"+name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("sh", "-c", closeScript(base)).CombinedOutput(); err != nil {
		t.Fatalf("close after exit: %v: %s", err, out)
	}
	select {
	case err := <-waited:
		waited <- err
		t.Fatalf("close after exit killed pid %d (%v)", bystander.Process.Pid, err)
	case <-time.After(200 * time.Millisecond):
	}
	// Before the exit, the close ends the holder.
	if err := os.Remove(filepath.Join(dir, "managoat-ended.code")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("sh", "-c", closeScript(base)).CombinedOutput(); err != nil {
		t.Fatalf("close: %v: %s", err, out)
	}
	select {
	case err := <-waited:
		waited <- err
	case <-time.After(10 * time.Second):
		t.Fatal("close before exit did not end the holder")
	}
}
