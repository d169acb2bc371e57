package runner

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Authenticator decides whether a Bearer key may connect a runner (or use
// the proxy) and names the account it belongs to. Return ErrUnauthorized
// (401) or ErrForbidden (403, e.g. a key of a narrower scope) to refuse.
type Authenticator interface {
	Authenticate(r *http.Request, key string) (account string, err error)
}

// AuthFunc adapts a function to Authenticator.
type AuthFunc func(r *http.Request, key string) (string, error)

// Authenticate implements Authenticator.
func (f AuthFunc) Authenticate(r *http.Request, key string) (string, error) { return f(r, key) }

// Authentication refusals. A RunnerAuthenticator's error wrapping
// ErrForbidden is 403 forbidden, ErrResourceExhausted 403
// resource_exhausted, a sandbox.UnavailableError 503 (the credentials
// could not be checked), anything else 401; the message of each but the
// last is the error's own.
var (
	ErrUnauthorized      = errors.New("runner: missing or invalid API key")
	ErrForbidden         = errors.New("runner: the API key is not full scope")
	ErrResourceExhausted = errors.New("runner: resource_exhausted")
)

// StaticToken accepts exactly token (compared in constant time) for the
// account "local". An empty token accepts nothing.
func StaticToken(token string) Authenticator {
	return AuthFunc(func(_ *http.Request, key string) (string, error) {
		if token == "" || subtle.ConstantTimeCompare([]byte(key), []byte(token)) != 1 {
			return "", ErrUnauthorized
		}
		return "local", nil
	})
}

// ServerConfig configures the platform end.
type ServerConfig struct {
	Auth Authenticator // required
	// RunnerAuth, when set, authenticates the runners' sockets instead of
	// Auth: each runner shows its own credential for the name it gives
	// (RunnerFile), and no client key connects a runner. Unset, Auth
	// admits runners too (Fountain's one shared key).
	RunnerAuth RunnerAuthenticator
	// Host is where connections are registered. Unset, it is a
	// NewLocalHost() of this process only, and NewServer says so in a
	// warning: a platform of several replicas that forgot its cluster-wide
	// host would otherwise run as several single nodes, each blind to the
	// others' runners. Set it (to NewLocalHost() for one node) to say so.
	Host Host
	// Disabled makes the runner endpoint answer 404 runners_disabled
	// without registering anything.
	Disabled bool
	// HeartbeatInterval is how often each connection calls Host.Heartbeat
	// and pings the daemon (default 20 s); IdleTimeout closes a socket that
	// delivered nothing, not even a pong, for that long (default 120 s).
	HeartbeatInterval, IdleTimeout time.Duration
	WriteTimeout                   time.Duration // per frame, default 30 s
	// TextStreamsOnly makes the platform decline binary stream frames
	// (wire.CapBinaryStream) as Fountain's platform does: the daemon then
	// sends base64 text frames, and a binary frame closes the socket.
	TextStreamsOnly bool
	// ProxyIdleTimeout closes a proxy client's socket that carried nothing
	// either way for that long with no request or subscription in flight
	// (default 10 min).
	ProxyIdleTimeout time.Duration
	// CallTimeout bounds a provider call whose ctx has no deadline
	// (default 30 s); exec waits for its own timeout plus 10 s instead.
	CallTimeout time.Duration
	// RunnerID names a runner from its account and name when RunnerAuth
	// does not (it is no RunnerIdentifier, or names none); default
	// StableID.
	RunnerID func(account, name string) string
	// Meta, when set, gives each connecting runner its opaque metadata
	// (Info.Meta), from the handshake's request and the runner's identity:
	// the library never reads it; it goes to Host.Register with the
	// connection, and comes back in Online, Presence and the runner list.
	Meta   func(r *http.Request, info Info) map[string]string
	Logger *slog.Logger
}

// Server is the platform end: an http.Handler for the daemon's WebSocket
// (wire.Path), the CLI proxy (ProxyPath), the runner list (GET ListPath) and
// forgetting a runner (DELETE ListPath/<id>, which closes its socket with
// 4404), and a Caller over its Host's connections.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	mu      sync.Mutex
	closing bool
	conns   map[*Conn]struct{}
	proxies map[*websocket.Conn]struct{}
	wg      sync.WaitGroup
}

// Paths served by Server besides wire.Path.
const (
	ListPath  = "/api/runners"
	ProxyPath = "/api/runners/proxy"
)

