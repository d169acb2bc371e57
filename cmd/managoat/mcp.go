package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/mcpserver"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("mcp", "[flags]", "Serve sandboxes as MCP tools over stdio, for a coding agent (on --provider, local by default)", cmdMCP)
}

// cmdMCP is `managoat mcp`: the MCP server (package mcpserver) over
// stdio, on the CLI's provider. Its sandboxes are destroyed when the
// client closes stdin (or --idle passes with no call); at start, those
// of a `managoat mcp` that was killed are swept (local provider).
func cmdMCP(g *globals, fs *flag.FlagSet) action {
	idle := fs.Duration("idle", 0, "end the session, destroying its sandboxes, after this long with no call (0: only when the client goes)")
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if *idle < 0 {
			return usageError{msg: "--idle must not be negative"}
		}
		reg, p, err := openProvider(g.provider)
		if err != nil {
			return err
		}
		b := &mcpserver.Backend{Registry: reg, Provider: p.Name()}
		if mcpserver.KeepsOf(p.Name()).Labels {
			b.Labels = map[string]string{mcpserver.LabelOwner: mcpserver.Owner()}
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			if n, err := mcpserver.Sweep(sctx, reg, p.Name()); err != nil || n > 0 {
				fmt.Fprintf(os.Stderr, "managoat mcp: swept %d sandboxes of a managoat mcp that is gone (%v)\n", n, err)
			}
			cancel()
		}
		if isPlatform(p) {
			if c, ok := p.(*client.Client); ok {
				pb, err := newPlatformBackend(c, defaultedPlatformURL(), platformKey(), nil)
				if err == nil {
					b.Registry = sandbox.NewRegistry(pb)
				}
			}
		}
		srv, err := mcpserver.New(mcpserver.Options{Backend: b, Idle: *idle, Version: version,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		if err != nil {
			return err
		}
		return srv.Run(ctx, &mcp.StdioTransport{MaxLineLength: mcpserver.MaxArgsBytes + 64<<10})
	}
}

// platformBackend is the platform's client with preview URLs
// (mcpserver.Previewer) through POST /v1/sandboxes/{name}/preview.
type platformBackend struct {
	*client.Client
	base string
	key  string
	http *http.Client
}

func newPlatformBackend(c *client.Client, base, key string, hc *http.Client) (*platformBackend, error) {
	if hc == nil {
		hc = &http.Client{Timeout: time.Minute}
	}
	return &platformBackend{Client: c, base: strings.TrimRight(base, "/"), key: key, http: hc}, nil
}

// PreviewURL asks the platform for a preview URL of port; a platform
// without the route is ErrNotSupported.
func (b *platformBackend) PreviewURL(ctx context.Context, h *sandbox.Handle, port int, ttl time.Duration) (string, time.Time, error) {
	body, _ := json.Marshal(map[string]int{"port": port, "ttl_seconds": int(ttl.Seconds())})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/v1/sandboxes/"+url.PathEscape(h.Name)+"/preview", bytes.NewReader(body))
	if err != nil {
		return "", time.Time{}, err
	}
	req.Header.Set("Authorization", "Bearer "+b.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.http.Do(req)
	if err != nil {
		return "", time.Time{}, sandbox.Unavailable(sandbox.ReasonTransport, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		var e struct {
			Error struct{ Kind, Reason string } `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && (e.Error.Reason == "route" || resp.StatusCode == http.StatusMethodNotAllowed) {
			return "", time.Time{}, sandbox.ErrNotSupported
		}
		return "", time.Time{}, api.DecodeError(resp.StatusCode, raw, resp.Header.Get("Retry-After"))
	}
	var out struct {
		URL       string    `json:"url"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.URL == "" {
		return "", time.Time{}, &sandbox.ProviderError{Provider: client.Name, Reason: "malformed_preview"}
	}
	return out.URL, out.ExpiresAt, nil
}

// mcpSessionIdle is how long an MCP session on serve may go with no
// request before it ends and its sandboxes are destroyed.
const mcpSessionIdle = 30 * time.Minute

// serveMCP adds /mcp to serve's handler: the MCP server over Streamable
// HTTP, each session on the platform's own client with the session's
// API key, pointed at the same handler in this process (over in-memory
// connections that carry the caller's address), so /mcp has /v1's
// authentication, failed-authentication bounds, rate, quotas, policy and
// idle lifecycle. Every request's key is checked by a /v1 call; a
// session is bound to the key that opened it. The returned close ends
// the sessions (destroying their sandboxes) before the platform closes.
func serveMCP(h http.Handler, closePlatform func()) (http.Handler, func()) {
	inner := newPipeServer(h)
	m := &mcpFront{pipe: inner}
	srv, err := mcpserver.New(mcpserver.Options{BackendFor: m.backend, Version: version,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		panic(err) // only for a missing backend, which is given
	}
	stream := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv.MCP() },
		&mcp.StreamableHTTPOptions{SessionTimeout: mcpSessionIdle, MaxRequestBodyBytes: mcpserver.MaxArgsBytes + 64<<10, DisableLocalhostProtection: false})
	protected := auth.RequireBearerToken(func(ctx context.Context, _ string, r *http.Request) (*auth.TokenInfo, error) {
		if ti, ok := ctx.Value(mcpTokenKey{}).(*auth.TokenInfo); ok {
			return ti, nil
		}
		return nil, auth.ErrInvalidToken
	}, &auth.RequireBearerTokenOptions{AllowMissingExpiration: true})(stream)
	mux := http.NewServeMux()
	mux.Handle("/mcp", m.verify(protected))
	mux.Handle("/", h)
	var once sync.Once
	return mux, func() {
		once.Do(func() {
			srv.Close()
			inner.close()
			closePlatform()
		})
	}
}

type mcpTokenKey struct{}

type mcpFront struct{ pipe *pipeServer }

// verify checks the request's key with GET /v1/providers through the
// platform itself, from the caller's address: the platform's answer to a
// bad key (401, or 429 past the address's failed authentications) is
// /mcp's. A good key's TokenInfo binds the session to the key.
func (m *mcpFront) verify(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := bearerOf(r)
		req := httptest.NewRequest(http.MethodGet, "/v1/providers", nil).WithContext(r.Context())
		req.RemoteAddr = r.RemoteAddr
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := &capResponse{h: http.Header{}}
		m.pipe.h.ServeHTTP(rec, req)
		if rec.status != http.StatusOK {
			for _, k := range []string{"Content-Type", "Retry-After", "WWW-Authenticate"} {
				if v := rec.h.Get(k); v != "" {
					w.Header().Set(k, v)
				}
			}
			w.WriteHeader(rec.status)
			_, _ = w.Write(rec.body.Bytes())
			return
		}
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		ti := &auth.TokenInfo{UserID: api.KeyID(key), Extra: map[string]any{"key": key, "remote": r.RemoteAddr, "base": scheme + "://" + r.Host}}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), mcpTokenKey{}, ti)))
	})
}

func bearerOf(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// backend is a new session's: the platform's client with its key, its
// requests coming from the session's address.
func (m *mcpFront) backend(_ context.Context, req *mcp.CallToolRequest) (*mcpserver.Backend, error) {
	if req.Extra == nil || req.Extra.TokenInfo == nil {
		return nil, &sandbox.DeniedError{Reason: "no API key"}
	}
	x := req.Extra.TokenInfo.Extra
	key, _ := x["key"].(string)
	remote, _ := x["remote"].(string)
	base, _ := x["base"].(string)
	hc := m.pipe.client(remote)
	c, err := client.New(client.Options{URL: base, APIKey: key, HTTPClient: hc})
	if err != nil {
		return nil, err
	}
	pb, _ := newPlatformBackend(c, base, key, hc)
	return &mcpserver.Backend{Registry: sandbox.NewRegistry(pb), Provider: client.Name, Close: hc.CloseIdleConnections}, nil
}

// capResponse is a bounded in-memory http.ResponseWriter.
type capResponse struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func (c *capResponse) Header() http.Header { return c.h }
func (c *capResponse) WriteHeader(s int) {
	if c.status == 0 {
		c.status = s
	}
}
func (c *capResponse) Write(p []byte) (int, error) {
	if c.status == 0 {
		c.status = http.StatusOK
	}
	if c.body.Len() < 64<<10 {
		c.body.Write(p[:min(len(p), 64<<10-c.body.Len())])
	}
	return len(p), nil
}

// pipeServer serves h over in-memory connections (net.Pipe), with an
// http.Server of its own, so a client in this process reaches serve's
// handler as over the network (WebSockets included) without a socket.
type pipeServer struct {
	h    http.Handler
	srv  *http.Server
	ln   *pipeListener
	done chan struct{}
}

func newPipeServer(h http.Handler) *pipeServer {
	ps := &pipeServer{h: h, ln: &pipeListener{conns: make(chan net.Conn), closed: make(chan struct{})}, done: make(chan struct{})}
	ps.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second}
	go func() {
		defer close(ps.done)
		_ = ps.srv.Serve(ps.ln)
	}()
	return ps
}

func (ps *pipeServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = ps.srv.Shutdown(ctx)
	_ = ps.srv.Close()
	<-ps.done
}

// client is an http.Client whose connections reach ps as from remote.
func (ps *pipeServer) client(remote string) *http.Client {
	t := &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			c1, c2 := net.Pipe()
			select {
			case ps.ln.conns <- addrConn{Conn: c2, remote: pipeAddr(remote)}:
				return c1, nil
			case <-ps.ln.closed:
				c1.Close()
				c2.Close()
				return nil, errors.New("managoat serve is closing")
			case <-ctx.Done():
				c1.Close()
				c2.Close()
				return nil, ctx.Err()
			}
		}}
	return &http.Client{Transport: t}
}

type pipeAddr string

func (a pipeAddr) Network() string { return "tcp" }
func (a pipeAddr) String() string  { return string(a) }

type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

type pipeListener struct {
	conns  chan net.Conn
	once   sync.Once
	closed chan struct{}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr("managoat-serve-in-process") }
