package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"time"
)

// A plain HTTP connection that only a domain entry allows is relayed
// request by request (relayHTTP): each request the sandbox sends is
// parsed (net/http's strict parser: one Content-Length, or chunked, never
// both) and must name the host the connection was allowed by; it is
// then written anew from what was parsed, so the server reads exactly
// the request that was checked (no byte of a smuggled second request
// hides in a body). The answers are relayed as they come and parsed
// only to follow the exchange: an Upgrade (a WebSocket) becomes a raw
// relay once the server answers 101, and a CONNECT once it answers 2xx,
// when the tunnel must carry TLS whose ClientHello names the CONNECT
// host (SNI); other upgrades (h2c, whose streams could name any host)
// are dropped from the request. The first request that names another
// host, or a tunnel that does not carry TLS with that SNI, is refused:
// nothing of it leaves, the server's answers to the requests before it
// are relayed to their end, then the sandbox gets a 403 that says the
// sandbox's egress policy refused it, and the connection is closed.

// maxHead bounds the bytes read for one request head (or ClientHello)
// of a connection inspected by name, beyond the reader's own buffer.
const maxHead = 64 << 10

// headLimit bounds what is read from a connection while a head is read
// (head), and not while a body is (body).
type headLimit struct {
	r    io.Reader
	left int64
}

var errHeadTooLarge = errors.New("request head too large")

func (l *headLimit) Read(b []byte) (int, error) {
	if l.left <= 0 {
		return 0, errHeadTooLarge
	}
	if int64(len(b)) > l.left {
		b = b[:l.left]
	}
	n, err := l.r.Read(b)
	l.left -= int64(n)
	return n, err
}

const sniffBuffer = 16 << 10

func (l *headLimit) head() { l.left = maxHead + sniffBuffer }
func (l *headLimit) body() { l.left = math.MaxInt64 }

// peeked is what sniff read of a connection.
type peeked struct {
	name string
	pre  []byte        // TLS: every byte read, to be sent on first
	req  *http.Request // HTTP: the first request, to be written anew
	br   *bufio.Reader // HTTP: the connection past it
	lim  *headLimit
}

// sniff reads the start of a connection, the TLS ClientHello or the HTTP
// request head, within timeout: the name it asks for (SNI, or Host
// without a port) and what to send on.
func sniff(c net.Conn, timeout time.Duration) (peeked, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	lim := &headLimit{r: c}
	lim.head()
	br := bufio.NewReaderSize(lim, sniffBuffer)
	first, err := br.Peek(1)
	if err != nil {
		return peeked{}, err
	}
	if first[0] == 0x16 { // a TLS handshake record
		name, pre := sniffTLS(br)
		if n := br.Buffered(); n > 0 {
			rest, _ := br.Peek(n)
			pre = append(pre, rest...)
		}
		return peeked{name: name, pre: pre}, nil
	}
	req, err := http.ReadRequest(br)
	lim.body()
	if err != nil {
		return peeked{}, err
	}
	return peeked{name: requestHost(req), req: req, br: br, lim: lim}, nil
}

// errSniffed stops the TLS handshake once the ClientHello is read.
var errSniffed = errors.New("sniffed")

// sniffTLS reads a TLS ClientHello from br and returns the name it asks
// for ("" for none) and the bytes it took from br.
func sniffTLS(br *bufio.Reader) (string, []byte) {
	var rec bytes.Buffer
	var name string
	hs := tls.Server(readOnly{r: io.TeeReader(br, &rec)}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		name = h.ServerName
		return nil, errSniffed
	}})
	_ = hs.Handshake()
	return canonName(name), rec.Bytes()
}

// requestHost is the host a request names (its absolute URI's, else its
// Host header's), without a port.
func requestHost(req *http.Request) string {
	h := req.Host
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	return canonName(h)
}

// switches says whether req asks to leave HTTP (a CONNECT, a WebSocket
// upgrade), so what follows depends on the answer.
func switches(req *http.Request) bool {
	return req.Method == http.MethodConnect || isWebSocket(req)
}

func isWebSocket(req *http.Request) bool {
	return strings.EqualFold(req.Header.Get("Upgrade"), "websocket") && hasToken(req.Header["Connection"], "upgrade")
}

