package main

import (
	"bytes"
	"fmt"
	"github.com/managoat/managoat/internal/testenv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
)

var binary string

func TestMain(m *testing.M) {
	// The test binary doubles as managoat, so re-exec hooks (supervisors,
	// jail init) work when the tests start it.
	if os.Getenv("MANAGOAT_TEST_MAIN") == "1" {
		main()
		return
	}
	testenv.Enclose()
	dir, err := os.MkdirTemp("", "managoat-cli")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "managoat")
	out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", binary, ".").CombinedOutput()
	if err != nil {
		panic(string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func managoat(t *testing.T, stdin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runBinary(t, strings.NewReader(stdin), []string{"MANAGOAT_HOME=" + t.TempDir()}, args...)
}

// runBinary runs the managoat binary with stdin (nil: none) and extra
// environment, and returns its output and exit code.
func runBinary(t *testing.T, stdin io.Reader, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	// No configuration file of the user's changes a test's defaults (a
	// test's own MANAGOAT_CONFIG in env comes later and wins).
	cmd.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), env...)
	cmd.Stdin = stdin
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), 0
}

func TestRunPassesExitCodeAndOutput(t *testing.T) {
	out, errOut, code := managoat(t, "", "--provider", "fake", "run", "--", "emit", "out:hello", "err:oops", "exit:3")
	if out != "hello" || errOut != "oops" || code != 3 {
		t.Fatalf("run: stdout %q stderr %q code %d", out, errOut, code)
	}
}

func TestRunForwardsStdin(t *testing.T) {
	out, _, code := managoat(t, "ping", "--provider", "fake", "run", "--", "emit", "out:ready", "stay")
	if out != "readyecho:ping" || code != 0 {
		t.Fatalf("run: stdout %q code %d", out, code)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--provider", "fake", "run", "--memory", "lots", "--", "emit"},
		{"--provider", "fake", "run", "--cpu", "-1", "--", "emit"},
		{"--provider", "fake", "run", "--pids", "0", "--", "emit"},
		{"--provider", "fake", "run"},
		{"--provider", "fake", "create", "bad/name"},
		{"--provider", "fake", "run", "--memory", "NaN", "--", "emit"},
		{"--provider", "fake", "run", "--memory", "1", "--", "emit"},
		{"--provider", "fake", "run", "--cpu", "NaN", "--", "emit"},
		{"--provider", "fake", "run", "--cpu", "0.0001", "--", "emit"},
		{"--provider", "fake", "run", "--cpu", "99999999999m", "--", "emit"},
		{"--provider", "fake", "run", "--pids", "4194305", "--", "emit"},
		{"--bogus", "ls"},
		{"nosuchcommand"},
	} {
		_, errOut, code := managoat(t, "", args...)
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d (stderr %q)", args, code, exitUsage, errOut)
		}
	}
}

// managoat's own help lists every command; asked for, it goes to stdout;
// after a malformed invocation, to stderr.
func TestHelp(t *testing.T) {
	check := func(args []string, text string) {
		t.Helper()
		if !strings.Contains(text, "Usage: managoat [global flags] COMMAND") {
			t.Errorf("%v: no usage line in %q", args, text)
		}
		for _, c := range commands {
			if !strings.Contains(text, "\n  "+c.name+" ") {
				t.Errorf("%v: %s is not listed", args, c.name)
			}
		}
	}
	for _, arg := range []string{"--help", "-h", "help"} {
		out, errOut, code := managoat(t, "", arg)
		if code != 0 || errOut != "" {
			t.Errorf("%s: exit %d stderr %q", arg, code, errOut)
		}
		check([]string{arg}, out)
	}
	// No command at all: the help, on stderr.
	out, errOut, code := managoat(t, "")
	if code != exitUsage || out != "" {
		t.Errorf("no command: exit %d stdout %q", code, out)
	}
	check(nil, errOut)
	// A malformed invocation: the error and one line pointing at --help,
	// not the help (as git and kubectl).
	for args, want := range map[string]string{
		"--bogus ls":    "managoat: flag provided but not defined: -bogus\nRun 'managoat --help' for usage.\n",
		"nosuchcommand": "managoat: unknown command \"nosuchcommand\"\nRun 'managoat --help' for usage.\n",
	} {
		out, errOut, code := managoat(t, "", strings.Fields(args)...)
		if code != exitUsage || out != "" || errOut != want {
			t.Errorf("%v: exit %d stdout %q stderr %q, want %q", args, code, out, errOut, want)
		}
	}
}

