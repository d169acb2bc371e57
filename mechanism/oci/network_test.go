package oci_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
	"github.com/managoat/managoat/mechanism/oci"
)

// factoryNet is factory with egress to the stand-in internet in.
func factoryNet(runtime string, in *egresstest.Internet) func(t *testing.T) mechanism.Mechanism {
	return func(t *testing.T) mechanism.Mechanism {
		m, err := oci.New(oci.Config{Runtime: runtime, StateDir: t.TempDir(), Egress: egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
}

// TestRunscEgressCannotTouchItsNamespace: a runsc container with egress
// (gVisor over the host's sockets in its own network namespace) tries
// to take the packet filter out of the way from inside: take lo down,
// add a route or an address, open a netfilter netlink or a raw socket.
// Every attempt fails, and the policy still holds afterwards: the
// allowed name is reached, the denied host is not, by name or address.
func TestRunscEgressCannotTouchItsNamespace(t *testing.T) {
	requireRuntime(t, "runsc")
	_, err := os.Stat("/usr/bin/curl")
	testenv.Require(t, err == nil, "needs /usr/bin/curl (Debian package curl)")
	_, err = os.Stat("/usr/bin/python3")
	testenv.Require(t, err == nil, "needs /usr/bin/python3 to open sockets inside")
	in := egresstest.New(t)
	m := factoryNet("runsc", in)(t)
	ctx := context.Background()
	if err := m.Provision(ctx, "adv", mechanism.Spec{Egress: []string{egresstest.Allowed}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Destroy(context.Background(), "adv") })
	if err := m.Start(ctx, "adv"); err != nil {
		t.Fatal(err)
	}
	sh := func(script string) string {
		c, err := m.Execute(ctx, "adv", []string{"/bin/bash", "-c", script}, mechanism.ExecOptions{Timeout: 30 * time.Second})
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		return strings.TrimSpace(string(c.Stdout) + string(c.Stderr))
	}
	attempts := map[string]string{
		"lo down":           "ip link set lo down && echo DONE",
		"a default route":   "ip route replace default dev lo && echo DONE",
		"an address":        "ip addr add 198.51.100.99/32 dev lo && echo DONE",
		"netfilter netlink": `python3 -c 'import socket; socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12); print("DONE")'`,
		"a raw socket":      `python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 6); print("DONE")'`,
	}
	for name, script := range attempts {
		out := sh(script)
		t.Logf("%s: %s", name, out)
		if strings.Contains(out, "DONE") {
			t.Errorf("BREACHED: the workload changed its network namespace (%s): %q", name, out)
		}
	}
	p, err := m.HostPath("adv", "ca.pem")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	curl := func(args ...string) string {
		return sh("curl -sS --max-time 5 --cacert ca.pem " + strings.Join(args, " ") + " || echo FAILED")
	}
	if got := curl("https://" + egresstest.Allowed + "/"); got != "hello from "+egresstest.Allowed {
		t.Errorf("the allowed name after the attempts: %q", got)
	}
	for _, args := range []string{"https://" + egresstest.Denied + "/", "-k https://" + egresstest.Hosts[egresstest.Denied].String() + "/", "http://169.254.169.254/"} {
		if got := curl(args); !strings.Contains(got, "FAILED") {
			t.Errorf("BREACHED after the attempts: curl %s = %q", args, got)
		}
	}
}