// NewServer returns a platform end. Mount it for "/api/runners" and below:
//
//	srv := runner.NewServer(runner.ServerConfig{Auth: runner.StaticToken(tok)})
//	mux.Handle("/api/runners", srv)
//	mux.Handle("/api/runners/", srv)
func NewServer(cfg ServerConfig) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Host == nil {
		cfg.Host = NewLocalHost()
		cfg.Logger.Warn("runner: ServerConfig.Host is not set: runners are registered in this process only (NewLocalHost); " +
			"a platform of several replicas must set a cluster-wide Host (provider/runner/natshost), one node should set NewLocalHost() to say so")
	}
	if cfg.Auth == nil {
		cfg.Auth = StaticToken("")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.HeartbeatInterval, 20*time.Second)
	def(&cfg.IdleTimeout, 120*time.Second)
	def(&cfg.WriteTimeout, 30*time.Second)
	def(&cfg.ProxyIdleTimeout, 10*time.Minute)
	def(&cfg.CallTimeout, 30*time.Second)
	if cfg.RunnerID == nil {
		cfg.RunnerID = StableID
	}
	return &Server{cfg: cfg, log: cfg.Logger, conns: map[*Conn]struct{}{}, proxies: map[*websocket.Conn]struct{}{}}
}

// Host returns the server's Host.
func (s *Server) Host() Host { return s.cfg.Host }

// Provider returns the sandbox provider "runner" over this server.
func (s *Server) Provider() *Provider {
	return NewProvider(s, ProviderOptions{CallTimeout: s.cfg.CallTimeout})
}

func httpError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "message": msg})
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (string, bool) {
	account, err := s.cfg.Auth.Authenticate(r, bearer(r))
	switch {
	case err == nil:
		return account, true
	case errors.Is(err, ErrForbidden):
		// A refused caller's connection is not kept alive for its next
		// try: idle refused connections must not pile up.
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusForbidden, "forbidden", err.Error())
	default:
		w.Header().Set("Connection", "close")
		httpError(w, http.StatusUnauthorized, "unauthorized", err.Error())
	}
	return "", false
}

// ServeHTTP routes wire.Path, ProxyPath and ListPath.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch strings.TrimRight(r.URL.Path, "/") {
	case wire.Path:
		s.serveRunner(w, r)
	case ProxyPath:
		s.serveProxy(w, r)
	case ListPath:
		s.serveList(w, r)
	default:
		if id, ok := strings.CutPrefix(r.URL.Path, ListPath+"/"); ok && r.Method == http.MethodDelete && !strings.Contains(id, "/") {
			s.serveDelete(w, r, id)
			return
		}
		http.NotFound(w, r)
	}
}

