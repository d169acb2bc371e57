package jail_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/jail"
	"github.com/managoat/managoat/mechanism/mechanismtest"
)

// rootlessNetJail is netJail in a run as uid 65534 (egresstest.Unprivileged).
func rootlessNetJail(t *testing.T, in *egresstest.Internet) *jail.Jail {
	t.Helper()
	if os.Geteuid() == 0 {
		t.Fatal("running as root")
	}
	if ok, why := egress.RootlessSupported(); !ok {
		testenv.Require(t, false, why)
	}
	j := netJail(t, in)
	if !slices.Contains(mechanism.Guaranteed(j), mechanism.EgressAllowlist) {
		t.Fatalf("a rootless jail does not claim %s: %v", mechanism.EgressAllowlist, mechanism.Guaranteed(j))
	}
	return j
}

// TestRootlessEgress: a jail started by a user that is not root (its
// sandboxes in user namespaces) gives them egress by default, by name
// through their resolver; never this host's addresses, loopback or the
// metadata address; network none keeps only lo; the list UpdateEgress
// put in force holds after a restart.
func TestRootlessEgress(t *testing.T) {
	in := egresstest.Unprivileged(t, "")
	if in == nil {
		return // ran as uid 65534
	}
	hasCurl(t)
	j := rootlessNetJail(t, in)
	started(t, j, "net", mechanism.Spec{})
	withCA(t, j, "net", in)
	if got := curl(t, j, "net", "http://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("http by name = %q", got)
	}
	if got := curl(t, j, "net", "https://"+egresstest.Denied+"/"); got != "hello from "+egresstest.Denied {
		t.Errorf("https by name, no policy = %q", got)
	}
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
	targets := []string{"169.254.169.254:80", fmt.Sprintf("127.0.0.1:%d", port)}
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
	started(t, j, "off", mechanism.Spec{Network: mechanism.NetworkNone})
	withCA(t, j, "off", in)
	if got := curl(t, j, "off", "http://"+egresstest.Hosts[egresstest.Allowed].String()+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED: a sandbox with network none reached out: %q", got)
	}
	// A list kept across a restart.
	ctx := context.Background()
	if err := j.UpdateEgress(ctx, "net", []string{egresstest.Allowed}); err != nil {
		t.Fatal(err)
	}
	if err := j.Stop(ctx, "net"); err != nil {
		t.Fatal(err)
	}
	if err := j.Start(ctx, "net"); err != nil {
		t.Fatal(err)
	}
	if got := curl(t, j, "net", "https://"+egresstest.Denied+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED after a restart: %q", got)
	}
	if got := curl(t, j, "net", "https://"+egresstest.Allowed+"/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("allowed domain after a restart = %q", got)
	}
}

// TestRootlessConformanceEgress runs the breach conformance's egress
// check against a rootless jail (as uid 65534).
func TestRootlessConformanceEgress(t *testing.T) {
	in := egresstest.Unprivileged(t, "^egress$")
	if in == nil {
		return // ran as uid 65534
	}
	rootlessNetJail(t, in)
	mechanismtest.Run(t, suiteWithInternet(in), mechanismtest.Strict(testenv.InCI()), mechanismtest.Internet(in))
}
