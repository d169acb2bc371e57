package egress_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// box is a network namespace standing in for a sandbox, with its proxy.
type box struct {
	t     *testing.T
	in    *egresstest.Internet
	ns    int
	p     *egress.Proxy
	agent *agent // rootless: a process in the sandbox's namespaces dials (rootless_test.go)
}

// connect opens a socket connected to addr from inside the sandbox.
func (b *box) connect(network, addr string) (net.Conn, error) {
	if b.agent != nil {
		return b.agent.dial(network, addr)
	}
	var c net.Conn
	err := egresstest.In(b.ns, func() (err error) {
		c, err = net.DialTimeout(network, addr, 3*time.Second)
		return
	})
	return c, err
}

func newBox(t *testing.T, in *egresstest.Internet, allow []string) *box {
	t.Helper()
	testenv.RequireRoot(t)
	ns, err := egresstest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	var pol *egress.Policy
	if allow != nil {
		if pol, err = egress.ParsePolicy(allow); err != nil {
			t.Fatal(err)
		}
	}
	p, err := egress.AttachNetns(ns, pol, egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}})
	if err != nil {
		unix.Close(ns)
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); unix.Close(ns) })
	return &box{t: t, in: in, ns: ns, p: p}
}

// resolve asks the sandbox's resolver (or another server) from inside.
func (b *box) resolve(server, name string) ([]netip.Addr, int, error) {
	var addrs []netip.Addr
	rcode := -1
	err := func() error {
		c, err := b.connect("udp4", server)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		q := new(dns.Msg)
		q.SetQuestion(dns.Fqdn(name), dns.TypeA)
		dc := &dns.Conn{Conn: c}
		if err := dc.WriteMsg(q); err != nil {
			return err
		}
		r, err := dc.ReadMsg()
		if err != nil {
			return err
		}
		rcode = r.Rcode
		for _, rr := range r.Answer {
			if a, ok := rr.(*dns.A); ok {
				ad, _ := netip.AddrFromSlice(a.A.To4())
				addrs = append(addrs, ad)
			}
		}
		return nil
	}()
	return addrs, rcode, err
}

// dial connects from inside the sandbox.
func (b *box) dial(addr string) (net.Conn, error) { return b.connect("tcp4", addr) }

// get fetches / from addr with Host host over HTTP, or over TLS with
// SNI sni when sni != "", and returns the body's first line.
func (b *box) get(addr, host, sni string) (string, error) {
	c, err := b.dial(addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if sni != "" {
		tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: b.in.CA, InsecureSkipVerify: sni != host})
		if err := tc.Handshake(); err != nil {
			return "", err
		}
		c = tc
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host)
	body, err := io.ReadAll(c)
	if err != nil && len(body) == 0 {
		return "", err
	}
	s := string(body)
	if i := strings.Index(s, "hello from "); i >= 0 {
		s = s[i:]
		s, _, _ = strings.Cut(s, "\n")
		return s, nil
	}
	return "", fmt.Errorf("no greeting in %q", s)
}

func ip(name string) string { return egresstest.Hosts[name].String() }

func mustReach(t *testing.T, b *box, addr, host, sni string) {
	t.Helper()
	got, err := b.get(addr, host, sni)
	if err != nil || got != "hello from "+host {
		t.Errorf("get %s host %s sni %q = %q, %v; want it reached", addr, host, sni, got, err)
	}
}

func mustNotReach(t *testing.T, b *box, addr, host, sni string) {
	t.Helper()
	got, err := b.get(addr, host, sni)
	if err == nil || strings.HasPrefix(got, "hello") {
		t.Errorf("BREACHED: get %s host %s sni %q = %q, %v; want it refused", addr, host, sni, got, err)
	}
}

// refusedAtConnect: the sandbox's packet filter resets the connection
// before anything leaves.
func refusedAtConnect(t *testing.T, b *box, addr string) {
	t.Helper()
	c, err := b.dial(addr)
	if err == nil {
		c.Close()
		t.Errorf("BREACHED: connected to %s", addr)
		return
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("connect %s: %v, want connection refused", addr, err)
	}
}

// hostListener listens on every address of the host (not the fake
// internet): nothing in a sandbox may reach it.
func hostListener(t *testing.T) (net.Listener, []string) {
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from the host\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	var targets []string
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil {
			targets = append(targets, net.JoinHostPort(ipn.IP.String(), fmt.Sprint(port)))
		}
	}
	return ln, targets
}