// Commands on sandboxes that are not there, or on names that are bad,
// change nothing and say what is missing; run never takes a sandbox it did
// not make; run's --timeout ends its command.
func TestCommandsRefuseWhatIsNotTheirs(t *testing.T) {
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	mg := func(args ...string) (string, int) {
		t.Helper()
		_, errOut, code := runBinary(t, nil, env, append([]string{"--mechanism", "trusted"}, args...)...)
		// A sandbox made on trusted is said, once, to be isolated by nothing.
		if note, rest, _ := strings.Cut(errOut, "\n"); strings.HasPrefix(note, "managoat: note: --mechanism trusted isolates nothing: the sandbox's commands run as ") {
			return rest, code
		}
		return errOut, code
	}
	if _, e, code := runBinary(t, nil, env, "--mechanism", "trusted", "create", "tb"); code != 0 || strings.Count(e, "\n") != 1 ||
		!strings.HasPrefix(e, "managoat: note: --mechanism trusted isolates nothing") {
		t.Fatalf("create on trusted: exit %d stderr %q, want one note that nothing isolates it", code, e)
	}
	t.Cleanup(func() { mg("rm", "tb") })
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--name", "tb", "--", "true"}, exitCouldNotRun, "already_exists"},
		{[]string{"rm", "a/b", "tb"}, exitUsage, "invalid name"},
		{[]string{"rm", "nope"}, exitCouldNotRun, `"nope"`},
		{[]string{"terminate", "nope", "s1"}, exitCouldNotRun, `"nope"`},
		{[]string{"terminate", "tb", "s99"}, exitCouldNotRun, `"s99"`},
		{[]string{"policy", "nope", "--allow", ""}, exitCouldNotRun, `"nope"`},
		{[]string{"cp", "nope:/home/sprite/f", t.TempDir() + "/f"}, exitCouldNotRun, `"nope"`},
		{[]string{"run", "--timeout", "300ms", "--", "sh", "-c", "sleep 20"}, exitTimeout, "exec_timeout"},
	} {
		errOut, code := mg(c.args...)
		if code != c.code || !strings.Contains(errOut, c.want) || strings.Count(errOut, "\n") != 1 {
			t.Errorf("%v: exit %d stderr %q, want exit %d and one line with %s", c.args, code, errOut, c.code, c.want)
		}
	}
	if e, code := mg("exec", "tb", "--", "true"); code != 0 {
		t.Fatalf("tb did not survive: exit %d %s", code, e)
	}

	// attach --no-stdin watches: the end of its stdin (here at once) does
	// not close the session's, which another attach then feeds. With
	// --sig-proxy=false, Ctrl-C (SIGINT) detaches instead of going to the
	// command.
	started := func(args ...string) (*exec.Cmd, *syncBuffer, *syncBuffer) {
		c := exec.Command(binary, append([]string{"--mechanism", "trusted", args[0], "--sig-proxy=false"}, args[1:]...)...)
		c.Env = append(os.Environ(), env...)
		var o, e syncBuffer
		c.Stdout, c.Stderr = &o, &e
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 500 && !strings.Contains(o.String(), "ready"); i++ {
			exec.Command("true").Run() // a pause that is not a sleep
		}
		c.Process.Signal(os.Interrupt) // detach
		c.Wait()
		return c, &o, &e
	}
	// The session's stdin stays open past spawn's detach.
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pw.Close()
	sp := exec.Command(binary, "--mechanism", "trusted", "spawn", "--sig-proxy=false", "tb", "--", "sh", "-c", "echo ready; read l; echo got $l")
	sp.Env = append(os.Environ(), env...)
	sp.Stdin = pr
	var spOut, spErr syncBuffer
	sp.Stdout, sp.Stderr = &spOut, &spErr
	if err := sp.Start(); err != nil {
		t.Fatal(err)
	}
	pr.Close()
	for i := 0; i < 500 && !strings.Contains(spOut.String(), "ready"); i++ {
		exec.Command("true").Run()
	}
	sp.Process.Signal(os.Interrupt)
	sp.Wait()
	_, id, ok := strings.Cut(spErr.String(), "managoat attach tb ")
	id, _, _ = strings.Cut(id, ")")
	if !ok || id == "" {
		t.Fatalf("spawn did not say how to attach: %q", spErr.String())
	}
	if _, o, _ := started("attach", "--no-stdin", "tb", id); !strings.Contains(o.String(), "ready") {
		t.Fatalf("the watcher saw %q", o.String())
	}
	out, e, code := runBinary(t, strings.NewReader("x\n"), env, "--mechanism", "trusted", "attach", "tb", id)
	if code != 0 || !strings.Contains(out, "got x") {
		t.Fatalf("the session's stdin was closed by a watcher: exit %d out %q err %s", code, out, e)
	}
}