func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// dropUpgrade removes an upgrade other than a WebSocket from req (h2c:
// an HTTP/2 connection's streams would each name their own host).
func dropUpgrade(req *http.Request) {
	if req.Header.Get("Upgrade") == "" || isWebSocket(req) {
		return
	}
	req.Header.Del("Upgrade")
	req.Header.Del("Http2-Settings")
	var keep []string
	for _, v := range req.Header["Connection"] {
		for _, t := range strings.Split(v, ",") {
			if t = strings.TrimSpace(t); t != "" && !strings.EqualFold(t, "upgrade") && !strings.EqualFold(t, "http2-settings") {
				keep = append(keep, t)
			}
		}
	}
	req.Header.Del("Connection")
	if len(keep) > 0 {
		req.Header.Set("Connection", strings.Join(keep, ", "))
	}
}

// flushWriter flushes each write (a body streams).
type flushWriter struct{ w *bufio.Writer }

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.w.Flush()
	}
	return n, err
}

// writeRequest writes req anew on w: its line as it came, Host, the
// headers it was parsed with, and its body framed as it was parsed.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	_, hadLength := req.Header["Content-Length"]
	chunked := len(req.TransferEncoding) > 0
	req.Header.Del("Content-Length")
	req.Header.Del("Transfer-Encoding")
	fmt.Fprintf(w, "%s %s HTTP/%d.%d\r\n", req.Method, req.RequestURI, req.ProtoMajor, req.ProtoMinor)
	if req.Host != "" {
		fmt.Fprintf(w, "Host: %s\r\n", req.Host)
	}
	if err := req.Header.Write(w); err != nil {
		return err
	}
	switch {
	case chunked:
		w.WriteString("Transfer-Encoding: chunked\r\n")
	case req.ContentLength > 0 || hadLength:
		fmt.Fprintf(w, "Content-Length: %d\r\n", req.ContentLength)
	}
	w.WriteString("\r\n")
	if err := w.Flush(); err != nil { // before the body: Expect: 100-continue
		return err
	}
	if req.Body == nil || req.Body == http.NoBody {
		return nil
	}
	if !chunked {
		_, err := io.Copy(flushWriter{w}, req.Body)
		return err
	}
	cw := httputil.NewChunkedWriter(flushWriter{w})
	if _, err := io.Copy(cw, req.Body); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return err
	}
	if err := req.Trailer.Write(w); err != nil {
		return err
	}
	w.WriteString("\r\n")
	return w.Flush()
}

// refusal is why relayHTTP refused a request (why "" for none); answer
// says whether the sandbox is answered 403 (not in a tunnel, where it
// expects TLS).
type refusal struct {
	why    string
	answer bool
}

// relayHTTP relays a plain HTTP connection allowed by name, whose first
// request (read by sniff) is pk.req, checking each request (see above).
// It returns when both ways are done; the caller closes both.
func (p *Proxy) relayHTTP(c *net.TCPConn, out net.Conn, pk peeked, name string) refusal {
	x := &exchange{sent: make(chan *http.Request, 64), verdict: make(chan bool, 1), lost: make(chan struct{}), answered: make(chan struct{})}
	go func() {
		defer close(x.answered)
		x.relayAnswers(c, out)
		_ = c.CloseRead() // the server is done: so is a request being read
	}()
	r := p.relayRequests(pk, out, name, x)
	close(x.sent)
	if cw, ok := out.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	<-x.answered
	if r.answer {
		refuseHTTP(c, r.why)
	}
	_ = c.CloseWrite()
	return r
}

// exchange is what the two ways of relayHTTP share.
type exchange struct {
	sent     chan *http.Request // requests written, in order, for relayAnswers
	verdict  chan bool          // whether a request that switches was switched
	lost     chan struct{}      // closed when the answers cannot be followed
	answered chan struct{}      // closed when the server's way is done
}

// refuseHTTP answers a plain HTTP request the policy refused with a 403
// that says so (X-Managoat-Egress: refused).
func refuseHTTP(c net.Conn, why string) {
	body := "managoat: the sandbox's egress policy refused this request: " + why + "\n"
	c.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(c, "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Managoat-Egress: refused\r\n\r\n%s", len(body), body)
}

