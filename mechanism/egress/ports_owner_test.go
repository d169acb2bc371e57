package egress_test

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// attackerEnv makes the test binary another local user trying a
// published port ("tcp ADDR" or "unix PATH"): it says what it got.
const attackerEnv = "MANAGOAT_EGRESS_TEST_ATTACKER"

func attackerMain() int {
	network, addr, _ := strings.Cut(os.Getenv(attackerEnv), " ")
	c, err := net.DialTimeout(network, addr, 3*time.Second)
	if err != nil {
		fmt.Printf("CONNECT %v\n", err)
		return 0
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	_, werr := c.Write([]byte("ping"))
	b, rerr := io.ReadAll(io.LimitReader(c, 64))
	fmt.Printf("READ %q write=%v read=%v\n", b, werr, rerr)
	return 0
}

// asAnotherUser runs the test binary as uid 65534 trying network addr.
func asAnotherUser(t *testing.T, bin, network, addr string) string {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = []string{attackerEnv + "=" + network + " " + addr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{
		Uid: egresstest.UnprivilegedUID, Gid: egresstest.UnprivilegedUID, Groups: []uint32{}}}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the run as uid %d: %v: %s", egresstest.UnprivilegedUID, err, out)
	}
	return strings.TrimSpace(string(out))
}

// TestPublishedPortsOwnerOnly: another local user (uid 65534) cannot use
// a published port: its connect(2) to the unix socket is refused
// (permission denied) and its connection to the loopback TCP port is
// reset before a byte is read or relayed; the application inside never
// sees a connection of its. The owner's both ways work, and SocketFor
// finds the socket of the published address.
func TestPublishedPortsOwnerOnly(t *testing.T) {
	testenv.RequireRoot(t)
	app, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := app.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	defer func() { app.Close(); <-done }()
	port := app.Addr().(*net.TCPAddr).Port
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	pid := child.Process.Pid
	file := filepath.Join(t.TempDir(), "published.json")
	ps, err := egress.PublishPorts(pid, []int{port}, file)
	if err != nil {
		t.Fatal(err)
	}
	defer ps.Close()
	addr := egress.PublishedAddr(file, pid, port)
	sock, err := egress.SocketFor(addr)
	if err != nil {
		t.Fatalf("SocketFor(%s): %v", addr, err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the socket %s: %v, %v; want mode 0600", sock, fi.Mode(), err)
	}
	if fi, err := os.Stat(filepath.Dir(sock)); err != nil || fi.Mode().Perm()&0o077 != 0 {
		t.Errorf("the socket's directory: %v, %v; want 0700", fi.Mode(), err)
	}
	echo := func(network, a string) string {
		c, err := net.DialTimeout(network, a, 3*time.Second)
		if err != nil {
			return err.Error()
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		c.Write([]byte("ping"))
		b := make([]byte, 4)
		_, err = io.ReadFull(c, b)
		return fmt.Sprintf("%s %v", b, err)
	}
	if got := echo("tcp4", addr); got != "ping <nil>" {
		t.Fatalf("the owner through %s: %s", addr, got)
	}
	if got := echo("unix", sock); got != "ping <nil>" {
		t.Fatalf("the owner through %s: %s", sock, got)
	}
	before := accepted.Load()

	// The attacker: a copy of this binary that uid 65534 may execute.
	dir := t.TempDir()
	if err := testenv.Traversable(dir); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "attacker")
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := asAnotherUser(t, bin, "unix", sock); !strings.HasPrefix(got, "CONNECT ") || !strings.Contains(got, "permission denied") {
		t.Errorf("uid 65534 to the unix socket: %s; want its connect refused (permission denied)", got)
	}
	if got := asAnotherUser(t, bin, "tcp4", addr); !strings.HasPrefix(got, "CONNECT ") && !strings.HasPrefix(got, `READ ""`) {
		t.Errorf("uid 65534 to %s: %s; want nothing relayed", addr, got)
	}
	// Give a relay that wrongly started time to reach the application.
	time.Sleep(200 * time.Millisecond)
	if n := accepted.Load(); n != before {
		t.Errorf("the application accepted %d connections of uid 65534", n-before)
	}
	if got := echo("tcp4", addr); got != "ping <nil>" {
		t.Errorf("the owner after the attempts: %s", got)
	}
	ps.Close()
	if _, err := os.Lstat(sock); err == nil {
		t.Errorf("the socket %s stays after Close", sock)
	}
	if _, err := egress.SocketFor(addr); err == nil {
		t.Errorf("SocketFor after Close found a socket")
	}
}

// TestControlSocketInAPrivateDir: the policy's control socket is neither
// served nor used in a directory another user can write (a temporary
// directory's managoat-UID made by someone else): there another user
// could put their own socket and take the policy changes, so that a
// deny-all never reached the sandbox. (Fails on the old code: both
// went ahead.)
func TestControlSocketInAPrivateDir(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	b := newBox(t, in, nil)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "box.egress")
	if err := b.p.ServeControl(sock); err == nil || !strings.Contains(err.Error(), "mode") {
		t.Errorf("ServeControl in a directory of mode 0777 = %v, want refused", err)
	}
	// Another user's socket there: Apply does not talk to it.
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan bool, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			c.Close()
		}
		got <- err == nil
	}()
	if err := egress.Apply(t.Context(), sock, []string{}); err == nil {
		t.Errorf("Apply through a socket in a directory of mode 0777 succeeded")
	}
	ln.Close()
	if <-got {
		t.Errorf("Apply connected to the socket in a directory of mode 0777")
	}
}

// BenchmarkPublishedOwnerCheck: a connection and one exchange through a
// published port's loopback TCP port, whose owner is asked of the
// kernel (sock_diag) for each connection, against the same through its
// unix socket, which needs no check, interleaved; the metric is the
// ratio of the times.
func BenchmarkPublishedOwnerCheck(b *testing.B) {
	testenv.RequireRoot(b)
	app, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := app.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	defer func() { app.Close(); <-done }()
	child := exec.Command("sleep", "600")
	if err := child.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	file := filepath.Join(b.TempDir(), "published.json")
	ps, err := egress.PublishPorts(child.Process.Pid, []int{app.Addr().(*net.TCPAddr).Port}, file)
	if err != nil {
		b.Fatal(err)
	}
	defer ps.Close()
	addr := egress.PublishedAddr(file, child.Process.Pid, app.Addr().(*net.TCPAddr).Port)
	sock, err := egress.SocketFor(addr)
	if err != nil {
		b.Fatal(err)
	}
	exchange := func(network, a string) time.Duration {
		t0 := time.Now()
		c, err := net.Dial(network, a)
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
	var tTCP, tUnix time.Duration
	b.ResetTimer()
	for range b.N {
		tTCP += exchange("tcp4", addr)
		tUnix += exchange("unix", sock)
	}
	b.ReportMetric(float64(tTCP)/float64(tUnix), "checked-tcp/unix-conn")
	b.ReportMetric(float64(tTCP.Microseconds())/float64(b.N), "tcp-µs/conn")
}
