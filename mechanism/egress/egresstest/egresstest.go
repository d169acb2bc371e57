// Package egresstest builds a stand-in for the internet for tests of
// sandbox egress: a network namespace of its own with a DNS server, HTTP
// servers and TLS servers on documentation addresses (RFC 5737), reached
// through Internet.Dial, so that nothing a test does leaves the machine
// and the host's own network is never changed.
//
//	in := egresstest.New(t) // root: it makes a network namespace
//	cfg := egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}}
package egresstest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The names the fake internet serves, and their addresses.
const (
	Allowed    = "allowed.example"     // 198.51.100.10
	APIAllowed = "api.allowed.example" // 198.51.100.12
	Denied     = "denied.example"      // 203.0.113.20
	Resolver   = "198.51.100.53:53"    // its DNS server
)

// Hosts maps each name to its address.
var Hosts = map[string]netip.Addr{
	Allowed:    netip.MustParseAddr("198.51.100.10"),
	APIAllowed: netip.MustParseAddr("198.51.100.12"),
	Denied:     netip.MustParseAddr("203.0.113.20"),
}

// Internet is the fake internet: every host answers HTTP on port 80 with
// "hello from NAME" and HTTPS on 443 the same (a certificate for every
// name, signed by CA), and echoes on port 7.
type Internet struct {
	NS  int    // its network namespace
	DNS string // its resolver, "ip:53"
	CA  *x509.CertPool
	// CAPEM is CA in PEM, for a client inside a sandbox.
	CAPEM []byte

	mu      sync.Mutex
	closers []func()
	wg      sync.WaitGroup

	dialPath string // in a run of Unprivileged: the parent's dial socket
}

// New builds an Internet that lives until t ends. It needs root.
func New(t testing.TB) *Internet {
	t.Helper()
	fd, err := NewNetns()
	if err != nil {
		t.Fatalf("egresstest: network namespace: %v", err)
	}
	in := &Internet{NS: fd, DNS: Resolver}
	t.Cleanup(in.close)
	err = In(fd, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		for _, a := range append(addrList(), netip.MustParseAddrPort(Resolver).Addr()) {
			ad, _ := netlink.ParseAddr(a.String() + "/32")
			if err := h.AddrAdd(lo, ad); err != nil && err != unix.EEXIST {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("egresstest: addresses: %v", err)
	}
	cert, pool, caPEM, err := certs()
	if err != nil {
		t.Fatal(err)
	}
	in.CA, in.CAPEM = pool, caPEM
	for name, a := range Hosts {
		name := name
		h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", name)
		})
		in.serveHTTP(t, a, 80, h, nil)
		in.serveHTTP(t, a, 443, h, &tls.Config{Certificates: []tls.Certificate{cert}})
		in.serveEcho(t, a, 7)
	}
	in.serveDNS(t)
	return in
}

func addrList() []netip.Addr {
	var out []netip.Addr
	for _, a := range Hosts {
		out = append(out, a)
	}
	return out
}

func (in *Internet) onClose(f func()) {
	in.mu.Lock()
	in.closers = append(in.closers, f)
	in.mu.Unlock()
}

func (in *Internet) close() {
	in.mu.Lock()
	cs := in.closers
	in.closers = nil
	in.mu.Unlock()
	for i := len(cs) - 1; i >= 0; i-- {
		cs[i]()
	}
	in.wg.Wait()
	unix.Close(in.NS)
}

func (in *Internet) listen(t testing.TB, network, addr string) net.Listener {
	var ln net.Listener
	err := In(in.NS, func() (err error) { ln, err = net.Listen(network, addr); return })
	if err != nil {
		t.Fatalf("egresstest: listen %s: %v", addr, err)
	}
	return ln
}

func (in *Internet) serveHTTP(t testing.TB, a netip.Addr, port int, h http.Handler, tc *tls.Config) {
	ln := in.listen(t, "tcp4", netip.AddrPortFrom(a, uint16(port)).String())
	if tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: nil}
	srv.SetKeepAlivesEnabled(false)
	in.wg.Add(1)
	go func() { defer in.wg.Done(); _ = srv.Serve(ln) }()
	in.onClose(func() { srv.Close() })
}