// syncBuffer is a bytes.Buffer for a child's output read while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestUnknownSandboxIsOneLineNamingIt(t *testing.T) {
	_, errOut, code := managoat(t, "", "--provider", "fake", "exec", "nope", "--", "emit")
	if code != exitCouldNotRun || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, `"nope"`) || !strings.Contains(errOut, "not_found") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

// A provider that cannot be built (an unknown mechanism) is the caller's
// to fix: the error's kind is invalid, not unknown.
func TestMisconfiguredProviderIsInvalid(t *testing.T) {
	_, errOut, code := managoat(t, "", "--mechanism", "nope", "ls")
	if code != exitCouldNotRun || !strings.Contains(errOut, "(invalid provider_config)") || !strings.Contains(errOut, "jail") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

func TestUnknownProviderListsKnown(t *testing.T) {
	_, errOut, code := managoat(t, "", "--provider", "modal", "ls")
	if code != exitCouldNotRun || !strings.Contains(errOut, "fake") {
		t.Fatalf("exit %d stderr %q", code, errOut)
	}
}

func TestParseSizeAndCPU(t *testing.T) {
	for in, want := range map[string]int64{"1024": 1024, "64K": 64 << 10, "512M": 512 << 20, "2G": 2 << 30, "1.5G": 3 << 29, "512MiB": 512 << 20} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "x", "-1M", "0", "NaN", "nan", "Inf"} {
		if _, err := parseSize(bad); err == nil {
			t.Errorf("parseSize(%q) accepted", bad)
		}
	}
	for _, bad := range []string{"", "x", "-1", "0", "NaN", "0.0001", "1025", "0m", "1024001m"} {
		if _, err := parseCPU(bad); err == nil {
			t.Errorf("parseCPU(%q) accepted", bad)
		}
	}
	for in, want := range map[string]int{"0.5": 500, "2": 2000, "250m": 250} {
		if got, err := parseCPU(in); err != nil || got != want {
			t.Errorf("parseCPU(%q) = %d, %v", in, got, err)
		}
	}
}

func TestParseN(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		n         int
		pos, rest string
		timeout   string
	}{
		{[]string{"box", "--", "echo", "-n", "x"}, 1, "box", "echo -n x", ""},
		{[]string{"--timeout", "5s", "box", "--", "echo"}, 1, "box", "echo", "5s"},
		{[]string{"box", "--timeout", "5s", "--", "echo", "--timeout"}, 1, "box", "echo --timeout", "5s"},
		{[]string{"box", "echo", "--timeout", "1s"}, 1, "box", "echo --timeout 1s", ""},
		{[]string{"a", "--timeout", "2s", "b"}, -1, "a b", "", "2s"},
	} {
		g := &globals{}
		fs := g.flagSet("t")
		timeout := fs.String("timeout", "", "")
		pos, rest, err := parseN(fs, tc.args, tc.n)
		if err != nil || strings.Join(pos, " ") != tc.pos || strings.Join(rest, " ") != tc.rest || *timeout != tc.timeout {
			t.Errorf("parseN(%q) = %q %q %q %v", tc.args, pos, rest, *timeout, err)
		}
	}
}
