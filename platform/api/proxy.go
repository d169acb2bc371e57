package api

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// The proxy: /v1/sandboxes/{name}/ports/{port}/PATH, any method, is
// forwarded to PATH on port of the sandbox, where its provider publishes
// it on this host (a PortPublisher: provider/local on the jail or runc,
// whose published port is a unix socket in a directory of this
// process's user that no other user can connect to, so the proxy, behind
// the account's key, is the only way to it; the host header the
// application then gets is localhost:PORT). It is authorized as every /v1 call (the account's
// Bearer key; another account's sandbox is 404 not_found) and the key is
// never forwarded: the Authorization header is the platform's, an
// application that wants credentials of its own takes them in another
// header. The forwarding is net/http/httputil.ReverseProxy: bodies stream
// both ways unbuffered (a response of unknown length is flushed as it
// comes), hop-by-hop headers are removed, X-Forwarded-For, -Host and
// -Proto are set (and those the caller sent dropped), X-Forwarded-Prefix
// is the path the application is served under, and an Upgrade (a
// WebSocket) is relayed as a raw connection once the application
// switches protocols.
//
// Bounds: at most Config.ProxyMaxConns requests (an upgraded connection
// counts until it closes) per sandbox at once, more are 429
// rate_limited{proxy_connections}; a connection to the application idle
// for Config.ProxyIdle (no byte either way, headers awaited included) is
// closed (504 when no answer had begun), and so is the caller's when it
// takes nothing of an answer (or of an upgraded connection) for as long; a request body is limited to
// Config.ProxyMaxBody (413; a response body is not limited: it streams
// under the idle bound). A sandbox that is not running, or suspended, is
// 503 unavailable{not_running} at once; a port it does not publish is
// 400 invalid{port}; a published port nothing answers on is 502
// unavailable{port_unreachable}.
//
// Every sandbox is served under the platform's own origin (the path
// form works behind one host name): the API's credential is never
// ambient (a Bearer header, no cookie), so a page of one application
// cannot call the API, or another sandbox, with it; cookies an
// application sets are its own business (scope them with
// X-Forwarded-Prefix). Each proxied request counts against the key's
// rate, as every /v1 call. A browser reaches a port through a preview
// link instead (preview.go): on an origin of its own, with a cookie of
// that origin only, which the application never gets either.

// PortPublisher is implemented by a provider whose sandboxes publish
// ports on this host's loopback only (provider/local): the platform then
// proxies them, and a sandbox's url is the platform's URL of its first
// published port.
type PortPublisher interface {
	// PublishedPorts are the ports the sandbox publishes, in order.
	PublishedPorts(ctx context.Context, h *sandbox.Handle) ([]int, error)
	// PortAddress is where port of the running sandbox is published:
	// "unix:PATH", a unix socket only this process's user can connect to
	// (provider/local's), or the host's loopback "127.0.0.1:PORT";
	// Invalid{port} for a port it does not publish,
	// Unavailable{not_running} when it does not run.
	PortAddress(ctx context.Context, h *sandbox.Handle, port int) (string, error)
}

// Proxy bounds' defaults.
const (
	DefaultProxyMaxConns = 64
	DefaultProxyIdle     = 2 * time.Minute
	DefaultProxyMaxBody  = 64 << 20
)

// baseKey carries the platform's base URL (as the caller reached it) to
// the URL a create records.
type baseKey struct{}

