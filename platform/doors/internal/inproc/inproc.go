// Package inproc is how a front door (platform/doors/...) reaches the
// platform's /v1 handler in process: an http.Server on an in-memory
// listener, each dial a net.Pipe, so a door's calls are /v1's own
// (authentication, limits, quotas, policy) without a socket. The server
// end of a pipe reports the address of the door's caller, carried in the
// dial's host name, so /v1's failed-authentication bound counts the
// vendor SDK's address and not the door's.
//
// Written here rather than with a library: net.Pipe and http.Server are
// all it takes; what is the door's own is the caller's address it carries.
package inproc

import (
	"context"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/managoat/managoat/platform/client"
)

// API is the platform's /v1 handler served over in-memory pipes.
type API struct {
	ln  *listener
	srv *http.Server
	hc  *http.Client
	wg  sync.WaitGroup
}

// Start serves h in process. Close it when done.
func Start(h http.Handler) *API {
	a := &API{ln: &listener{ch: make(chan net.Conn), done: make(chan struct{})}}
	a.srv = &http.Server{Handler: h, ReadHeaderTimeout: 30 * time.Second}
	a.wg.Add(1)
	go func() { defer a.wg.Done(); _ = a.srv.Serve(a.ln) }()
	tr := &http.Transport{DialContext: a.ln.dial, MaxIdleConnsPerHost: 32, IdleConnTimeout: 30 * time.Second, DisableCompression: true}
	a.hc = &http.Client{Transport: tr}
	return a
}

// ClientFor is the platform as the caller with key sees it, its requests
// coming from r's peer address (or none, for a door's own background
// calls, when r is nil).
func (a *API) ClientFor(r *http.Request, key string) (*client.Client, error) {
	host := "door.invalid"
	if r != nil {
		if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
			host = "a" + hex.EncodeToString(ap.Addr().Unmap().AsSlice()) + ".door.invalid"
		}
	}
	return client.New(client.Options{URL: "http://" + host, APIKey: key, HTTPClient: a.hc})
}

// Close ends the server and every pipe, and waits for the server.
func (a *API) Close() error {
	a.hc.CloseIdleConnections()
	err := a.srv.Close()
	a.wg.Wait()
	a.hc.CloseIdleConnections()
	return err
}

// listener is an in-memory listener: each dial is a net.Pipe whose server
// end reports the address the dial named.
type listener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *listener) Close() error { l.once.Do(func() { close(l.done) }); return nil }

func (l *listener) Addr() net.Addr { return pipeAddr("door") }

func (l *listener) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	host, _, _ := net.SplitHostPort(addr)
	remote := net.Addr(pipeAddr("127.0.0.1:1"))
	if h, ok := strings.CutPrefix(host, "a"); ok {
		if b, err := hex.DecodeString(strings.TrimSuffix(h, ".door.invalid")); err == nil {
			if ip, ok := netip.AddrFromSlice(b); ok {
				remote = pipeAddr(netip.AddrPortFrom(ip, 1).String())
			}
		}
	}
	c1, c2 := net.Pipe()
	select {
	case l.ch <- addrConn{c2, remote}:
		return c1, nil
	case <-ctx.Done():
		c1.Close()
		c2.Close()
		return nil, ctx.Err()
	case <-l.done:
		c1.Close()
		c2.Close()
		return nil, net.ErrClosed
	}
}

type pipeAddr string

func (a pipeAddr) Network() string { return "tcp" }
func (a pipeAddr) String() string  { return string(a) }

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }
