package egress_test

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/mechanism/egress/egresstest"
)

// front is a server at allowed.example:8080 of the fake internet that
// keeps connections alive, answers "host=HOST", accepts a WebSocket
// upgrade (then echoes) on /ws and refuses one elsewhere, and is a
// forward proxy for CONNECT (to the fake internet's hosts).
type front struct {
	mu       sync.Mutex
	hosts    []string // the Host of every request it got
	upgrades []string // the Upgrade header of every request
	tunneled atomic.Int64
}

func (f *front) seen() ([]string, []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string{}, f.hosts...), append([]string{}, f.upgrades...)
}

func newFront(t *testing.T, in *egresstest.Internet) *front {
	t.Helper()
	f := &front{}
	var ln net.Listener
	if err := egresstest.In(in.NS, func() (err error) {
		ln, err = net.Listen("tcp4", ip(egresstest.Allowed)+":8080")
		return
	}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.hosts = append(f.hosts, r.Host)
		f.upgrades = append(f.upgrades, r.Header.Get("Upgrade"))
		f.mu.Unlock()
		switch {
		case r.Method == http.MethodConnect:
			name, port, _ := net.SplitHostPort(r.Host)
			out, err := in.Dial(r.Context(), "tcp4", egresstest.Hosts[name].String()+":"+port)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			c, brw, _ := http.NewResponseController(w).Hijack()
			io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			wg.Add(1)
			go func() {
				defer wg.Done()
				io.Copy(c, out)
				c.Close()
			}()
			n, _ := io.Copy(out, brw)
			f.tunneled.Add(n)
			out.Close()
		case r.Header.Get("Upgrade") == "websocket" && r.URL.Path == "/ws":
			c, brw, _ := http.NewResponseController(w).Hijack()
			defer c.Close()
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
			io.Copy(c, brw)
		case r.Header.Get("Upgrade") != "":
			http.Error(w, "no upgrade here", http.StatusBadRequest)
		default:
			io.Copy(io.Discard, r.Body)
			fmt.Fprintf(w, "host=%s", r.Host)
		}
	})}
	wg.Add(1)
	go func() { defer wg.Done(); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close(); wg.Wait() })
	return f
}