// baseURL is the platform's URL as a client reaches it: Config.BaseURL,
// else the scheme and Host of the request.
func (s *Server) baseURL(r *http.Request) string {
	if s.cfg.BaseURL != "" {
		return strings.TrimRight(s.cfg.BaseURL, "/")
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// PortURL is the platform's URL of port of the account's sandbox name.
func PortURL(base, name string, port int) string {
	return strings.TrimRight(base, "/") + "/v1/sandboxes/" + url.PathEscape(name) + "/ports/" + strconv.Itoa(port) + "/"
}

// portURL is the URL of the first port the sandbox publishes, "" for none
// (or a provider that publishes nothing).
func portURL(ctx context.Context, p sandbox.Provider, h *sandbox.Handle, name string) (string, bool, error) {
	pp, ok := p.(PortPublisher)
	if !ok {
		return "", false, nil
	}
	base, _ := ctx.Value(baseKey{}).(string)
	ports, err := pp.PublishedPorts(ctx, h)
	if err != nil || len(ports) == 0 || base == "" {
		return "", true, err
	}
	return PortURL(base, name, ports[0]), true, nil
}

// idleConn is a connection to an application that fails a read or a
// write once no byte went either way for idle.
type idleConn struct {
	net.Conn
	idle time.Duration
	last atomic.Int64 // unix nanoseconds of the last byte
}

func (c *idleConn) touch() { c.last.Store(time.Now().UnixNano()) }

func (c *idleConn) Read(b []byte) (int, error) {
	for {
		_ = c.Conn.SetReadDeadline(time.Unix(0, c.last.Load()).Add(c.idle))
		n, err := c.Conn.Read(b)
		if n > 0 {
			c.touch()
		}
		if n == 0 && errors.Is(err, os.ErrDeadlineExceeded) && time.Since(time.Unix(0, c.last.Load())) < c.idle {
			continue // the other direction moved meanwhile
		}
		return n, err
	}
}

func (c *idleConn) Write(b []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.idle))
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.touch()
	}
	return n, err
}

// idleWriter bounds the proxy's writes to its caller: a caller that
// reads nothing for idle fails the write (and ends the proxied request)
// instead of holding it, and a connection the application upgraded gets
// the idle bound of idleConn.
type idleWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration
}

func (w *idleWriter) Write(b []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.idle))
	return w.ResponseWriter.Write(b)
}

func (w *idleWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *idleWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Time{})
	ic := &idleConn{Conn: c, idle: w.idle}
	ic.touch()
	return ic, brw, nil
}

// newProxyTransport dials applications on this host's loopback, never
// through an environment's proxy, with the idle bound on every connection.
func newProxyTransport(idle time.Duration) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second}
	return &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if path, ok := ctx.Value(unixPathKey{}).(string); ok {
				// A request to a unix socket names it by unixHost: a
				// connection of the pool for that name is that socket's.
				if h, _, _ := net.SplitHostPort(addr); h != unixHost(path) {
					return nil, fmt.Errorf("dial %s: not the socket %s", addr, path)
				}
				network, addr = "unix", path
			}
			c, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			ic := &idleConn{Conn: c, idle: idle}
			ic.touch()
			return ic, nil
		},
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true, // the application's encoding passes as it is
	}
}

// unixPathKey carries the unix socket a proxied request goes to (a
// PortAddress "unix:PATH") to the transport's dial.
type unixPathKey struct{}

// unixHost is the host name a request to the unix socket path is sent
// to: the transport keeps idle connections by host, so each socket has
// its own (a hash of the path; the application sees Host
// localhost:PORT).
func unixHost(path string) string {
	sum := sha256.Sum256([]byte(path))
	return hex.EncodeToString(sum[:10]) + ".sock"
}

// proxyBuffers are the copy buffers of proxied bodies: 256 KiB, eight
// times ReverseProxy's own, for fewer system calls on a large body.
var proxyBuffers = &bufferPool{p: sync.Pool{New: func() any { b := make([]byte, 256<<10); return &b }}}

type bufferPool struct{ p sync.Pool }

func (b *bufferPool) Get() []byte  { return *b.p.Get().(*[]byte) }
func (b *bufferPool) Put(x []byte) { b.p.Put(&x) }

// proxySlot takes one of the record's proxied connections, or says no.
func (s *Server) proxySlot(rec store.Sandbox) (func(), bool) {
	key := recKey(rec.AccountID, rec.Name)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return nil, false
	}
	if s.proxied[key] >= s.cfg.ProxyMaxConns {
		return nil, false
	}
	s.proxied[key]++
	s.wg.Add(1)
	return func() {
		s.mu.Lock()
		if s.proxied[key]--; s.proxied[key] <= 0 {
			delete(s.proxied, key)
		}
		s.mu.Unlock()
		s.wg.Done()
	}, true
}