func TestDefaultEgress(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	b := newBox(t, in, nil)
	addrs, rcode, err := b.resolve(egress.ResolverAddr+":53", egresstest.Allowed)
	if err != nil || rcode != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != egresstest.Hosts[egresstest.Allowed] {
		t.Fatalf("resolve through the sandbox's resolver = %v %d %v", addrs, rcode, err)
	}
	mustReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	mustReach(t, b, ip(egresstest.Denied)+":443", egresstest.Denied, egresstest.Denied)

	t.Run("HostLoopbackAndAddresses", func(t *testing.T) {
		_, targets := hostListener(t)
		for _, a := range targets {
			if strings.HasPrefix(a, "127.") {
				// In the sandbox 127.0.0.1 is its own loopback: nothing listens there.
				if c, err := b.dial(a); err == nil {
					c.Close()
					t.Errorf("BREACHED: connected to %s", a)
				}
				continue
			}
			refusedAtConnect(t, b, a)
		}
	})
	t.Run("MetadataAndLinkLocal", func(t *testing.T) {
		refusedAtConnect(t, b, "169.254.169.254:80")
		refusedAtConnect(t, b, "169.254.1.1:443")
	})
	t.Run("PrivateRanges", func(t *testing.T) {
		for _, a := range []string{"10.0.0.1:80", "172.16.0.1:80", "192.168.1.1:80", "100.64.0.1:80"} {
			refusedAtConnect(t, b, a)
		}
	})
	t.Run("OutsideResolverOverUDP", func(t *testing.T) {
		if _, _, err := b.resolve(egresstest.Resolver, egresstest.Allowed); err == nil {
			t.Errorf("BREACHED: UDP DNS to %s answered", egresstest.Resolver)
		}
	})
	t.Run("IPv6", func(t *testing.T) {
		err := egresstest.In(b.ns, func() error {
			c, err := net.DialTimeout("tcp6", "[2001:db8::1]:80", time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			t.Errorf("BREACHED: IPv6 connect succeeded")
		}
	})
	t.Run("ProxyPortItself", func(t *testing.T) {
		// Whatever listens on the sandbox's loopback for the proxy never
		// relays a connection that was not redirected to it.
		c, err := b.dial(fmt.Sprintf("127.0.0.1:%d", b.p.Port()))
		if err != nil {
			return // refused is fine too
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if n, err := c.Read(make([]byte, 1)); err == nil || n > 0 {
			t.Errorf("the proxy's own port relayed a connection that was not redirected")
		}
	})
}

func TestAnotherSandboxIsNotReachable(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	a := newBox(t, in, nil)
	b := newBox(t, in, nil)
	// b listens on its own address and loopback; a tries both.
	var ln net.Listener
	if err := egresstest.In(b.ns, func() (err error) { ln, err = net.Listen("tcp4", "0.0.0.0:8080"); return }); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("hello from b\n"))
			c.Close()
		}
	}()
	for _, addr := range []string{"127.0.0.1:8080", "10.0.2.15:8080"} {
		c, err := a.dial(addr)
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		got, _ := io.ReadAll(c)
		c.Close()
		if strings.Contains(string(got), "hello from b") {
			t.Errorf("BREACHED: sandbox a reached sandbox b at %s", addr)
		}
	}
}

