package mechanismtest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// Internet gives the egress check its stand-in for the internet (a
// network namespace of the test's own with DNS, HTTP and TLS servers,
// see mechanism/egress/egresstest). The factory must make mechanisms
// whose egress reaches it (the jail: jail.Config.Egress with in.Dial and
// in.DNS). The egress check applies to a mechanism that claims
// egress_allowlist, in a run given an Internet; nothing leaves the
// machine.
func Internet(in *egresstest.Internet) Option { return func(c *config) { c.internet = in } }

// curlIn runs curl inside sandbox id (the fake internet's CA trusted)
// and returns its output, or "FAILED <exit> <stderr>".
func curlIn(t *testing.T, m mechanism.Mechanism, id string, args ...string) string {
	t.Helper()
	argv := append([]string{"curl", "-sS", "--max-time", "5", "--cacert", "egress-ca.pem"}, args...)
	c, err := m.Execute(context.Background(), id, argv, mechanism.ExecOptions{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatalf("curl: %v", err)
	}
	if c.ExitStatus != 0 {
		return fmt.Sprintf("FAILED %d %s", c.ExitStatus, strings.TrimSpace(string(c.Stderr)))
	}
	return strings.TrimSpace(string(c.Stdout))
}

// udpDNSScript sends one DNS query for name over UDP to server from inside
// and prints ANSWERED when anything comes back within 2 s.
func udpDNSScript(server, name string) string {
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeA)
	b, _ := q.Pack()
	var esc strings.Builder
	for _, c := range b {
		fmt.Fprintf(&esc, "\\%03o", c)
	}
	host, port, _ := net.SplitHostPort(server)
	return fmt.Sprintf(`exec 3<>/dev/udp/%s/%s || { echo NOSEND; exit 0; }; printf '%s' >&3; n=$(timeout 2 head -c 1 <&3 | wc -c); if [ "$n" -gt 0 ]; then echo ANSWERED; else echo SILENT; fi`,
		host, port, esc.String())
}