// ProxyConns is how many proxied connections the account's sandbox name
// has open in this process.
func (s *Server) ProxyConns(accountID, name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proxied[recKey(accountID, name)]
}

// limitedBody ends a request body past its limit and remembers it did.
// The transport reads it in a goroutine of its own, which may outlive the
// handler: stop makes every later read fail and waits for one in flight,
// so that the server never reads the connection under it.
type limitedBody struct {
	io.ReadCloser
	left int64
	over atomic.Bool
	eof  atomic.Bool // the caller's body was read to its end

	mu      sync.Mutex // held by a read of ReadCloser
	stopped bool
}

var errProxyDone = errors.New("the proxied request ended")

// Close does not close the caller's body: the server does once the
// handler returns (a close of it here, from the transport's goroutine,
// would read the rest of it under the server's next read).
func (b *limitedBody) Close() error { return nil }

func (b *limitedBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return 0, errProxyDone
	}
	if b.over.Load() {
		return 0, errors.New("request body over the proxy's limit")
	}
	n, err := b.read(p)
	if errors.Is(err, io.EOF) {
		b.eof.Store(true)
	}
	return n, err
}

// stop ends the body's use by the transport. A body not read to its end
// is cut: cut (a read deadline in the past on the caller's connection)
// ends a read in flight, and the server reads no more of the connection,
// which it closes after the answer (ModifyResponse or the ErrorHandler
// said Connection: close). Left to the server, the rest of a body of a
// full-duplex request is read after the handler returns, and its end
// starts the server's background read unawaited: "invalid concurrent
// Body.Read call" at the connection's next request (Go 1.26); or, cut
// without Connection: close, the rest is read as the next request.
// After stop, no read of the body touches the connection.
func (b *limitedBody) stop(cut func()) {
	if !b.eof.Load() {
		cut()
	}
	b.mu.Lock()
	b.stopped = true
	b.mu.Unlock()
}

func (b *limitedBody) read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body at the limit from one past it.
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			b.over.Store(true)
			return 0, errors.New("request body over the proxy's limit")
		}
		return 0, err // io.EOF at the end; (0, nil) is a read that may be retried
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

func proxyErr(status int, reason, msg string) error {
	return &apiError{status, &Error{Kind: "unavailable", Reason: reason, Message: msg}}
}

// proxy is /v1/sandboxes/{name}/ports/{port}/{path...}.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, k store.Key) {
	port, err := strconv.Atoi(r.PathValue("port"))
	if err != nil || port < 1 || port > 65535 {
		writeErr(w, sandbox.Invalid("port", fmt.Sprintf("port %q is not 1 to 65535", r.PathValue("port"))))
		return
	}
	if r.ContentLength > s.cfg.ProxyMaxBody {
		writeErr(w, tooLarge(fmt.Errorf("%d bytes, the proxy takes at most %d", r.ContentLength, s.cfg.ProxyMaxBody)))
		return
	}
	rec, p, done, ok := s.take(w, r, k)
	if !ok {
		return
	}
	defer done()
	prefix := "/v1/sandboxes/" + url.PathEscape(rec.Name) + "/ports/" + r.PathValue("port")
	s.proxyRecord(w, r, rec, p, port, prefix, strings.TrimPrefix(r.URL.EscapedPath(), prefix))
}