func TestPolicy(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	b := newBox(t, in, []string{egresstest.Allowed})
	res := egress.ResolverAddr + ":53"
	if _, rc, err := b.resolve(res, egresstest.Denied); err != nil || rc != dns.RcodeRefused {
		t.Errorf("resolve a denied name = %d, %v; want REFUSED", rc, err)
	}
	t.Run("UnresolvedAllowedAddress", func(t *testing.T) {
		// Not resolved through the sandbox's resolver yet: the address
		// alone allows nothing.
		mustNotReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Allowed, egresstest.Allowed)
		refusedAtConnect(t, b, ip(egresstest.Allowed)+":443")
	})
	if _, rc, err := b.resolve(res, egresstest.Allowed); err != nil || rc != dns.RcodeSuccess {
		t.Fatalf("resolve an allowed name = %d, %v", rc, err)
	}
	t.Run("AllowedDomain", func(t *testing.T) {
		mustReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Allowed, egresstest.Allowed)
		mustReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	})
	t.Run("RawIPOfDeniedHost", func(t *testing.T) {
		mustNotReach(t, b, ip(egresstest.Denied)+":443", egresstest.Denied, egresstest.Denied)
		mustNotReach(t, b, ip(egresstest.Denied)+":80", egresstest.Denied, "")
		// Reset at connect: no entry and no resolved name can allow it.
		refusedAtConnect(t, b, ip(egresstest.Denied)+":443")
		refusedAtConnect(t, b, egresstest.Resolver)
	})
	t.Run("ForgedSNI", func(t *testing.T) {
		// The allowed name presented to the denied host's address.
		mustNotReach(t, b, ip(egresstest.Denied)+":443", egresstest.Allowed, egresstest.Allowed)
		mustNotReach(t, b, ip(egresstest.Denied)+":80", egresstest.Allowed, "")
	})
	t.Run("AllowedAddressOtherName", func(t *testing.T) {
		// The allowed host's address, asked for another name.
		mustNotReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Denied, egresstest.Denied)
		mustNotReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Denied, "")
	})
	t.Run("OutsideResolver", func(t *testing.T) {
		if _, _, err := b.resolve(egresstest.Resolver, egresstest.Denied); err == nil {
			t.Errorf("BREACHED: UDP DNS to an outside resolver answered")
		}
		c, err := b.dial(egresstest.Resolver)
		if err == nil {
			c.SetDeadline(time.Now().Add(2 * time.Second))
			q := new(dns.Msg)
			q.SetQuestion(dns.Fqdn(egresstest.Denied), dns.TypeA)
			dc := &dns.Conn{Conn: c}
			if dc.WriteMsg(q) == nil {
				if r, err := dc.ReadMsg(); err == nil {
					t.Errorf("BREACHED: TCP DNS to an outside resolver answered %v", r.Answer)
				}
			}
			c.Close()
		}
	})
	t.Run("Metadata", func(t *testing.T) {
		refusedAtConnect(t, b, "169.254.169.254:80")
	})
}

func TestPolicyForms(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	res := egress.ResolverAddr + ":53"
	t.Run("Wildcard", func(t *testing.T) {
		b := newBox(t, in, []string{"*." + egresstest.Allowed})
		if _, rc, _ := b.resolve(res, egresstest.Allowed); rc != dns.RcodeRefused {
			t.Errorf("*.%s resolved the apex: rcode %d", egresstest.Allowed, rc)
		}
		if _, rc, err := b.resolve(res, egresstest.APIAllowed); rc != dns.RcodeSuccess {
			t.Fatalf("resolve %s: %d %v", egresstest.APIAllowed, rc, err)
		}
		mustReach(t, b, ip(egresstest.APIAllowed)+":443", egresstest.APIAllowed, egresstest.APIAllowed)
	})
	t.Run("Port", func(t *testing.T) {
		b := newBox(t, in, []string{egresstest.Allowed + ":443"})
		if _, rc, err := b.resolve(res, egresstest.Allowed); rc != dns.RcodeSuccess {
			t.Fatalf("resolve: %d %v", rc, err)
		}
		mustReach(t, b, ip(egresstest.Allowed)+":443", egresstest.Allowed, egresstest.Allowed)
		mustNotReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	})
	t.Run("CIDR", func(t *testing.T) {
		b := newBox(t, in, []string{"203.0.113.0/24:80"})
		mustReach(t, b, ip(egresstest.Denied)+":80", egresstest.Denied, "")
		mustNotReach(t, b, ip(egresstest.Denied)+":443", egresstest.Denied, egresstest.Denied)
		mustNotReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	})
	t.Run("EmptyDeniesAll", func(t *testing.T) {
		b := newBox(t, in, []string{})
		if _, rc, _ := b.resolve(res, egresstest.Allowed); rc != dns.RcodeRefused {
			t.Errorf("allow [] resolved a name: rcode %d", rc)
		}
		for _, h := range []string{egresstest.Allowed, egresstest.Denied} {
			refusedAtConnect(t, b, ip(h)+":80")
			refusedAtConnect(t, b, ip(h)+":443")
		}
	})
}

