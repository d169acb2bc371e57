package jail

import (
	"context"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// TestRootlessPublishAdoptedByANewManager: when the process publishing a
// rootless sandbox's ports is gone (its ports and socket helper with
// it), a Start from another process (as uid 65534) publishes them again,
// at a new address that reaches the same server inside; a second Start
// changes nothing, and Destroy leaves no helper.
func TestRootlessPublishAdoptedByANewManager(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "needs /usr/bin/python3 to serve inside the sandbox")
	cfg := Config{StateDir: t.TempDir(), Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}}
	first, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := first.Provision(ctx, "a", mechanism.Spec{Network: mechanism.NetworkNone, Publish: []int{8080}}); err != nil {
		t.Fatal(err)
	}
	defer first.Destroy(context.Background(), "a")
	if err := first.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// A server inside that says "inside" to each connection.
	proc, err := first.StartProcess(ctx, "a", mechanism.ProcessSpec{Argv: []string{"/usr/bin/python3", "-c",
		"import socket\ns=socket.socket()\ns.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\ns.bind(('127.0.0.1',8080))\ns.listen()\n" +
			"while True:\n c,_=s.accept()\n c.sendall(b'inside\\n')\n c.close()\n"}})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Wait()
	defer proc.Signal(syscall.SIGKILL)
	read := func(addr string) string {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			c, err := net.DialTimeout("tcp4", addr, time.Second)
			if err != nil {
				continue
			}
			c.SetDeadline(time.Now().Add(3 * time.Second))
			b, _ := io.ReadAll(c)
			c.Close()
			if len(b) > 0 {
				return string(b)
			}
		}
		return ""
	}
	addr, err := first.Address(ctx, "a", 8080)
	if err != nil || addr == "" {
		t.Fatalf("Address = %q, %v", addr, err)
	}
	if got := read(addr); got != "inside\n" {
		t.Fatalf("before: %q", got)
	}
	first.stopNetwork("a") // as if the process serving it died
	if egress.Listening(addr) {
		t.Fatalf("the published port still answers with nobody serving it")
	}
	if h := egresstest.SocketHelpers(); len(h) != 0 {
		t.Errorf("socket helpers %v left with the ports closed", h)
	}
	second, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	defer second.stopNetwork("a")
	again, err := second.Address(ctx, "a", 8080)
	if err != nil || again == "" || again == addr && !egress.Listening(again) {
		t.Fatalf("Address after adoption = %q, %v", again, err)
	}
	if got := read(again); got != "inside\n" {
		t.Errorf("after adoption: %q", got)
	}
	if err := second.Start(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if a, _ := second.Address(ctx, "a", 8080); a != again {
		t.Errorf("a second Start published again: %q, was %q", a, again)
	}
	if h := egresstest.SocketHelpers(); len(h) != 1 {
		t.Errorf("socket helpers = %v, want one", h)
	}
	if err := second.Destroy(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if h := egresstest.SocketHelpers(); len(h) != 0 {
		t.Errorf("socket helpers %v left after Destroy", h)
	}
	if egress.Listening(again) {
		t.Errorf("the published port still answers after Destroy")
	}
}