// relayRequests writes each request of the connection on out while it
// names name, and returns why it stopped at one ("" at the connection's
// end or an error).
func (p *Proxy) relayRequests(pk peeked, out net.Conn, name string, x *exchange) (r refusal) {
	w := bufio.NewWriterSize(out, sniffBuffer)
	req := pk.req
	for {
		if h := requestHost(req); h != name {
			return refusal{fmt.Sprintf("this connection was allowed for %s and a request on it names %q", name, clip(h)), true}
		}
		dropUpgrade(req)
		lost := false
		select {
		case <-x.lost:
			lost = true
		default:
		}
		if lost && switches(req) {
			return refusal{fmt.Sprintf("the server's answers on this connection to %s could not be followed, so it may not switch protocols", name), true}
		}
		if err := writeRequest(w, req); err != nil {
			return r
		}
		if !lost {
			select {
			case x.sent <- req:
			case <-x.lost:
				lost = true
			case <-x.answered:
				return r
			}
		}
		if switches(req) {
			var ok bool
			select {
			case ok = <-x.verdict:
			case <-x.lost:
			case <-x.answered:
				return r
			}
			if ok && req.Method == http.MethodConnect {
				return refusal{why: p.relayTunnel(pk.br, pk.lim, out, name)}
			}
			if ok {
				_, _ = io.Copy(out, pk.br) // a WebSocket's frames
				return r
			}
		}
		var err error
		pk.lim.head()
		req, err = http.ReadRequest(pk.br)
		pk.lim.body()
		if err != nil {
			return r
		}
	}
}

// relayTunnel relays what the sandbox sends in an established CONNECT
// tunnel, which must start with a TLS ClientHello naming name; it
// returns why it refused it ("" when it did not).
func (p *Proxy) relayTunnel(br *bufio.Reader, lim *headLimit, out net.Conn, name string) string {
	lim.head()
	first, err := br.Peek(1)
	if err != nil {
		return ""
	}
	if first[0] != 0x16 {
		return fmt.Sprintf("a CONNECT tunnel to %s must carry TLS", name)
	}
	sni, pre := sniffTLS(br)
	lim.body()
	if sni != name {
		if sni == "" {
			return fmt.Sprintf("the TLS in the CONNECT tunnel to %s names no host (SNI)", name)
		}
		return fmt.Sprintf("the TLS in the CONNECT tunnel to %s names %q (SNI)", name, clip(sni))
	}
	if _, err := out.Write(pre); err != nil {
		return ""
	}
	_, _ = io.Copy(out, br)
	return ""
}

// relayAnswers relays the server's bytes to the sandbox as they come,
// following the answers to the requests sent, in order: it says, on
// verdict, whether a request that switches was answered by the switch
// (101, or 2xx to a CONNECT), and relays what follows a switch raw. An
// answer that does not parse as one (a server that does not speak HTTP)
// closes lost, and the rest is relayed raw too; a request that would
// switch is then refused (relayRequests).
func (x *exchange) relayAnswers(c *net.TCPConn, out net.Conn) {
	rr := bufio.NewReaderSize(io.TeeReader(out, c), sniffBuffer)
	raw := func() { _, _ = io.Copy(io.Discard, rr) } // relayed by the tee
	for {
		// Whatever the server sends reaches the sandbox at once (through
		// the tee), an answer to no request too (a 408 before closing).
		if _, err := rr.Peek(1); err != nil {
			return
		}
		req, ok := <-x.sent
		if !ok {
			raw()
			return
		}
		for {
			resp, err := http.ReadResponse(rr, req)
			if err != nil {
				close(x.lost)
				raw()
				return
			}
			code := resp.StatusCode
			if switches(req) && (code == http.StatusSwitchingProtocols && req.Method != http.MethodConnect ||
				req.Method == http.MethodConnect && code/100 == 2) {
				x.verdict <- true
				_, _ = io.Copy(c, out) // what rr read ahead went through already
				return
			}
			if code == http.StatusSwitchingProtocols { // a switch nobody asked for
				close(x.lost)
				raw()
				return
			}
			if code/100 == 1 {
				continue // 100 Continue and the like: the answer follows
			}
			_, err = io.Copy(io.Discard, resp.Body) // relayed by the tee
			resp.Body.Close()
			if err != nil {
				close(x.lost)
				raw()
				return
			}
			if switches(req) {
				x.verdict <- false
			}
			break
		}
	}
}

// clip bounds a name a sandbox sent before it is shown.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}