// echo opens a connection to the echo port of host and checks it works.
func echo(t *testing.T, b *box, addr string) net.Conn {
	t.Helper()
	c, err := b.dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping\n" {
		t.Fatalf("echo through the proxy: %q %v", buf, err)
	}
	return c
}

func TestPolicyChangeCutsLiveConnections(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	b := newBox(t, in, nil)
	kept := echo(t, b, ip(egresstest.Denied)+":7")
	defer kept.Close()
	cut := echo(t, b, ip(egresstest.Allowed)+":7")
	defer cut.Close()
	// Through the control socket, as another process would.
	sock := t.TempDir() + "/egress.sock"
	if err := b.p.ServeControl(sock); err != nil {
		t.Fatal(err)
	}
	if err := egress.Apply(context.Background(), sock, []string{"203.0.113.0/24"}); err != nil {
		t.Fatal(err)
	}
	cut.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := cut.Write([]byte("ping\n")); err == nil {
		buf := make([]byte, 5)
		if n, err := io.ReadFull(cut, buf); err == nil {
			t.Errorf("BREACHED: a connection the new policy denies still carries data (%q)", buf[:n])
		}
	}
	kept.SetDeadline(time.Now().Add(2 * time.Second))
	kept.Write([]byte("ping\n"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(kept, buf); err != nil {
		t.Errorf("a connection the new policy allows was cut: %v", err)
	}
	// New connections: at once.
	mustNotReach(t, b, ip(egresstest.Allowed)+":80", egresstest.Allowed, "")
	if err := egress.Apply(context.Background(), sock, []string{"bad entry!"}); err == nil || !strings.Contains(err.Error(), "bad entry!") {
		t.Errorf("Apply of a bad entry = %v, want it named", err)
	}
}

func TestConnectionBound(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	ns, err := egresstest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ns)
	p, err := egress.AttachNetns(ns, nil, egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}, MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	flood := &box{t: t, in: in, ns: ns, p: p}
	other := newBox(t, in, nil)
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for range 8 {
		held = append(held, echo(t, flood, ip(egresstest.Allowed)+":7"))
	}
	// The ninth of the flooding sandbox is refused; the other sandbox is not affected.
	if c, err := flood.dial(ip(egresstest.Allowed) + ":7"); err == nil {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		c.Write([]byte("ping\n"))
		if _, err := io.ReadFull(c, make([]byte, 5)); err == nil {
			t.Errorf("a connection past MaxConns was relayed")
		}
		c.Close()
	}
	echo(t, other, ip(egresstest.Allowed)+":7").Close()
}

// TestConnectionRate: a sandbox opening connections as fast as it can
// gets ConnRate of them relayed (and bursts), the rest reset, and another
// sandbox is not affected.
func TestConnectionRate(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	ns, err := egresstest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ns)
	p, err := egress.AttachNetns(ns, nil, egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}, ConnRate: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	flood := &box{t: t, in: in, ns: ns, p: p}
	other := newBox(t, in, nil)
	addr := ip(egresstest.Allowed) + ":7"
	relayed := 0
	began := time.Now()
	for range 200 {
		c, err := flood.dial(addr)
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err == nil {
			if _, err := io.ReadFull(c, make([]byte, 5)); err == nil {
				relayed++
			}
		}
		c.Close()
	}
	max := 21 + int(10*time.Since(began).Seconds()) + 1 // the burst, then 10 a second
	if relayed > max || relayed == 0 {
		t.Errorf("%d of 200 connections relayed in %v, want between 1 and %d", relayed, time.Since(began), max)
	}
	echo(t, other, addr).Close()
}

// TestMainThreadKeepsItsNamespace: entering sandboxes' namespaces on
// locked threads (Attach, the stand-in internet) never leaves the
// process's main thread in one: Go cannot end that thread, so a
// goroutine that exited locked to it would wedge it there, and
// /proc/PID/ns/net (the main thread's) would name a sandbox's namespace
// for good (seen: TestPublishPorts, which publishes into this process's
// own namespace, echoed nothing).
func TestMainThreadKeepsItsNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	before, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	in := egresstest.New(t)
	for range 20 {
		newBox(t, in, nil)
		for range 10 {
			_ = egresstest.In(in.NS, func() error { return nil })
		}
	}
	if after, _ := os.Readlink("/proc/self/ns/net"); after != before {
		t.Errorf("the main thread's network namespace is %s, was %s", after, before)
	}
}
