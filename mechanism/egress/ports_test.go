package egress_test

import (
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
)

// TestPublishPorts: PublishPorts relays a loopback address of the host to
// the port in the namespace of the pid it is given (here a child's, in
// the host's namespace), records where; PublishedAddr finds it for that pid only, and a
// closed Ports no longer answers.
func TestPublishPorts(t *testing.T) {
	testenv.RequireRoot(t)
	app, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	go func() {
		for {
			c, err := app.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	port := app.Addr().(*net.TCPAddr).Port
	// The namespace is a child's, not this process's: /proc/<our pid>/ns
	// is the main thread's, which a test's goroutine may have taken into
	// another namespace for a moment (egress's own onThreadIn does).
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
	addr := egress.PublishedAddr(file, pid, port)
	if host, _, _ := net.SplitHostPort(addr); host != "127.0.0.1" || addr == app.Addr().String() {
		t.Fatalf("PublishedAddr = %q", addr)
	}
	c, err := net.Dial("tcp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through the published port = %q, %v", b, err)
	}
	c.Close()
	if a := egress.PublishedAddr(file, pid+1, port); a != "" {
		t.Errorf("another init's record gave %q", a)
	}
	if a := egress.PublishedAddr(file, pid, port+1); a != "" {
		t.Errorf("a port not published gave %q", a)
	}
	if a := egress.PublishedAddr(filepath.Join(t.TempDir(), "none"), pid, port); a != "" {
		t.Errorf("no record gave %q", a)
	}
	if !egress.Listening(addr) {
		t.Errorf("Listening(%s) = false while published", addr)
	}
	ps.Close()
	if egress.Listening(addr) {
		t.Errorf("the published port still answers after Close")
	}
	if _, err := egress.PublishPorts(pid, []int{port, 70000}, file); err == nil {
		t.Errorf("port 70000 published")
	}
}
