package jail_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/jail"
)

// netJail is a Jail whose sandboxes reach the fake internet in.
func netJail(t *testing.T, in *egresstest.Internet) *jail.Jail {
	t.Helper()
	j, err := jail.New(jail.Config{StateDir: t.TempDir(), Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}})
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// curl fetches url inside sandbox id (CA trusted) and returns its
// output, or "FAILED <exit>".
func curl(t *testing.T, j *jail.Jail, id string, args ...string) string {
	t.Helper()
	argv := append([]string{"curl", "-sS", "--max-time", "5", "--cacert", "ca.pem"}, args...)
	c, err := j.Execute(context.Background(), id, argv, mechanism.ExecOptions{})
	if err != nil {
		t.Fatalf("curl: %v", err)
	}
	if c.ExitStatus != 0 {
		return fmt.Sprintf("FAILED %d %s", c.ExitStatus, strings.TrimSpace(string(c.Stderr)))
	}
	return strings.TrimSpace(string(c.Stdout))
}

func withCA(t *testing.T, j *jail.Jail, id string, in *egresstest.Internet) {
	t.Helper()
	p, err := j.HostPath(id, "ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
}

func hasCurl(t *testing.T) {
	t.Helper()
	_, err := os.Stat("/usr/bin/curl")
	testenv.Require(t, err == nil, "needs /usr/bin/curl (Debian package curl)")
}

func TestEgressByDefault(t *testing.T) {
	testenv.RequireRoot(t)
	hasCurl(t)
	in := egresstest.New(t)
	j := netJail(t, in)
	started(t, j, "net", mechanism.Spec{})
	withCA(t, j, "net", in)
	if got := curl(t, j, "net", "http://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("http by name = %q", got)
	}
	if got := curl(t, j, "net", "https://"+egresstest.Denied+"/"); got != "hello from "+egresstest.Denied {
		t.Errorf("https by name, no policy = %q", got)
	}
	// Never: the metadata address, this host's addresses.
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nhello from the host\n")
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	targets := []string{"169.254.169.254:80"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			targets = append(targets, fmt.Sprintf("%s:%d", ipn.IP, port))
		}
	}
	for _, a := range targets {
		if got := curl(t, j, "net", "http://"+a+"/"); !strings.HasPrefix(got, "FAILED") {
			t.Errorf("BREACHED: %s reached from the sandbox: %q", a, got)
		}
	}
	// none: only lo, as before.
	started(t, j, "off", mechanism.Spec{Network: mechanism.NetworkNone})
	withCA(t, j, "off", in)
	if got := curl(t, j, "off", "http://"+egresstest.Hosts[egresstest.Allowed].String()+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED: a sandbox with network none reached out: %q", got)
	}
}

// TestEgressPolicyKeptAcrossRestart: the list UpdateEgress put in force
// holds after a Stop and Start (the breach cases are mechanismtest's
// egress check, in TestConformance).
func TestEgressPolicyKeptAcrossRestart(t *testing.T) {
	testenv.RequireRoot(t)
	hasCurl(t)
	in := egresstest.New(t)
	j := netJail(t, in)
	started(t, j, "pol", mechanism.Spec{Egress: []string{egresstest.Denied}})
	withCA(t, j, "pol", in)
	if got := curl(t, j, "pol", "https://"+egresstest.Denied+"/"); got != "hello from "+egresstest.Denied {
		t.Errorf("the initial list of Spec.Egress: %q", got)
	}
	if err := j.UpdateEgress(context.Background(), "pol", []string{egresstest.Allowed}); err != nil {
		t.Fatal(err)
	}
	if err := j.Stop(context.Background(), "pol"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(context.Background(), "pol"); err != nil {
		t.Fatal(err)
	}
	if got := curl(t, j, "pol", "https://"+egresstest.Denied+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED after a restart: %q", got)
	}
	if got := curl(t, j, "pol", "https://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("allowed domain after a restart = %q", got)
	}
}

// TestPublish: a port published by Spec.Publish is reached from the
// host's loopback at Address (127.0.0.1 only); Address is "" for a port
// not published and once the sandbox is stopped.
func TestPublish(t *testing.T) {
	testenv.RequireRoot(t)
	_, err := os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "needs /usr/bin/python3 to serve inside the sandbox")
	j := newJail(t)
	ctx := context.Background()
	started(t, j, "pub", mechanism.Spec{Network: mechanism.NetworkNone, Publish: []int{8080}})
	p, err := j.HostPath("pub", "index.html")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte("hello from inside\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	proc, err := j.StartProcess(ctx, "pub", mechanism.ProcessSpec{Argv: []string{"/usr/bin/python3", "-m", "http.server", "8080", "--bind", "127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Wait()
	defer proc.Signal(syscall.SIGKILL)
	addr, err := j.Address(ctx, "pub", 8080)
	if err != nil || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("Address = %q, %v; want 127.0.0.1:PORT", addr, err)
	}
	var body string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/index.html")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if body = string(b); resp.StatusCode == 200 {
			break
		}
	}
	if body != "hello from inside\n" {
		t.Fatalf("GET through the published port = %q", body)
	}
	if a, err := j.Address(ctx, "pub", 9999); a != "" || err != nil {
		t.Errorf("Address of a port not published = %q, %v", a, err)
	}
	if err := j.Stop(ctx, "pub"); err != nil {
		t.Fatal(err)
	}
	if a, err := j.Address(ctx, "pub", 8080); a != "" || err != nil {
		t.Errorf("Address of a stopped sandbox = %q, %v", a, err)
	}
	if _, err := http.Get("http://" + addr + "/"); err == nil {
		t.Errorf("the published port still answers after Stop")
	}
	if err := j.Provision(ctx, "bad", mechanism.Spec{Publish: []int{0}}); !errors.Is(err, mechanism.ErrInvalid) {
		t.Errorf("publish port 0 = %v, want invalid", err)
	}
}
