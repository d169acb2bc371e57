package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// seqLines is what `seq 1 n` prints.
func seqLines(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// slowReader runs the binary with its stdout a pipe nobody reads for
// stall (the reader is busy), then reads all of it; it returns the
// sha256 and the length of what came, the exit code and the stderr.
func slowReader(t *testing.T, env []string, stall time.Duration, args ...string) (sum string, n int, code int, stderr string) {
	t.Helper()
	c := exec.Command(binary, args...)
	c.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), env...)
	var e bytes.Buffer
	c.Stderr = &e
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	kill := time.AfterFunc(2*time.Minute, func() { _ = c.Process.Kill() }) // bounded
	defer kill.Stop()
	time.Sleep(stall) // the reader is slow: nothing is read meanwhile
	h := sha256.New()
	m, _ := io.Copy(h, out)
	err = c.Wait()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil)), int(m), code, e.String()
}

// TestSlowReaderGetsEveryByte (issue 31, 1): a reader that falls behind
// (here: managoat's stdout a pipe nobody reads for 1.5 s while the
// command writes 75 MiB, more than a stream queues for its reader) slows
// the command, or is fed from the session's journal, and gets every byte
// in order and the exit code, on run (the direct path, with no
// supervisor), exec, and attach. Before the fix, run cut the stream at
// the 64 MiB bound (exit 125, unavailable slow_reader).
func TestSlowReaderGetsEveryByte(t *testing.T) {
	testenv.RequireRoot(t)
	const n = 10_000_000 // seq 1 n: 78,888,897 bytes
	want := seqLines(n)
	wantSum := sha(want)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	check := func(what string, sum string, got, code int, stderr string) {
		t.Helper()
		if code != 0 || got != len(want) || sum != wantSum {
			t.Errorf("%s: exit %d, %d bytes (want %d), sha256 match %v; stderr %q", what, code, got, len(want), sum == wantSum, stderr)
		}
	}
	sum, got, code, e := slowReader(t, env, 1500*time.Millisecond, "run", "--", "seq", "1", strconv.Itoa(n))
	check("run", sum, got, code, e)

	if _, e, code := managoatEnv(t, env, "create", "slow-box"); code != 0 {
		t.Fatalf("create: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "slow-box") })
	sum, got, code, e = slowReader(t, env, 1500*time.Millisecond, "exec", "slow-box", "--", "seq", "1", strconv.Itoa(n))
	check("exec", sum, got, code, e)

	id, e, code := managoatEnv(t, env, "spawn", "--detach", "slow-box", "--", "seq", "1", strconv.Itoa(n))
	if code != 0 {
		t.Fatalf("spawn --detach: %d %s", code, e)
	}
	sum, got, code, e = slowReader(t, env, 1500*time.Millisecond, "attach", "--no-stdin", "slow-box", strings.TrimSpace(id))
	check("attach", sum, got, code, e)
}

// TestDetachKeysOnlyAtATerminal (issue 31, 2): on a stdin that is not a
// terminal the detach keys are data, as docker has it: Ctrl-P Ctrl-Q in
// a pipe reaches the command, which runs to its end, and a random file
// (which holds the sequence about once in 64 KiB) goes through exec's
// stdin whole. Before the fix, exec printed "abc", exited 0 and left cat
// running.
func TestDetachKeysOnlyAtATerminal(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "keys-box"); code != 0 {
		t.Fatalf("create: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "keys-box") })
	in := "abc\x10\x11def\n"
	out, e, code := runBinary(t, strings.NewReader(in), env, "exec", "keys-box", "--", "cat")
	if code != 0 || out != in || strings.Contains(e, "detached") {
		t.Fatalf("exec cat of %q: exit %d, stdout %q, stderr %q", in, code, out, e)
	}
	// A trailing partial sequence is data too.
	out, _, code = runBinary(t, strings.NewReader("xyz\x10"), env, "exec", "keys-box", "--", "cat")
	if code != 0 || out != "xyz\x10" {
		t.Fatalf("exec cat of a trailing Ctrl-P: exit %d, stdout %q", code, out)
	}
	data := make([]byte, 4<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte{0x10, 0x11}) {
		t.Fatal("the random file holds no Ctrl-P Ctrl-Q: no test")
	}
	out, e, code = runBinary(t, bytes.NewReader(data), env, "exec", "keys-box", "--", "sha256sum")
	if code != 0 || out != sha(data)+"  -\n" {
		t.Fatalf("exec sha256sum: exit %d, stdout %q (want %s), stderr %q", code, out, sha(data), e)
	}
	for _, cmd := range [][]string{{"exec", "keys-box", "--", "cat"}, {"run", "--", "cat"}} {
		out, e, code = runBinary(t, bytes.NewReader(data), env, cmd...)
		if code != 0 || len(out) != len(data) || sha([]byte(out)) != sha(data) {
			t.Fatalf("%v of 4 MiB of random bytes: exit %d, %d bytes back, stderr %q", cmd, code, len(out), e)
		}
	}
}

// TestSpawnDetachKeepsStdinOpen (issue 31, 4): spawn --detach -i keeps
// the session's stdin open, as its help says, so a later attach types
// into it; without -i a detached session's stdin is closed at once (as
// docker run -d). Before the fix, -i was ignored: the read got EOF and
// the attach's input was refused.
func TestSpawnDetachKeepsStdinOpen(t *testing.T) {
	testenv.RequireRoot(t)
	env := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if _, e, code := managoatEnv(t, env, "create", "stdin-box"); code != 0 {
		t.Fatalf("create: %d %s", code, e)
	}
	t.Cleanup(func() { managoatEnv(t, env, "rm", "-f", "stdin-box") })
	id, e, code := managoatEnv(t, env, "spawn", "--detach", "-i", "stdin-box", "--", "sh", "-c", "read x; echo got $x")
	if code != 0 {
		t.Fatalf("spawn --detach -i: %d %s", code, e)
	}
	out, e, code := runBinary(t, strings.NewReader("hello\n"), env, "attach", "stdin-box", strings.TrimSpace(id))
	if code != 0 || out != "got hello\n" {
		t.Fatalf("attach typing hello: exit %d, stdout %q, stderr %q", code, out, e)
	}
	id, e, code = managoatEnv(t, env, "spawn", "--detach", "stdin-box", "--", "sh", "-c", "cat; echo done")
	if code != 0 {
		t.Fatalf("spawn --detach: %d %s", code, e)
	}
	out, e, code = managoatEnv(t, env, "attach", "--no-stdin", "stdin-box", strings.TrimSpace(id))
	if code != 0 || out != "done\n" {
		t.Fatalf("attach to a session spawned --detach without -i: exit %d, stdout %q, stderr %q", code, out, e)
	}
}

// TestCtrlCThroughThePlatform (issue 31, 5): a SIGINT to managoat exec
// through the platform (serve, its API and the Go client) reaches the
// command as a signal, as it does locally: the command's trap runs and
// its exit code is managoat's. Before the fix the client could not
// signal, so managoat killed the session (exit 137) and the trap never
// ran.
func TestCtrlCThroughThePlatform(t *testing.T) {
	testenv.RequireRoot(t)
	addr := freeAddr(t)
	base := []string{"MANAGOAT_HOME=" + t.TempDir()}
	if out, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "sig"); code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "sig")
	if code != 0 {
		t.Fatalf("key create: %d %q %s", code, out, e)
	}
	startServe(t, base, addr)
	as := append(append([]string{}, base...), "MANAGOAT_URL=http://"+addr, "MANAGOAT_API_KEY="+strings.TrimSpace(out))
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) { // serve is starting
		_, e, code := managoatEnv(t, as, "create", "sig-box")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create: %d %s", code, e)
		}
	}
	t.Cleanup(func() { managoatEnv(t, as, "rm", "-f", "sig-box") })

	c := exec.Command(binary, "exec", "sig-box", "--", "sh", "-c", `trap 'echo trapped; exit 3' INT; echo ready; while :; do sleep 0.1; done`)
	c.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), as...)
	var errOut bytes.Buffer
	c.Stderr = &errOut
	pr, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	kill := time.AfterFunc(time.Minute, func() { _ = c.Process.Kill() }) // bounded
	defer kill.Stop()
	r := bufio.NewReader(pr)
	if line, err := r.ReadString('\n'); line != "ready\n" {
		_ = c.Process.Kill()
		_ = c.Wait()
		t.Fatalf("first line %q (%v); stderr %q", line, err, errOut.String())
	}
	if err := c.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	rest, _ := io.ReadAll(r)
	err = c.Wait()
	code = 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 3 || string(rest) != "trapped\n" {
		t.Fatalf("after SIGINT: exit %d, stdout %q, stderr %q; want the trap's exit 3 and \"trapped\"", code, rest, errOut.String())
	}
}