// TestEveryRequestIsChecked: on a plain HTTP connection allowed by name,
// a later request (kept alive, pipelined, smuggled past a body framed
// two ways, or naming another host in its URI) that names another host
// is refused: the server never gets it, the sandbox gets a 403 that
// says its egress policy refused it. A CONNECT tunnel must carry TLS
// whose SNI is the CONNECT host: another SNI, or none, is refused before
// a byte of it is tunneled; the right one works end to end. A WebSocket
// upgrade the server accepts becomes a raw relay, one it refuses leaves
// the connection checked; an h2c upgrade is dropped. (Fails on the old
// code: the second request reached the server.)
func TestEveryRequestIsChecked(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	fr := newFront(t, in)
	b := newBox(t, in, []string{egresstest.Allowed})
	if _, rc, err := b.resolve(egress.ResolverAddr+":53", egresstest.Allowed); err != nil || rc != dns.RcodeSuccess {
		t.Fatalf("resolve: %d %v", rc, err)
	}
	addr := ip(egresstest.Allowed) + ":8080"
	open := func(t *testing.T) (net.Conn, *bufio.Reader) {
		t.Helper()
		c, err := b.dial(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	answer := func(t *testing.T, br *bufio.Reader) (int, string, http.Header) {
		t.Helper()
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return 0, err.Error(), nil
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(body), resp.Header
	}
	refused := func(t *testing.T, br *bufio.Reader, what string) {
		t.Helper()
		code, body, h := answer(t, br)
		if code != 403 || h.Get("X-Managoat-Egress") != "refused" || !strings.Contains(body, "egress policy refused") {
			t.Errorf("BREACHED? %s = %d %q, want 403 refused by the egress policy", what, code, body)
		}
		if _, err := br.ReadByte(); err != io.EOF && !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("after the refusal the connection is not closed: %v", err)
		}
	}
	neverSeen := func(t *testing.T) {
		t.Helper()
		hosts, _ := fr.seen()
		for _, h := range hosts {
			if strings.Contains(h, egresstest.Denied) {
				t.Errorf("BREACHED: the server got a request for %q (all: %q)", h, hosts)
			}
		}
	}
	req := func(host string) string { return "GET / HTTP/1.1\r\nHost: " + host + "\r\n\r\n" }

	t.Run("KeepAlive", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, req(egresstest.Allowed))
		if code, body, _ := answer(t, br); code != 200 || body != "host="+egresstest.Allowed {
			t.Fatalf("first request = %d %q", code, body)
		}
		io.WriteString(c, req(egresstest.Allowed+":8080"))
		if code, body, _ := answer(t, br); code != 200 {
			t.Fatalf("second request, same host = %d %q", code, body)
		}
		io.WriteString(c, req(egresstest.Denied))
		refused(t, br, "a kept-alive request for "+egresstest.Denied)
		neverSeen(t)
	})
	t.Run("Pipelined", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, req(egresstest.Allowed)+req(egresstest.Denied))
		if code, _, _ := answer(t, br); code != 200 {
			t.Fatalf("first request = %d", code)
		}
		refused(t, br, "a pipelined request for "+egresstest.Denied)
		neverSeen(t)
	})
	t.Run("Smuggled", func(t *testing.T) {
		// Content-Length says 4 and chunked says 0: a server that went by
		// the length would read the GET below as a request of its own.
		c, br := open(t)
		io.WriteString(c, "POST / HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"+req(egresstest.Denied))
		if code, _, _ := answer(t, br); code != 200 {
			t.Fatalf("the POST = %d", code)
		}
		refused(t, br, "a request smuggled after a body")
		neverSeen(t)
	})
	t.Run("AbsoluteURI", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, req(egresstest.Allowed)+"GET http://"+egresstest.Denied+"/ HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\n\r\n")
		if code, _, _ := answer(t, br); code != 200 {
			t.Fatalf("first request = %d", code)
		}
		refused(t, br, "a request whose URI names "+egresstest.Denied)
		neverSeen(t)
	})
	t.Run("ConnectOtherHost", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, "CONNECT "+egresstest.Denied+":443 HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\n\r\n")
		refused(t, br, "CONNECT "+egresstest.Denied)
		neverSeen(t)
	})
	connect := func(t *testing.T, sni string) (*tls.Conn, error) {
		c, br := open(t)
		io.WriteString(c, "CONNECT "+egresstest.Allowed+":443 HTTP/1.1\r\nHost: "+egresstest.Allowed+":443\r\n\r\n")
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("CONNECT = %v, %v", resp, err)
		}
		tc := tls.Client(c, &tls.Config{ServerName: sni, RootCAs: in.CA, InsecureSkipVerify: sni != egresstest.Allowed})
		return tc, tc.Handshake()
	}
	t.Run("ConnectSNI", func(t *testing.T) {
		for _, sni := range []string{egresstest.Denied, ""} {
			before := fr.tunneled.Load()
			if _, err := connect(t, sni); err == nil {
				t.Errorf("BREACHED: TLS with SNI %q through a CONNECT to %s", sni, egresstest.Allowed)
			}
			for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if hosts, _ := fr.seen(); len(hosts) > 0 {
					break
				}
			}
			if n := fr.tunneled.Load() - before; n != 0 {
				t.Errorf("BREACHED: %d bytes of a ClientHello with SNI %q went through the tunnel", n, sni)
			}
		}
		tc, err := connect(t, egresstest.Allowed)
		if err != nil {
			t.Fatalf("TLS with SNI %s through its CONNECT: %v", egresstest.Allowed, err)
		}
		io.WriteString(tc, req(egresstest.Allowed))
		if code, body, _ := answer(t, bufio.NewReader(tc)); code != 200 || !strings.HasPrefix(body, "hello from "+egresstest.Allowed) {
			t.Errorf("GET in the tunnel = %d %q", code, body)
		}
	})
	t.Run("WebSocket", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade = %v, %v", resp, err)
		}
		// Raw now: bytes that look like a request for another host are
		// the application's.
		io.WriteString(c, req(egresstest.Denied))
		b := make([]byte, len(req(egresstest.Denied)))
		if _, err := io.ReadFull(br, b); err != nil || string(b) != req(egresstest.Denied) {
			t.Errorf("echo over the upgraded connection = %q, %v", b, err)
		}
	})
	t.Run("UpgradeRefused", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, "GET /other HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		if code, _, _ := answer(t, br); code != 400 {
			t.Fatalf("a refused upgrade = %d", code)
		}
		io.WriteString(c, req(egresstest.Denied))
		refused(t, br, "a request after a refused upgrade")
		neverSeen(t)
	})
	t.Run("NotHTTPAnswers", func(t *testing.T) {
		// An echo server answers a request with the request: the answers
		// cannot be followed, and are relayed raw.
		c, err := b.dial(ip(egresstest.Allowed) + ":7")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req(egresstest.Allowed))
		got := make([]byte, len(req(egresstest.Allowed)))
		if _, err := io.ReadFull(c, got); err != nil || string(got) != req(egresstest.Allowed) {
			t.Errorf("the echo = %q, %v", got, err)
		}
	})
	t.Run("H2CDropped", func(t *testing.T) {
		c, br := open(t)
		io.WriteString(c, "GET /h2c HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n")
		if code, _, _ := answer(t, br); code != 200 {
			t.Errorf("a request that asked for h2c = %d, want answered over HTTP/1.1", code)
		}
		if _, ups := fr.seen(); slices.Contains(ups, "h2c") {
			t.Errorf("BREACHED: the server was offered h2c")
		}
	})

}