// proxyRecord forwards r to port of the record's sandbox, at the path
// rest (escaped); prefix, when not "", is the path the application is
// served under (X-Forwarded-Prefix). The caller has authorized it.
func (s *Server) proxyRecord(w http.ResponseWriter, r *http.Request, rec store.Sandbox, p sandbox.Provider, port int, prefix, rest string) {
	pp, ok := p.(PortPublisher)
	if !ok {
		writeErr(w, fmt.Errorf("provider %s gives its sandboxes no address this platform can reach: %w", rec.Provider, sandbox.ErrUnsupported))
		return
	}
	release, ok := s.proxySlot(rec)
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "proxy_connections", RetryAfterMS: 1000,
			Message: fmt.Sprintf("sandbox %s has %d proxied connections open, the most it may (or the platform is shutting down)", rec.Name, s.cfg.ProxyMaxConns)}})
		return
	}
	defer release()
	addr, err := pp.PortAddress(r.Context(), handleOf(rec), port)
	if err != nil {
		writeErr(w, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	var body *limitedBody
	rc := http.NewResponseController(w)
	defer func() {
		cancel()
		if body != nil {
			body.stop(func() { _ = rc.SetReadDeadline(time.Now()) })
		}
	}()
	stop := context.AfterFunc(s.closed, cancel) // Close ends upgraded connections too
	defer stop()
	host, outHost := addr, ""
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		ctx = context.WithValue(ctx, unixPathKey{}, path)
		host, outHost = unixHost(path), "localhost:"+strconv.Itoa(port)
	}
	r = r.WithContext(ctx)
	// The application may answer while the request body still comes
	// (an echo, a stream both ways).
	_ = rc.EnableFullDuplex()
	// The connection may serve other calls after this one: no deadline of
	// the proxy's stays on it (an error once it was hijacked: it is ours).
	defer func() { _ = rc.SetWriteDeadline(time.Time{}) }()
	w = &idleWriter{ResponseWriter: w, rc: rc, idle: s.cfg.ProxyIdle}
	if r.Body != nil && r.Body != http.NoBody {
		body = &limitedBody{ReadCloser: r.Body, left: s.cfg.ProxyMaxBody}
		r.Body = body
	}
	if !strings.HasPrefix(rest, "/") {
		rest = "/" + rest
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host, pr.Out.Host = "http", host, outHost
			pr.Out.URL.RawPath = rest
			pr.Out.URL.Path, _ = url.PathUnescape(rest)
			pr.Out.Header.Del("Authorization")          // the account's key stays here
			withoutCookie(pr.Out.Header, PreviewCookie) // and so does a preview's cookie
			pr.SetXForwarded()
			if prefix != "" {
				pr.Out.Header.Set("X-Forwarded-Prefix", prefix)
			}
		},
		Transport:  s.transport,
		BufferPool: proxyBuffers,
		// A body not read to its end when the answer begins is cut when
		// the handler returns (limitedBody.stop): the connection is not
		// reused, it holds the rest.
		ModifyResponse: func(res *http.Response) error {
			if body != nil && !body.eof.Load() {
				res.Header.Set("Connection", "close")
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if body != nil && !body.eof.Load() {
				w.Header().Set("Connection", "close")
			}
			switch {
			case body != nil && body.over.Load():
				writeErr(w, tooLarge(fmt.Errorf("the proxy takes at most %d bytes", s.cfg.ProxyMaxBody)))
			case r.Context().Err() != nil && s.closed.Err() != nil:
				writeErr(w, proxyErr(http.StatusServiceUnavailable, "platform_closing", "the platform is shutting down"))
			case r.Context().Err() != nil:
				// The caller went away: nobody reads an answer.
			case errors.Is(err, os.ErrDeadlineExceeded):
				writeErr(w, proxyErr(http.StatusGatewayTimeout, "proxy_idle_timeout",
					fmt.Sprintf("port %d of sandbox %s sent nothing for %s", port, rec.Name, s.cfg.ProxyIdle)))
			default:
				s.log.Debug("proxy", "sandbox", rec.Name, "port", port, "err", err)
				writeErr(w, proxyErr(http.StatusBadGateway, "port_unreachable",
					fmt.Sprintf("port %d of sandbox %s did not answer (does an application listen on it inside the sandbox?)", port, rec.Name)))
			}
		},
	}
	rp.ServeHTTP(w, r)
}

// checkPublish refuses ports to publish on a provider that publishes
// nothing the platform can reach (they would be dropped), and on a
// create_new (whose options carry none).
func checkPublish(p sandbox.Provider, prov string, publish []int, createNew bool) error {
	if len(publish) == 0 {
		return nil
	}
	if _, ok := p.(PortPublisher); !ok || !p.Capabilities().Has(sandbox.CapPublicURL) {
		return sandbox.Invalid("publish", fmt.Sprintf("provider %s publishes no port this platform can reach (the local provider does, on the jail or runc as root)", prov))
	}
	if createNew {
		return sandbox.Invalid("publish", "create_new publishes no port: create the sandbox without create_new")
	}
	return nil
}