// checkEgress: with egress on, the outside world is reached; the host's
// loopback and addresses and the metadata address never are; under an
// allow list the allowed domain is reached and another domain, a denied
// host's raw IP, a forged SNI or Host, DNS to an outside resolver (UDP and
// TCP) are refused; a policy change cuts a live connection it denies.
func checkEgress(t *testing.T, k *kit, m mechanism.Mechanism) {
	if !slices.Contains(mechanism.Guaranteed(m), mechanism.EgressAllowlist) {
		k.notApplicable(t, "%s does not claim %s: it promises no egress", m.Name(), mechanism.EgressAllowlist)
	}
	in := k.cfg.internet
	if in == nil {
		// Egress is reached only through the stand-in the caller wires
		// into the mechanism; a run without one (a variant of a suite
		// that runs it elsewhere) promises nothing about it here.
		k.notApplicable(t, "the caller gave no stand-in internet (mechanismtest.Internet)")
	}
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		k.notDemonstrated(t, "no /usr/bin/curl to probe with (Debian package curl)")
	}
	if _, ok := m.(mechanism.EgressUpdater); !ok {
		t.Fatalf("%s claims %s but has no UpdateEgress", m.Name(), mechanism.EgressAllowlist)
	}
	ctx := context.Background()
	id := k.sandbox(t, m, "egress", mechanism.Spec{Network: mechanism.NetworkEgress})
	if p, err := m.HostPath(id, "egress-ca.pem"); err != nil {
		t.Fatal(err)
	} else if err := os.WriteFile(p, in.CAPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	allowed, denied := egresstest.Allowed, egresstest.Denied
	allowedIP, deniedIP := egresstest.Hosts[allowed].String(), egresstest.Hosts[denied].String()
	if got := curlIn(t, m, id, "http://"+allowed+"/"); got != "hello from "+allowed {
		t.Fatalf("egress with no policy: %q, want the fake internet's greeting", got)
	}
	// Never, whatever the policy: the host's loopback and addresses, the metadata address.
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
	never := []string{"169.254.169.254:80", fmt.Sprintf("127.0.0.1:%d", port)}
	if a := outsideAddr(); a != "" {
		never = append(never, fmt.Sprintf("%s:%d", a, port))
	}
	for _, a := range never {
		if got := curlIn(t, m, id, "http://"+a+"/"); !strings.HasPrefix(got, "FAILED") {
			t.Errorf("BREACHED: %s reached from the sandbox: %q", a, got)
		}
	}
	// An allow list.
	if err := mechanism.UpdateEgress(ctx, m, id, []string{allowed, "198.51.100.0/24:7"}); err != nil {
		t.Fatalf("UpdateEgress: %v", err)
	}
	if got := curlIn(t, m, id, "https://"+allowed+"/"); got != "hello from "+allowed {
		t.Errorf("the allowed domain under the list: %q", got)
	}
	for _, c := range []struct {
		name string
		args []string
	}{
		{"another domain", []string{"https://" + denied + "/"}},
		{"a denied host's raw IP", []string{"-k", "https://" + deniedIP + "/"}},
		{"a forged SNI", []string{"--resolve", allowed + ":443:" + deniedIP, "https://" + allowed + "/"}},
		{"a forged Host", []string{"-H", "Host: " + allowed, "http://" + deniedIP + "/"}},
		{"the allowed address asked for another name", []string{"-k", "--resolve", denied + ":443:" + allowedIP, "https://" + denied + "/"}},
		{"DNS over TCP to an outside resolver", []string{"telnet://" + egresstest.Resolver}},
		{"the metadata address", []string{"http://169.254.169.254/"}},
	} {
		if got := curlIn(t, m, id, c.args...); !strings.HasPrefix(got, "FAILED") {
			t.Errorf("BREACHED (%s): %q", c.name, got)
		}
	}
	bash := func(script string) []byte {
		c, err := m.Execute(ctx, id, []string{"bash", "-c", script}, mechanism.ExecOptions{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatalf("bash: %v", err)
		}
		return c.Stdout
	}
	// The probe's control: the sandbox's own resolver answers it.
	if out := bash(udpDNSScript("127.0.0.53:53", allowed)); !bytes.Contains(out, []byte("ANSWERED")) {
		t.Errorf("the UDP DNS probe got no answer from the sandbox's own resolver (%q): it proves nothing", out)
	}
	if out := bash(udpDNSScript(egresstest.Resolver, allowed)); !bytes.Contains(out, []byte("SILENT")) && !bytes.Contains(out, []byte("NOSEND")) {
		t.Errorf("BREACHED: UDP DNS to an outside resolver: %q", out)
	}
	// A policy change cuts a live connection it no longer allows.
	sess := "exec 3<>/dev/tcp/" + allowedIP + "/7 || exit 9; echo one >&3; read -t 3 l <&3; echo got:$l; " +
		"read -t 20 go; echo two >&3; read -t 3 l <&3 && echo got:$l; echo end"
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	p, err := m.StartProcess(ctx, id, mechanism.ProcessSpec{Argv: []string{"bash", "-c", sess}, Stdin: inR, Stdout: outW})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		inW.Close()
		p.Wait()
		outW.Close()
	}()
	lines := make(chan string, 16)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				return "EOF"
			}
			return l
		case <-time.After(10 * time.Second):
			return "TIMEOUT"
		}
	}
	if l := next(); l != "got:one" {
		t.Fatalf("the live connection before the change: %q", l)
	}
	if err := mechanism.UpdateEgress(ctx, m, id, []string{allowed}); err != nil {
		t.Fatal(err)
	}
	io.WriteString(inW, "go\n")
	for l := next(); l != "end" && l != "EOF" && l != "TIMEOUT"; l = next() {
		if l == "got:two" {
			t.Errorf("BREACHED: a connection the new policy denies still carried data")
		}
	}
	if out := bash("exec 3<>/dev/tcp/" + allowedIP + "/7 && echo ping >&3 && timeout 3 head -c 4 <&3"); bytes.Contains(out, []byte("ping")) {
		t.Errorf("BREACHED: a new connection the new policy denies was echoed")
	}
	// allow: [] denies all.
	if err := mechanism.UpdateEgress(ctx, m, id, []string{}); err != nil {
		t.Fatal(err)
	}
	if got := curlIn(t, m, id, "https://"+allowed+"/"); !strings.HasPrefix(got, "FAILED") {
		t.Errorf("BREACHED: allow [] reached %s: %q", allowed, got)
	}
}