func (in *Internet) serveEcho(t testing.TB, a netip.Addr, port int) {
	ln := in.listen(t, "tcp4", netip.AddrPortFrom(a, uint16(port)).String())
	var conns sync.Map
	in.wg.Add(1)
	go func() {
		defer in.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Store(c, true)
			in.wg.Add(1)
			go func() {
				defer in.wg.Done()
				defer conns.Delete(c)
				defer c.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	in.onClose(func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	})
}

func (in *Internet) serveDNS(t testing.TB) {
	var pc net.PacketConn
	if err := In(in.NS, func() (err error) { pc, err = net.ListenPacket("udp4", in.DNS); return }); err != nil {
		t.Fatalf("egresstest: dns: %v", err)
	}
	ln := in.listen(t, "tcp4", in.DNS)
	h := dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		r := new(dns.Msg)
		r.SetReply(q)
		for _, qs := range q.Question {
			name := strings.TrimSuffix(strings.ToLower(qs.Name), ".")
			a, ok := Hosts[name]
			if !ok {
				r.Rcode = dns.RcodeNameError
				continue
			}
			if qs.Qtype == dns.TypeA {
				r.Answer = append(r.Answer, &dns.A{Hdr: dns.RR_Header{Name: qs.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60}, A: a.AsSlice()})
			}
		}
		_ = w.WriteMsg(r)
	})
	udp := &dns.Server{PacketConn: pc, Handler: h}
	tcp := &dns.Server{Listener: ln, Handler: h}
	for _, s := range []*dns.Server{udp, tcp} {
		in.wg.Add(1)
		go func() { defer in.wg.Done(); _ = s.ActivateAndServe() }()
		in.onClose(func() { _ = s.Shutdown() })
	}
}

// Dial dials inside the fake internet (for egress.Config.Dial).
func (in *Internet) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if in.dialPath != "" {
		return dialVia(ctx, in.dialPath, network, addr)
	}
	var c net.Conn
	err := In(in.NS, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, network, addr)
		return
	})
	return c, err
}

// NewNetns makes a network namespace with lo up and returns a
// descriptor of it.
func NewNetns() (int, error) {
	type res struct {
		fd  int
		err error
	}
	ch := make(chan res, 1)
	go func() {
		runtime.LockOSThread() // never unlocked but on the main thread: the thread ends with this goroutine
		leave, err := enter(func() error { return unix.Unshare(unix.CLONE_NEWNET) })
		if err != nil {
			ch <- res{-1, err}
			return
		}
		if h, err := netlink.NewHandle(); err == nil {
			if lo, err := h.LinkByName("lo"); err == nil {
				_ = h.LinkSetUp(lo)
			}
			h.Close()
		}
		fd, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		leave()
		ch <- res{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

// In runs f on a thread in the network namespace fd; sockets f makes
// live there.
func In(fd int, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked but on the main thread: the thread ends with this goroutine
		leave, err := enter(func() error { return unix.Setns(fd, unix.CLONE_NEWNET) })
		if err != nil {
			errc <- err
			return
		}
		err = f()
		leave()
		errc <- err
	}()
	return <-errc
}

// enter runs move (which changes the locked calling thread's network
// namespace). Go cannot end the process's main thread (a goroutine that
// exits locked to it wedges it where it is, and /proc/PID/ns/net, the
// main thread's, would name the namespace for good), so there leave puts
// it back and unlocks it; elsewhere leave does nothing and the thread
// ends with its goroutine.
func enter(move func() error) (leave func(), err error) {
	if unix.Gettid() != unix.Getpid() {
		return func() {}, move()
	}
	back, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := move(); err != nil {
		unix.Close(back)
		runtime.UnlockOSThread()
		return nil, err
	}
	return func() {
		if unix.Setns(back, unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		unix.Close(back)
	}, nil
}

// certs makes a CA and a certificate for every name of Hosts.
func certs() (tls.Certificate, *x509.CertPool, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "egresstest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	var names []string
	for n := range Hosts {
		names = append(names, n)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: Allowed}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool, caPEM, nil
}