// TestRefusalsSaySo: what the policy refuses says it is the sandbox's
// policy: a lookup of a denied name is REFUSED with an Extended DNS
// Error "Prohibited" naming the egress policy (to a query with EDNS),
// and the lookup and a refused request are Refusals, told to
// Config.OnRefusal and kept by Refusals. (Fails on the old code: no EDE,
// no Refusal.)
func TestRefusalsSaySo(t *testing.T) {
	testenv.RequireRoot(t)
	in := egresstest.New(t)
	newFront(t, in)
	ns, err := egresstest.NewNetns()
	if err != nil {
		t.Fatal(err)
	}
	pol, _ := egress.ParsePolicy([]string{egresstest.Allowed})
	var mu sync.Mutex
	var told []egress.Refusal
	p, err := egress.AttachNetns(ns, pol, egress.Config{Dial: in.Dial, Resolvers: []string{in.DNS}, OnRefusal: func(r egress.Refusal) {
		mu.Lock()
		told = append(told, r)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close(); unix.Close(ns) })
	b := &box{t: t, in: in, ns: ns, p: p}

	c, err := b.connect("udp4", egress.ResolverAddr+":53")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(3 * time.Second))
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(egresstest.Denied), dns.TypeA)
	q.SetEdns0(1232, false)
	dc := &dns.Conn{Conn: c}
	if err := dc.WriteMsg(q); err != nil {
		t.Fatal(err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		t.Fatal(err)
	}
	var ede *dns.EDNS0_EDE
	if opt := r.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if e, ok := o.(*dns.EDNS0_EDE); ok {
				ede = e
			}
		}
	}
	if r.Rcode != dns.RcodeRefused || ede == nil || ede.InfoCode != dns.ExtendedErrorCodeProhibited || !strings.Contains(ede.ExtraText, "egress policy") {
		t.Errorf("a denied lookup = %s, EDE %v; want REFUSED, EDE 18 naming the egress policy", dns.RcodeToString[r.Rcode], ede)
	}
	if _, rc, err := b.resolve(egress.ResolverAddr+":53", egresstest.Allowed); err != nil || rc != dns.RcodeSuccess {
		t.Fatalf("resolve: %d %v", rc, err)
	}
	hc, err := b.dial(ip(egresstest.Allowed) + ":8080")
	if err != nil {
		t.Fatal(err)
	}
	defer hc.Close()
	hc.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(hc, "GET / HTTP/1.1\r\nHost: "+egresstest.Allowed+"\r\n\r\nGET / HTTP/1.1\r\nHost: "+egresstest.Denied+"\r\n\r\n")
	io.ReadAll(hc)
	var kept []egress.Refusal
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if kept, _ = p.Refusals(); len(kept) >= 2 {
			break
		}
	}
	if len(kept) != 2 || kept[0].What != "lookup" || kept[0].Name != egresstest.Denied || kept[1].What != "request" || !strings.Contains(kept[1].Why, egresstest.Denied) {
		t.Errorf("Refusals = %v, want the lookup and the request", kept)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 2 || told[0].String() == "" || !strings.Contains(told[1].String(), "refused request") {
		t.Errorf("told = %v", told)
	}
}