// serveDelete is DELETE /api/runners/<id>: the runner's live socket, if it
// is the caller's, is closed with 4404 "runner deleted" (204); otherwise 404.
func (s *Server) serveDelete(w http.ResponseWriter, r *http.Request, id string) {
	account, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if d, ok := s.cfg.Host.(Deleter); ok {
		// A cluster-wide host reaches the runner wherever it is connected.
		if !d.DeleteRunner(id, account) {
			httpError(w, http.StatusNotFound, "not_found", "no such runner online")
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	c := s.cfg.Host.Whereis(id)
	if c == nil || c.Info().Account != account {
		httpError(w, http.StatusNotFound, "not_found", "no such runner online")
		return
	}
	c.Close(wire.CloseDeleted, "runner deleted")
	w.WriteHeader(http.StatusNoContent)
}

// serveList is GET /api/runners: the caller's account's online runners,
// never another account's (a client places sandboxes among these).
func (s *Server) serveList(w http.ResponseWriter, r *http.Request) {
	account, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if r.Method != http.MethodGet {
		httpError(w, http.StatusMethodNotAllowed, "method_not_allowed", "GET only")
		return
	}
	mine := []Info{}
	for _, i := range s.cfg.Host.Online() {
		if i.Account == account {
			mine = append(mine, i)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"data": mine})
}

// ValidName reports whether name is a runner's name (what the handshake
// accepts): ^[a-z0-9][a-z0-9._-]{0,62}$. An authenticator that records
// names checks it before it records one.
func ValidName(name string) bool { return validRunnerName(name) }

// validRunnerName reports whether name matches ^[a-z0-9][a-z0-9._-]{0,62}$.
// It is a loop rather than a package-level regexp, whose counted repetition
// cost about 700 allocations at every process start (the CLI links this
// package).
func validRunnerName(name string) bool {
	if len(name) == 0 || len(name) > 63 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || '0' <= c && c <= '9' {
			continue
		}
		if i == 0 || (c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}

func isWebSocket(r *http.Request) bool {
	return strings.Contains(strings.ToLower(r.Header.Get("Upgrade")), "websocket")
}

// identity validates the handshake's query string (spec §3.9).
func identity(r *http.Request, account string) (Info, error) {
	q := r.URL.Query()
	i := Info{Account: account, Name: q.Get(wire.ParamName), Hostname: q.Get(wire.ParamHostname),
		OS: q.Get(wire.ParamOS), Arch: q.Get(wire.ParamArch), Version: q.Get(wire.ParamVersion), Root: q.Get(wire.ParamRoot)}
	if !validRunnerName(i.Name) {
		return i, fmt.Errorf("name %q must be lowercase letters, digits, dots, dashes or underscores (max 63)", clip(i.Name, 80))
	}
	for _, f := range []struct {
		name, v string
		max     int
	}{{"hostname", i.Hostname, 255}, {"os", i.OS, 40}, {"arch", i.Arch, 40}, {"version", i.Version, 80}, {"root", i.Root, 1024}} {
		if len(f.v) > f.max {
			return i, fmt.Errorf("%s is longer than %d", f.name, f.max)
		}
	}
	for _, c := range strings.Split(q.Get(wire.ParamCaps), ",") {
		switch c {
		case string(sandbox.CapNetworkPolicy), string(sandbox.CapTerminateSession), string(sandbox.CapForceTerminateSession), wire.CapLimits, wire.CapDiskLimit, wire.CapSignal, wire.CapCapacity, wire.CapReadFile, wire.CapAttachOffset, wire.CapBinaryStream:
			i.Caps = append(i.Caps, c)
		}
	}
	if len(q.Get(wire.ParamLabels)) > 8<<10 {
		return i, fmt.Errorf("labels are longer than %d", 8<<10)
	}
	labels, err := wire.ParseLabels(q.Get(wire.ParamLabels))
	if err != nil {
		return i, err
	}
	i.Labels = labels
	return i, nil
}

// serveRunner is GET wire.Path, in the spec's order of checks: bearer key
// (401/403), disabled (404), not a WebSocket (400), identity (400),
// registration with the Host (409), then the upgrade. The registration
// happens before the upgrade, so every refusal is an HTTP status.
func (s *Server) serveRunner(w http.ResponseWriter, r *http.Request) {
	var account, id string
	if s.cfg.RunnerAuth != nil {
		var a string
		var err error
		name := r.URL.Query().Get(wire.ParamName)
		if ri, ok := s.cfg.RunnerAuth.(RunnerIdentifier); ok {
			a, id, err = ri.IdentifyRunner(r, bearer(r), name)
		} else {
			a, err = s.cfg.RunnerAuth.AuthenticateRunner(r, bearer(r), name)
		}
		if err != nil {
			w.Header().Set("Connection", "close")
			var un *sandbox.UnavailableError
			switch {
			case errors.Is(err, ErrResourceExhausted):
				httpError(w, http.StatusForbidden, "resource_exhausted", err.Error())
			case errors.Is(err, ErrForbidden):
				httpError(w, http.StatusForbidden, "forbidden", err.Error())
			case errors.As(err, &un):
				w.Header().Set("Retry-After", "5")
				httpError(w, http.StatusServiceUnavailable, "auth_unavailable", "the runner's credential could not be checked now")
			default:
				httpError(w, http.StatusUnauthorized, "unauthorized", "not the credential of a runner enrolled under this name")
			}
			return
		}
		account = a
	} else {
		a, ok := s.authenticate(w, r)
		if !ok {
			return
		}
		account = a
	}
	if s.cfg.Disabled {
		httpError(w, http.StatusNotFound, "runners_disabled", "self-hosted runners are disabled on this platform")
		return
	}
	if !isWebSocket(r) {
		httpError(w, http.StatusBadRequest, "not_a_websocket", "GET "+wire.Path+" must be a WebSocket upgrade")
		return
	}
	info, err := identity(r, account)
	if err != nil {
		httpError(w, http.StatusBadRequest, "invalid_runner", err.Error())
		return
	}
	info.ID = id
	if info.ID == "" {
		info.ID = s.cfg.RunnerID(account, info.Name)
	}
	info.ConnectedAt = time.Now().UTC()
	if s.cfg.TextStreamsOnly {
		// Declined: the runner's Info does not claim what this socket
		// will not carry.
		info.Caps = slices.DeleteFunc(info.Caps, func(c string) bool { return c == wire.CapBinaryStream })
	}
	if s.cfg.Meta != nil {
		info.Meta = s.cfg.Meta(r, info)
	}
	c := newConn(s, info)

	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		httpError(w, http.StatusServiceUnavailable, "shutting_down", "the platform is shutting down")
		return
	}
	s.wg.Add(1)
	s.mu.Unlock()
	defer s.wg.Done()

	if err := s.cfg.Host.Register(info.ID, c); err != nil {
		if errors.Is(err, ErrAlreadyRegistered) {
			httpError(w, http.StatusConflict, "runner_already_connected",
				fmt.Sprintf("a runner named %s is already connected for this account", info.Name))
		} else {
			httpError(w, http.StatusServiceUnavailable, "host_unavailable", err.Error())
		}
		close(c.done)
		return
	}
	if c.binary {
		w.Header().Set(wire.HeaderAccept, wire.CapBinaryStream)
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		s.cfg.Host.Unregister(info.ID, c)
		close(c.done)
		return
	}
	ws.SetReadLimit(wire.ReadLimit)
	c.ws = ws
	c.lastSeen.Store(time.Now().UnixNano())
	s.mu.Lock()
	s.conns[c] = struct{}{}
	closing := s.closing
	s.mu.Unlock()
	close(c.ready)
	c.firstCapacity()
	s.cfg.Host.Presence(info, true)
	s.log.Info("runner connected", "runner", info.ID, "name", info.Name, "hostname", info.Hostname)
	c.mu.Lock()
	c.hb = time.AfterFunc(s.cfg.HeartbeatInterval, c.heartbeat)
	c.mu.Unlock()
	if closing {
		_ = ws.Close(websocket.StatusGoingAway, "shutting down")
	}

	ctx, cancel := context.WithCancel(context.Background())
	err = c.readLoop(ctx)
	cancel()
	_ = ws.CloseNow()
	c.end()
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.log.Info("runner disconnected", "runner", info.ID, "name", info.Name, "err", err)
}

// Close closes every runner socket (1001 going away) and proxy connection
// and waits for their handlers. Call it before shutting the HTTP server
// down: hijacked connections are not the HTTP server's to close.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	conns := make([]*Conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	proxies := make([]*websocket.Conn, 0, len(s.proxies))
	for p := range s.proxies {
		proxies = append(proxies, p)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.ws.CloseNow()
	}
	for _, p := range proxies {
		_ = p.CloseNow()
	}
	s.wg.Wait()
}

// Call sends req to the runner runnerID and waits for its reply; see
// Conn.Call. No connection is Unavailable{runner_offline}.
func (s *Server) Call(ctx context.Context, runnerID string, req *wire.Request, sub *Subscription) (*wire.Reply, error) {
	c := s.cfg.Host.Whereis(runnerID)
	if c == nil {
		return nil, sandbox.Unavailable(ReasonOffline, nil)
	}
	return c.Call(ctx, req, sub)
}

var _ AccountCaller = (*Server)(nil)

// CallAs implements AccountCaller: Call, when runnerID is account's
// (ErrNotAccounts when it is another's; an empty account owns none).
func (s *Server) CallAs(ctx context.Context, account, runnerID string, req *wire.Request, sub *Subscription) (*wire.Reply, error) {
	c := s.cfg.Host.Whereis(runnerID)
	if c == nil {
		return nil, sandbox.Unavailable(ReasonOffline, nil)
	}
	if account == "" || c.Info().Account != account {
		return nil, ErrNotAccounts
	}
	return c.Call(ctx, req, sub)
}

// RunnerAccount implements RunnerAccounter over the server's Host.
func (s *Server) RunnerAccount(_ context.Context, id string) (string, bool) {
	c := s.cfg.Host.Whereis(id)
	if c == nil {
		return "", false
	}
	return c.Info().Account, true
}

// Unsubscribe removes a subscription installed by Call; total.
func (s *Server) Unsubscribe(sub *Subscription) { sub.Cancel() }

// Runners lists the online runners, most recently connected first.
func (s *Server) Runners(context.Context) ([]Info, error) {
	rs := s.cfg.Host.Online()
	SortByConnected(rs)
	return rs, nil
}
