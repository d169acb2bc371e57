package egress_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// serveLines answers each connection to ln with who, then echoes one
// line, until ln is closed.
func serveLines(t *testing.T, ln net.Listener, who string) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				c.SetDeadline(time.Now().Add(5 * time.Second))
				io.WriteString(c, who+"\n")
				buf := make([]byte, 64)
				n, _ := c.Read(buf)
				c.Write(buf[:n])
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); wg.Wait() })
}

// ask connects to addr and returns the first line it is sent and the
// echo of "ping", or what went wrong.
func ask(addr string) (string, error) {
	c, err := net.DialTimeout("tcp4", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

// waitNoHelpers fails the test unless every socket helper is gone
// within 10 s.
func waitNoHelpers(t *testing.T, when string) {
	t.Helper()
	var left []int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if left = egresstest.SocketHelpers(); len(left) == 0 {
			return
		}
	}
	t.Errorf("%s: socket helpers %v still run", when, left)
}

// TestRootlessPublish: a manager that is not root (uid 65534) publishes
// ports of a sandbox in a user namespace it made: a server on the
// sandbox's loopback is reached at 127.0.0.1:PORT of the host (never the
// host's own server on that port number), many connections at once, a
// published port nobody serves inside gives a connection closed at once,
// PublishedAddr says "" for a port not published; Close leaves nothing
// listening and no helper; the sandbox's end alone ends the helper.
func TestRootlessPublish(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	if os.Geteuid() == 0 {
		t.Fatal("running as root")
	}
	b := rootlessBox(t, in, nil) // lo up in the sandbox
	// The host serves on the same port numbers: a published port that
	// reached them would not be the sandbox's.
	served, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveLines(t, served, "host")
	idle, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveLines(t, idle, "host")
	port, idlePort := served.Addr().(*net.TCPAddr).Port, idle.Addr().(*net.TCPAddr).Port
	inside, err := b.agent.listen("127.0.0.1:" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	serveLines(t, inside, "sandbox")
	pid := b.agent.cmd.Process.Pid
	file := filepath.Join(t.TempDir(), "published.json")
	ps, err := egress.PublishPorts(pid, []int{port, idlePort}, file)
	if err != nil {
		t.Fatalf("rootless PublishPorts: %v", err)
	}
	defer ps.Close()
	addr := egress.PublishedAddr(file, pid, port)
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" {
		t.Fatalf("PublishedAddr = %q, want 127.0.0.1:PORT", addr)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if got, err := ask(addr); err != nil || got != "sandbox\nping" {
				errs <- fmt.Errorf("through the published port: %q, %v", got, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if h := egresstest.SocketHelpers(); len(h) != 1 {
		t.Errorf("socket helpers = %v, want one for the sandbox", h)
	}
	idleAddr := egress.PublishedAddr(file, pid, idlePort)
	if got, err := ask(idleAddr); got != "" {
		t.Errorf("BREACHED: a published port nobody serves in the sandbox answered %q (%v)", got, err)
	}
	if a := egress.PublishedAddr(file, pid, port+1); a != "" && port+1 != idlePort {
		t.Errorf("a port not published gave %q", a)
	}
	ps.Close()
	if egress.Listening(addr) || egress.Listening(idleAddr) {
		t.Errorf("a published port still answers after Close")
	}
	waitNoHelpers(t, "after Close")

	t.Run("SandboxEnds", func(t *testing.T) {
		b := rootlessBox(t, in, nil)
		ln, err := b.agent.listen("127.0.0.1:8080")
		if err != nil {
			t.Fatal(err)
		}
		serveLines(t, ln, "sandbox")
		pid := b.agent.cmd.Process.Pid
		file := filepath.Join(t.TempDir(), "published.json")
		ps, err := egress.PublishPorts(pid, []int{8080}, file)
		if err != nil {
			t.Fatal(err)
		}
		defer ps.Close()
		addr := egress.PublishedAddr(file, pid, 8080)
		if got, err := ask(addr); got != "sandbox\nping" {
			t.Fatalf("through the published port: %q, %v", got, err)
		}
		ln.Close() // the sandbox's server: its last socket in there
		if err := b.agent.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		waitNoHelpers(t, "after the sandbox's init died")
		// Connections keep coming, past the helper's restart interval:
		// no helper is started for a sandbox whose init is gone.
		for until := time.Now().Add(1500 * time.Millisecond); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
			if got, err := ask(addr); got != "" {
				t.Fatalf("a dead sandbox's published port answered %q (%v)", got, err)
			}
			if h := egresstest.SocketHelpers(); len(h) != 0 {
				t.Fatalf("a socket helper %v was started for a dead sandbox", h)
			}
		}
	})
	t.Run("HelperKilled", func(t *testing.T) {
		b := rootlessBox(t, in, nil)
		ln, err := b.agent.listen("127.0.0.1:8080")
		if err != nil {
			t.Fatal(err)
		}
		serveLines(t, ln, "sandbox")
		pid := b.agent.cmd.Process.Pid
		file := filepath.Join(t.TempDir(), "published.json")
		ps, err := egress.PublishPorts(pid, []int{8080}, file)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { ps.Close(); waitNoHelpers(t, "after Close") }()
		addr := egress.PublishedAddr(file, pid, 8080)
		first := egresstest.SocketHelpers()
		if len(first) != 1 {
			t.Fatalf("socket helpers = %v, want one", first)
		}
		if err := syscall.Kill(first[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		// The sandbox runs: a new helper serves the port again.
		var got string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && got != "sandbox\nping"; time.Sleep(50 * time.Millisecond) {
			got, _ = ask(addr)
		}
		if got != "sandbox\nping" {
			t.Fatalf("after the helper was killed the port gives %q", got)
		}
		if h := egresstest.SocketHelpers(); len(h) != 1 || h[0] == first[0] {
			t.Errorf("socket helpers = %v after %v was killed, want one new", h, first)
		}
	})
	t.Run("NotASandboxOfOurs", func(t *testing.T) {
		// Another user's process (pid 1, root's): no helper can enter it.
		file := filepath.Join(t.TempDir(), "published.json")
		if ps, err := egress.PublishPorts(1, []int{80}, file); err == nil {
			ps.Close()
			t.Fatal("published a port of pid 1 without root")
		} else {
			t.Log(err)
		}
		waitNoHelpers(t, "after a refused publish")
	})
}

// publisherEnv makes the test binary a manager that publishes a port of
// a sandbox ("PID PORT FILE"), says "READY HELPERPID" on its stdout and
// waits to be killed.
const publisherEnv = "MANAGOAT_EGRESS_TEST_PUBLISHER"

func publisherMain() int {
	var pid, port int
	var file string
	if _, err := fmt.Sscan(os.Getenv(publisherEnv), &pid, &port, &file); err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		return 2
	}
	ps, err := egress.PublishPorts(pid, []int{port}, file)
	if err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		return 1
	}
	defer ps.Close()
	fmt.Println("READY", egresstest.SocketHelpers())
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
	return 0
}

// TestRootlessPublishManagerDies: the socket helper of a manager that
// dies without closing its ports (SIGKILL) exits (its end of the socket
// pair reads EOF), though its sandbox goes on (as uid 65534).
func TestRootlessPublishManagerDies(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	b := rootlessBox(t, in, nil)
	ln, err := b.agent.listen("127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	serveLines(t, ln, "sandbox")
	file := filepath.Join(t.TempDir(), "published.json")
	pid := b.agent.cmd.Process.Pid
	cmd := exec.Command("/proc/self/exe")
	cmd.Env = []string{fmt.Sprintf("%s=%d 8080 %s", publisherEnv, pid, file)}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the publisher: %v", err)
	}
	var helper int
	if _, err := fmt.Sscanf(line, "READY [%d]", &helper); err != nil {
		t.Fatalf("the publisher said %q: %v", line, err)
	}
	addr := egress.PublishedAddr(file, pid, 8080)
	if got, err := ask(addr); got != "sandbox\nping" {
		t.Fatalf("through the published port: %q, %v", got, err)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", helper))
		if err != nil || !strings.Contains(string(env), "MANAGOAT_EGRESS_SOCKET_HELPER=") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the socket helper %d outlived its manager", helper)
		}
	}
	if c, err := b.dial("127.0.0.1:8080"); err != nil {
		t.Errorf("the sandbox's server is gone too: %v", err)
	} else {
		c.Close()
	}
}

// BenchmarkPublishedConnection: a connection through a published port
// and one exchange with an echo server on the sandbox's loopback (a
// process in a user and a network namespace of its own), through the
// rootless way (a socket from the helper, connected by the manager)
// against root's (the namespace entered per connection), interleaved,
// both as root on the same sandbox; the metric is the ratio of the times.
func BenchmarkPublishedConnection(b *testing.B) {
	testenv.RequireRoot(b)
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(b, false, why)
	}
	a := startAgent(b)
	pid := a.cmd.Process.Pid
	p, err := egress.Attach(pid, nil, egress.Config{}) // lo up
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ln, err := a.listen("127.0.0.1:8080")
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer ln.Close()
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	helper, err := egress.PublishVia(true, pid, 8080)
	if err != nil {
		b.Fatal(err)
	}
	defer helper.Close()
	setns, err := egress.PublishVia(false, pid, 8080)
	if err != nil {
		b.Fatal(err)
	}
	defer setns.Close()
	exchange := func(addr string) time.Duration {
		t0 := time.Now()
		c, err := net.Dial("tcp4", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("ping")); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c, make([]byte, 4)); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	var tHelper, tSetns time.Duration
	b.ResetTimer()
	for range b.N {
		tHelper += exchange(helper.Addr())
		tSetns += exchange(setns.Addr())
	}
	b.ReportMetric(float64(tHelper)/float64(tSetns), "rootless/root-conn")
	b.ReportMetric(float64(tHelper.Microseconds())/float64(b.N), "rootless-µs/conn")
	b.ReportMetric(float64(tSetns.Microseconds())/float64(b.N), "root-µs/conn")
}
