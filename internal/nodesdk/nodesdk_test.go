package nodesdk

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRunReports(t *testing.T) {
	sdk := Setup(t) // no packages: node alone
	t.Setenv("NODESDK_LEAK", "a developer's key")
	res := sdk.Run(t, "testdata/report.mjs", Options{Env: map[string]string{"NODESDK_TEST": "hello"}, Timeout: time.Minute})
	if res.ExitCode != 0 || !res.Done || res.TimedOut {
		t.Fatalf("exit %d done %v timed out %v\n%s", res.ExitCode, res.Done, res.TimedOut, res.Stderr)
	}
	var env struct {
		Seen   string
		Leaked *string
	}
	res.Call(t, "env").Value(t, &env)
	if env.Seen != "hello" || env.Leaked != nil {
		t.Errorf("env = %+v, want the given variable and not the test process's own", env)
	}
	var n int
	res.Call(t, "sibling").Value(t, &n)
	if n != 42 {
		t.Errorf("sibling = %d", n)
	}
	b, err := Bytes(res.Call(t, "bytes").Raw)
	if err != nil || string(b) != "\x00\x01\x02\xff" {
		t.Errorf("bytes = %q, %v", b, err)
	}
	if raw := string(res.Call(t, "mapped").Raw); raw != `{"id":7}` {
		t.Errorf("mapped = %s", raw)
	}
	res.Call(t, "throws").Threw(t, "NotFoundError")
	if m := res.Call(t, "throws").Error.Message; m != "no such thing" {
		t.Errorf("message = %q", m)
	}
	if raw := string(res.Call(t, "undefined").Raw); raw != "null" {
		t.Errorf("undefined = %s", raw)
	}
	if len(res.Calls) != 6 {
		t.Errorf("%d calls, want 6 (a console line is not a report): %+v", len(res.Calls), res.Calls)
	}
}

func TestRunExitCode(t *testing.T) {
	sdk := Setup(t)
	res := sdk.Run(t, "testdata/report.mjs", Options{Args: []string{"exit"}, Timeout: time.Minute})
	if res.ExitCode != 3 || res.Done {
		t.Fatalf("exit %d done %v, want 3 and not done", res.ExitCode, res.Done)
	}
}

func TestRunTimeoutKillsGroup(t *testing.T) {
	sdk := Setup(t)
	pidfile := filepath.Join(t.TempDir(), "pid")
	res := sdk.Run(t, "testdata/hang.mjs", Options{Env: map[string]string{"PIDFILE": pidfile}, Timeout: 3 * time.Second})
	if !res.TimedOut || res.ExitCode != -1 {
		t.Fatalf("timed out %v exit %d, want a timeout\n%s", res.TimedOut, res.ExitCode, res.Stderr)
	}
	res.Call(t, "started").Value(t, nil)
	b, err := os.ReadFile(pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(string(b))
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		// A killed child not yet reaped by its (dead) parent's reaper is a zombie.
		if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the script's child %d outlived the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestInstallRefusesUnpinned(t *testing.T) {
	rt := Runtime{Node: "/nonexistent", Npm: "/nonexistent", CacheDir: t.TempDir()}
	for _, p := range []string{"e2b", "e2b@^2.51.0", "e2b@latest", "e2b@2.51", "@scope/x@~1.0.0", "e2b@2.51.0 --registry=x", "../e2b@1.0.0"} {
		if _, err := rt.Install(context.Background(), p); err == nil || !strings.Contains(err.Error(), "exact version") {
			t.Errorf("Install(%q) = %v, want refused", p, err)
		}
	}
}

// fakeNpm is an npm that counts its installs and lays out what it was asked.
const fakeNpm = `#!/bin/sh
echo x >> "$COUNT"
sleep 0.3
for a in "$@"; do
  case "$a" in
  --*|install) ;;
  *) name=${a%@*}; ver=${a##*@}; mkdir -p "node_modules/$name"; echo "{\"version\":\"$ver\"}" > "node_modules/$name/package.json";;
  esac
done
`

func TestInstallOnceUnderLock(t *testing.T) {
	dir := t.TempDir()
	npm := filepath.Join(dir, "npm")
	if err := os.WriteFile(npm, []byte(fakeNpm), 0o755); err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(dir, "count")
	t.Setenv("COUNT", count)
	rt := Runtime{Node: "node", Npm: npm, CacheDir: filepath.Join(dir, "cache")}
	var wg sync.WaitGroup
	dirs := make([]string, 4)
	for i := range dirs {
		wg.Go(func() {
			sdk, err := rt.Install(context.Background(), "@scope/pkg@1.2.3", "other@0.0.1")
			if err != nil {
				t.Error(err)
				return
			}
			dirs[i] = sdk.Dir()
		})
	}
	wg.Wait()
	b, _ := os.ReadFile(count)
	if n := strings.Count(string(b), "x"); n != 1 {
		t.Fatalf("npm ran %d times for 4 parallel installs of one list, want 1", n)
	}
	for _, d := range dirs[1:] {
		if d != dirs[0] {
			t.Fatalf("dirs %v differ", dirs)
		}
	}
	// The order of the list does not matter; another version is another tree.
	sdk, err := rt.Install(context.Background(), "other@0.0.1", "@scope/pkg@1.2.3")
	if err != nil || sdk.Dir() != dirs[0] {
		t.Fatalf("reordered: %v %v", sdk, err)
	}
	sdk2, err := rt.Install(context.Background(), "@scope/pkg@1.2.4")
	if err != nil || sdk2.Dir() == dirs[0] {
		t.Fatalf("other version: %v", err)
	}
	// A tree tampered with (another version in place) is installed again.
	os.WriteFile(filepath.Join(sdk2.Dir(), "node_modules/@scope/pkg/package.json"), []byte(`{"version":"9.9.9"}`), 0o644)
	if _, err := rt.Install(context.Background(), "@scope/pkg@1.2.4"); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(count)
	if n := strings.Count(string(b), "x"); n != 3 {
		t.Fatalf("npm ran %d times, want 3", n)
	}
}

func TestInstallNpmFails(t *testing.T) {
	dir := t.TempDir()
	npm := filepath.Join(dir, "npm")
	os.WriteFile(npm, []byte("#!/bin/sh\necho 'E404 no such package' >&2\nexit 1\n"), 0o755)
	rt := Runtime{Node: "node", Npm: npm, CacheDir: filepath.Join(dir, "cache")}
	_, err := rt.Install(context.Background(), "nope@1.0.0")
	if err == nil || !strings.Contains(err.Error(), "E404") {
		t.Fatalf("err = %v, want npm's output", err)
	}
}
