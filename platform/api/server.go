// Package api is the platform's versioned HTTP API (/v1): accounts' sandboxes
// on every enabled provider, behind one Bearer API key per account. JSON
// for requests and answers, a WebSocket for a command's streams (spawn and
// attach, stdin, close stdin), and the OpenAPI document of it all at
// GET /v1/openapi.json.
//
//	srv, err := api.New(api.Config{Store: st, Policy: pol, Providers: ps, Runners: relay})
//	http.Handle("/v1/", srv)
//
// What it keeps: every sandbox has a record (store.Sandbox) naming the
// provider that created it, its name there, its state, URL and activity.
// A create picks the provider by policy (a pin, or the default), inserts the
// record first (the store arbitrates two creates of one name), then asks
// the provider; every later call goes to the record's provider, and a
// parked sandbox is woken there on its next use (a call that meets a park
// under way, state parking, waits for it first: Park says why no call
// slips between a park's check and its suspend). A bounded write
// (create_new, destroy_once, create_checkpoint_once, terminate_session)
// is made only once its intent is recorded, else refused 503
// unavailable; an operation id is a sandbox's once (a checkpoint POST
// with one it has used is 409 already_exists, never sent again), and a
// session whose termination has an unknown outcome (its intent uncertain
// after a 503 termination_unconfirmed, or pending past ParkingStale) is
// refused every use, terminate and attach (stdin with it), 503
// unavailable{termination_unconfirmed}, until lifecycle settles the
// intent. An account sees only its
// own records: another account's sandbox is 404, never 403. Runner
// sandboxes are placed among the account's online runners by capacity,
// labels and cordons, and counted against each runner's reported
// capacity in the store (fleet.go).
//
// Names: the account's name is its own; on the provider a sandbox is
// "mgp-" and 20 random hex digits (a runner's: the runner's own name
// form), so two accounts' names never meet on a provider and the reaper
// recognises what the platform made.
//
// Ports: a sandbox of a provider that publishes ports on this host
// (PortPublisher: provider/local, created with publish) is reached
// through the API itself, /v1/sandboxes/{name}/ports/{port}/PATH, any
// method, WebSockets included, with the account's key, which the
// application never sees (proxy.go says how, and its bounds); its url is
// that of its first port (PortURL). A provider's own URL (Sprites) is
// kept as it is.
//
// Bad input: malformed JSON is 400 naming the field, an unknown or disabled
// provider 400 naming it, a body over the limit 413, a wrong key 401 (429
// once its address has failed too often: Bounds), a key over its rate 429
// with Retry-After. No key appears in a log or an error.
//
// Bounds: each key's requests (Config.Rate, Burst); each source address's
// failed authentications (Config.FailedAuthRate, Burst, default 10/s
// burst 20; an IPv6 address counted by its /64): past them the address's
// requests are 429 rate_limited{failed_auth} with Retry-After, refused
// without a store lookup, its good keys too, until a token comes back; an
// account's open streams (Config.StreamMaxPerAccount, default 256: 429
// rate_limited{streams} with Retry-After, before the upgrade; a closed
// stream frees its place); an account's file reads and writes under way
// (Config.FileTransfersPerAccount, default 4: 429
// rate_limited{file_transfers} with Retry-After; each streams through a
// 64 KiB buffer, files.go); a sandbox's proxied connections (proxy.go);
// an account's sandboxes (Config.MaxSandboxesPerAccount, default 1000)
// and runner names (RunnerAuth.MaxRunners, default 100): one more is 403
// denied{resource_exhausted} (a runner's: resource_exhausted) with a
// message naming the bound.
//
// Where this differs from Fountain's platform, on purpose: a
// create with no runner of the account online is 503 no_runner_online with
// Retry-After (Fountain's platform answered 409: it is transient, a machine that
// is off comes back); every error carries the sandbox taxonomy's kind, so
// the Go client gives back the very error the provider gave (not found and
// transient never collapse across the API); a create that meets a
// concurrent create of its name (any replica) waits for it and adopts
// instead of racing it on the provider.
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"golang.org/x/time/rate"

	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// NamePrefix starts the provider-side name of every sandbox the platform
// makes (except a runner's, whose names carry their runner).
const NamePrefix = "mgp-"

// Config configures the API.
type Config struct {
	Store  store.Store    // required
	Policy *policy.Policy // required
	// Providers are the enabled providers by name (not the runner
	// provider, which Runners gives per account).
	Providers map[string]sandbox.Provider
	// Runners reaches the runners: the relay (*runner.Server) of this
	// process, or a cluster-wide Caller (provider/runner/natshost) when
	// several replicas share the runners; nil when runners are off.
	Runners runnerprov.Caller
	Logger  *slog.Logger
	// MaxBody bounds a JSON body (default 1 MiB); MaxFile a file write's
	// body (default 32 MiB).
	MaxBody, MaxFile int64
	// Rate and Burst bound each key's requests (default 200/s, burst 400).
	Rate  rate.Limit
	Burst int
	// Now is the clock (default time.Now).
	Now func() time.Time
	// BaseURL is the platform's URL as its clients reach it, which a
	// sandbox's proxied url starts with (default: the scheme and Host of
	// the request that made the sandbox).
	BaseURL string
	// The proxy's bounds (proxy.go): proxied connections per sandbox at
	// once (default 64), how long a connection to an application may
	// idle (default 2 min), and a request body's size (default 64 MiB).
	ProxyMaxConns int
	ProxyIdle     time.Duration
	ProxyMaxBody  int64
	// StreamMaxPerAccount bounds an account's open streams (WebSockets of
	// /v1/sandboxes/{name}/stream, all its sandboxes and keys together)
	// on this server (default DefaultStreamMaxPerAccount); more are 429
	// rate_limited{streams} before the upgrade.
	StreamMaxPerAccount int
	// FailedAuthRate and FailedAuthBurst bound the failed authentications
	// (a missing, malformed, unknown, wrong or revoked key) per source
	// address, an IPv6 one by its /64 (default 10/s, burst 20): past them
	// every request from the address is 429 rate_limited{failed_auth}
	// with Retry-After, answered without a store lookup, until its bucket
	// has a token again. Another address is not affected. The address is
	// the TCP peer's: behind a reverse proxy every client has the proxy's,
	// and shares its bound.
	FailedAuthRate  rate.Limit
	FailedAuthBurst int
	// FileTransfersPerAccount bounds an account's file reads and writes
	// under way at once on this server (default
	// DefaultFileTransfersPerAccount); more are 429
	// rate_limited{file_transfers} with Retry-After (files.go).
	FileTransfersPerAccount int
	// MaxSandboxesPerAccount bounds the sandbox records an account holds,
	// every provider's, parked ones too (default
	// DefaultMaxSandboxesPerAccount): a create of one more is 403
	// denied{resource_exhausted} saying so; adopting a name it holds is
	// not a new one. Creates in this process are counted one at a time;
	// creates through several replicas at once may pass it by the creates
	// in flight. The runners' bound is RunnerAuth.MaxRunners.
	MaxSandboxesPerAccount int
	// PreviewSecret signs preview links and their cookies (preview.go;
	// default: random, so links last the process); PreviewDomain is the
	// DNS name under which each preview has a host of its own (default
	// "localhost").
	PreviewSecret []byte
	PreviewDomain string
}

// DefaultMaxSandboxesPerAccount is Config.MaxSandboxesPerAccount's default.
const DefaultMaxSandboxesPerAccount = 1000

// Server serves /v1.
type Server struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux

	mu       sync.Mutex
	limiters map[string]*rate.Limiter
	active   map[string]int       // open streams per record key
	touched  map[string]time.Time // a record's last activity written, to write it at most once a second
	// touchedSweep is the size of touched past which marks older than a
	// second are swept.
	touchedSweep int
	closing      bool
	streams      map[*websocket.Conn]struct{}
	wg           sync.WaitGroup
	locks        map[string]*recLock // serialises wake/park of one record in this process

	proxied map[string]int // open proxied connections per record key (proxy.go)
	// acctStreams counts the open streams per account (stream.go).
	acctStreams map[string]int
	// failed holds the failed authentications' bucket per source address;
	// failedSweep is its size past which full buckets are dropped.
	failed      map[string]*rate.Limiter
	failedSweep int
	files       fileSlots // file transfers per account (files.go)
	transport   *http.Transport
	closed      context.Context // done at Close
	close       context.CancelFunc
	preview     previewState // preview.go

	fleet fleetState // placement on runners (fleet.go)
}

// New returns the API server.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Policy == nil {
		return nil, errors.New("api: Store and Policy are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.MaxFile <= 0 {
		cfg.MaxFile = 32 << 20
	}
	if cfg.Rate <= 0 {
		cfg.Rate = 200
	}
	if cfg.Burst <= 0 {
		cfg.Burst = 2 * int(cfg.Rate)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Providers == nil {
		cfg.Providers = map[string]sandbox.Provider{}
	}
	if cfg.ProxyMaxConns <= 0 {
		cfg.ProxyMaxConns = DefaultProxyMaxConns
	}
	if cfg.ProxyIdle <= 0 {
		cfg.ProxyIdle = DefaultProxyIdle
	}
	if cfg.ProxyMaxBody <= 0 {
		cfg.ProxyMaxBody = DefaultProxyMaxBody
	}
	if cfg.StreamMaxPerAccount <= 0 {
		cfg.StreamMaxPerAccount = DefaultStreamMaxPerAccount
	}
	if cfg.FailedAuthRate <= 0 {
		cfg.FailedAuthRate = DefaultFailedAuthRate
	}
	if cfg.FailedAuthBurst <= 0 {
		cfg.FailedAuthBurst = DefaultFailedAuthBurst
	}
	if cfg.MaxSandboxesPerAccount <= 0 {
		cfg.MaxSandboxesPerAccount = DefaultMaxSandboxesPerAccount
	}
	s := &Server{cfg: cfg, log: cfg.Logger, mux: http.NewServeMux(), limiters: map[string]*rate.Limiter{},
		active: map[string]int{}, touched: map[string]time.Time{}, streams: map[*websocket.Conn]struct{}{}, locks: map[string]*recLock{}, touchedSweep: minTouchedSweep,
		proxied: map[string]int{}, acctStreams: map[string]int{},
		failed: map[string]*rate.Limiter{}, failedSweep: minFailedSweep, transport: newProxyTransport(cfg.ProxyIdle)}
	s.closed, s.close = context.WithCancel(context.Background())
	for _, r := range Routes {
		h := s.handler(r.Handler)
		pattern := r.Method + " " + r.Path
		if r.Handler == "proxy" {
			pattern = strings.Replace(pattern, "{path}", "{path...}", 1) // the rest of the path, slashes and all
		}
		if r.Public {
			s.mux.HandleFunc(pattern, func(w http.ResponseWriter, req *http.Request) { h(w, req, store.Key{}) })
			continue
		}
		s.mux.HandleFunc(pattern, s.auth(h))
	}
	s.mux.HandleFunc("/v1/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, &apiError{http.StatusNotFound, &Error{Kind: "not_found", Reason: "route", Message: "no such route: " + r.Method + " " + r.URL.Path}})
	})
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close closes every open stream and proxied connection and waits for
// their handlers.
func (s *Server) Close() {
	s.mu.Lock()
	s.closing = true
	s.close()
	conns := make([]*websocket.Conn, 0, len(s.streams))
	for c := range s.streams {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		_ = c.Close(websocket.StatusGoingAway, "platform shutting down")
	}
	s.wg.Wait()
	s.transport.CloseIdleConnections()
}

type handlerFunc func(w http.ResponseWriter, r *http.Request, k store.Key)

func (s *Server) handler(name string) handlerFunc {
	switch name {
	case "openapi":
		return s.openapi
	case "providers":
		return s.providers
	case "runners":
		return s.fleetRunners // fleet.go
	case "runner_cordon":
		return s.runnerCordon
	case "runner_uncordon":
		return s.runnerUncordon
	case "runner_drain":
		return s.runnerDrain
	case "runner_labels":
		return s.runnerLabels
	case "create":
		return s.create
	case "list":
		return s.list
	case "get":
		return s.get
	case "destroy":
		return s.destroy
	case "exec":
		return s.exec
	case "stream":
		return s.stream
	case "sessions":
		return s.sessions
	case "terminate":
		return s.terminate
	case "suspend":
		return s.suspend
	case "resume":
		return s.resume
	case "write_file":
		return s.writeFile
	case "read_file":
		return s.readFile
	case "network_policy":
		return s.networkPolicy
	case "url":
		return s.url
	case "checkpoints":
		return s.checkpoints // checkpoints.go
	case "checkpoint":
		return s.checkpoint
	case "restore":
		return s.restore
	case "proxy":
		return s.proxy
	case "preview":
		return s.previewCreate // preview.go
	case "previews":
		return s.previewList
	case "preview_revoke":
		return s.previewRevoke
	case "ports":
		return s.ports
	}
	panic("api: no handler " + name)
}

func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// Failed authentications' bounds' defaults (Config.FailedAuthRate, Burst).
const (
	DefaultFailedAuthRate  = 10
	DefaultFailedAuthBurst = 20
	// minFailedSweep is the number of addresses' buckets kept before the
	// first sweep of the full ones.
	minFailedSweep = 1024
)

// auth checks the source address's failed authentications, the Bearer key
// and the key's rate, then calls h.
func (s *Server) auth(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		addr := sourceOf(r)
		if d, ok := s.mayAuthenticate(addr); !ok {
			w.Header().Set("Retry-After", RetryAfterHeader(d))
			w.Header().Set("Connection", "close")
			writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "failed_auth",
				Message: "too many failed authentications from this address", RetryAfterMS: max(d.Milliseconds(), 1)}})
			return
		}
		k, err := Authenticate(r.Context(), s.cfg.Store, bearer(r))
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				writeErr(w, sandbox.Unavailable("store", err))
				return
			}
			s.authFailed(addr)
			w.Header().Set("WWW-Authenticate", `Bearer realm="managoat"`)
			w.Header().Set("Connection", "close")
			writeErr(w, &apiError{http.StatusUnauthorized, &Error{Kind: KindUnauthorized, Message: ErrBadKey.Error()}})
			return
		}
		if d, ok := s.allow(k.ID); !ok {
			w.Header().Set("Retry-After", RetryAfterHeader(d))
			writeErr(w, &apiError{http.StatusTooManyRequests, &Error{Kind: "rate_limited", Reason: "api_key",
				Message: "this API key is over its rate", RetryAfterMS: max(d.Milliseconds(), 1)}})
			return
		}
		h(w, r, k)
	}
}

// sourceOf is the request's source address as the failed
// authentications' bound counts it: the peer's IP (never a header the
// caller sets), an IPv6 one by its /64 (one host commonly holds the whole
// prefix).
func sourceOf(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		if p, err := ip.WithZone("").Prefix(64); err == nil {
			return p.String()
		}
	}
	return ip.String()
}

// mayAuthenticate reports whether addr may try a key now (its bucket of
// failed authentications has a token), or how long until it may.
func (s *Server) mayAuthenticate(addr string) (time.Duration, bool) {
	s.mu.Lock()
	l := s.failed[addr]
	s.mu.Unlock()
	if l == nil {
		return 0, true
	}
	if t := l.TokensAt(s.cfg.Now()); t < 1 {
		return time.Duration((1 - t) / float64(s.cfg.FailedAuthRate) * float64(time.Second)), false
	}
	return 0, true
}

// authFailed takes a token of addr's bucket of failed authentications.
// The buckets are swept of the full ones (an address that has not failed
// for FailedAuthBurst/FailedAuthRate) whenever they double, so they hold
// about the addresses that failed lately.
func (s *Server) authFailed(addr string) {
	now := s.cfg.Now()
	s.mu.Lock()
	l := s.failed[addr]
	if l == nil {
		if len(s.failed) >= s.failedSweep {
			for a, b := range s.failed {
				if b.TokensAt(now) >= float64(s.cfg.FailedAuthBurst) {
					delete(s.failed, a)
				}
			}
			s.failedSweep = max(minFailedSweep, 2*len(s.failed))
		}
		l = rate.NewLimiter(s.cfg.FailedAuthRate, s.cfg.FailedAuthBurst)
		s.failed[addr] = l
	}
	s.mu.Unlock()
	l.AllowN(now, 1)
}

// allow takes one token of the key's bucket, or says how long until one.
func (s *Server) allow(keyID string) (time.Duration, bool) {
	s.mu.Lock()
	l := s.limiters[keyID]
	if l == nil {
		l = rate.NewLimiter(s.cfg.Rate, s.cfg.Burst)
		s.limiters[keyID] = l
	}
	s.mu.Unlock()
	now := s.cfg.Now()
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return d, false
	}
	return 0, true
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, err error) {
	status, e := ErrorOf(err)
	switch {
	case e.Kind == "rate_limited" && w.Header().Get("Retry-After") == "":
		w.Header().Set("Retry-After", RetryAfterHeader(time.Duration(e.RetryAfterMS)*time.Millisecond))
	case status == http.StatusServiceUnavailable && strings.HasPrefix(e.Reason, "runner_") || e.Reason == "no_runner_online":
		// A machine that is off comes back on its own time: say when to ask again.
		w.Header().Set("Retry-After", "5")
	}
	writeJSON(w, status, errorBody{Error: e})
}

// decode reads a JSON body of at most MaxBody into v: 413 over the limit,
// 400 naming the field for anything malformed.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, s.cfg.MaxBody)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil {
		if dec.More() {
			return badJSON("body", "more than one JSON value")
		}
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			return tooLarge(err)
		}
		return nil
	}
	var mbe *http.MaxBytesError
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &mbe):
		return tooLarge(err)
	case errors.Is(err, io.EOF):
		return badJSON("body", "empty body: a JSON object is required")
	case errors.As(err, &se):
		return badJSON("body", fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se))
	case errors.As(err, &te):
		f := te.Field
		if f == "" {
			f = "body"
		}
		return badJSON(f, fmt.Sprintf("field %q must be %s, not %s", f, te.Type, te.Value))
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return badJSON(f, fmt.Sprintf("unknown field %q", f))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badJSON("body", "truncated JSON")
	}
	return badJSON("body", err.Error())
}

func badJSON(field, msg string) error {
	return &apiError{http.StatusBadRequest, &Error{Kind: "invalid", Reason: "json", Field: field, Message: msg}}
}

func tooLarge(err error) error {
	return &apiError{http.StatusRequestEntityTooLarge, &Error{Kind: KindTooLarge, Reason: "body", Message: "the request body is over the limit: " + err.Error()}}
}

// ProviderFor returns the provider of name for account: the runner
// provider is per account, so it places on and reaches only the account's
// runners.
func (s *Server) ProviderFor(accountID, name string) (sandbox.Provider, error) {
	if name == policy.Runner && s.cfg.Runners != nil && s.cfg.Policy.Enabled(policy.Runner) {
		return runnerprov.NewProvider(AccountRunners(s.cfg.Runners, accountID), runnerprov.ProviderOptions{}), nil
	}
	p, ok := s.cfg.Providers[name]
	if !ok || !s.cfg.Policy.Enabled(name) {
		return nil, &sandbox.InvalidError{Reason: sandbox.ReasonProvider, Msg: fmt.Sprintf("provider %q is not enabled on this platform", name)}
	}
	return p, nil
}

// accountRunners is a runner Caller that sees only one account's runners.
type accountRunners struct {
	srv     runnerprov.Caller
	account string
}

// AccountRunners is srv seen from one account: its Runners are the
// account's online runners (most recently connected first), and a call to
// another account's runner is Unavailable{runner_offline}.
func AccountRunners(srv runnerprov.Caller, accountID string) runnerprov.Caller {
	return accountRunners{srv, accountID}
}

func (a accountRunners) Call(ctx context.Context, runnerID string, req *wire.Request, sub *runnerprov.Subscription) (*wire.Reply, error) {
	if !a.owns(ctx, runnerID) {
		return nil, sandbox.Unavailable(runnerprov.ReasonOffline, nil)
	}
	ac, ok := a.srv.(runnerprov.AccountCaller)
	if !ok {
		return a.srv.Call(ctx, runnerID, req, sub)
	}
	// The call names its account, so the replica holding the runner's
	// socket checks it too. Its refusal reads as owns' (offline), not as
	// not_found: the reaper takes not_found for a sandbox that is gone.
	rep, err := ac.CallAs(ctx, a.account, runnerID, req, sub)
	if errors.Is(err, runnerprov.ErrNotAccounts) {
		return nil, sandbox.Unavailable(runnerprov.ReasonOffline, errors.New("the replica holding the runner refused the account"))
	}
	return rep, err
}

// owns reports whether runnerID is online and the account's.
func (a accountRunners) owns(ctx context.Context, runnerID string) bool {
	if ra, ok := a.srv.(runnerprov.RunnerAccounter); ok {
		acct, online := ra.RunnerAccount(ctx, runnerID)
		return online && acct == a.account
	}
	rs, err := a.srv.Runners(ctx)
	if err != nil {
		return false
	}
	for _, r := range rs {
		if r.ID == runnerID {
			return r.Account == a.account
		}
	}
	return false
}

func (a accountRunners) Unsubscribe(sub *runnerprov.Subscription) { a.srv.Unsubscribe(sub) }

func (a accountRunners) Runners(ctx context.Context) ([]runnerprov.Info, error) {
	all, err := a.srv.Runners(ctx)
	if err != nil {
		return nil, err
	}
	mine := all[:0:0]
	for _, r := range all {
		if r.Account == a.account {
			mine = append(mine, r)
		}
	}
	return mine, nil
}

// RunnerAuth authenticates runner daemons: with their account's API key
// (the runner then belongs to that account), else with an enrolment of
// the runners file (Fallback, may be nil), whose account name is mapped to
// the account of that name.
//
// Each runner name an account connects is recorded (store.Runner) with a
// random id, made when the name is first claimed and never derived from
// the account and the name: its sandboxes route to that id. What may
// connect as the name afterwards: once the runner has connected with its
// enrolment credential, only that credential (an API key of the account
// is refused 403, also after the runner was deleted: DELETE
// /api/runners/ID closes the socket and keeps the record); a name first
// claimed by an API key, only that key until it is revoked (then the next
// key of the account to connect takes it over, keeping the id). An
// enrolment takes over a name an API key claimed. The record goes only by
// an operator's act (store.DeleteRunner; `managoat serve admin runner rm`),
// and the name's next claimant gets a new id, never the old sandboxes.
//
// MaxRunners bounds the runner names an account holds (default
// DefaultMaxRunnersPerAccount): a connection under one more name is 403
// resource_exhausted.
type RunnerAuth struct {
	Store      store.Store
	Fallback   runnerprov.RunnerAuthenticator
	MaxRunners int
}

// DefaultMaxRunnersPerAccount is RunnerAuth.MaxRunners' default.
const DefaultMaxRunnersPerAccount = 100

var _ runnerprov.RunnerIdentifier = RunnerAuth{}

// AuthenticateRunner implements runner.RunnerAuthenticator.
func (a RunnerAuth) AuthenticateRunner(r *http.Request, key, name string) (string, error) {
	acct, _, err := a.IdentifyRunner(r, key, name)
	return acct, err
}

// IdentifyRunner implements runner.RunnerIdentifier: the account and the
// id recorded for the runner's name, claiming the name if the account
// does not hold it yet.
func (a RunnerAuth) IdentifyRunner(r *http.Request, key, name string) (string, string, error) {
	ctx := r.Context()
	if strings.HasPrefix(key, KeyPrefix) {
		k, err := Authenticate(ctx, a.Store, key)
		if err != nil {
			if !errors.Is(err, ErrBadKey) {
				return "", "", sandbox.Unavailable("store", err)
			}
			return "", "", runnerprov.ErrUnauthorized
		}
		if !runnerprov.ValidName(name) {
			return k.AccountID, "", nil // the handshake refuses the name (400)
		}
		id, err := a.claim(ctx, k.AccountID, name, k.ID)
		return k.AccountID, id, err
	}
	if a.Fallback == nil {
		return "", "", runnerprov.ErrUnauthorized
	}
	acct, err := a.Fallback.AuthenticateRunner(r, key, name)
	if err != nil {
		return "", "", err
	}
	if ac, err := a.Store.AccountByName(ctx, acct); err == nil {
		acct = ac.ID
	} else if !errors.Is(err, store.ErrNotFound) {
		return "", "", sandbox.Unavailable("store", err)
	}
	id, err := a.claim(ctx, acct, name, "")
	return acct, id, err
}

// claim returns the id of account's runner name, recording the name for
// the caller (an API key's id, or "" for the runner's own enrolment
// credential) when the account does not hold it, and refusing a caller
// that may not connect as it.
func (a RunnerAuth) claim(ctx context.Context, account, name, keyID string) (string, error) {
	enrolled := keyID == ""
	for attempt := 0; attempt < 4; attempt++ {
		rec, err := a.Store.RunnerByName(ctx, account, name)
		if errors.Is(err, store.ErrNotFound) {
			max := a.MaxRunners
			if max <= 0 {
				max = DefaultMaxRunnersPerAccount
			}
			held, err := a.Store.ListRunners(ctx, account)
			if err != nil {
				return "", sandbox.Unavailable("store", err)
			}
			if len(held) >= max {
				return "", refusal{runnerprov.ErrResourceExhausted, fmt.Sprintf("the account holds %d runner names, the most it may (serve --runners-per-account); "+
					"connect one of them, or have an operator free one (managoat serve admin runner rm ACCOUNT NAME)", len(held))}
			}
			rec = store.Runner{AccountID: account, Name: name, ID: runnerprov.NewRunnerID(), Enrolled: enrolled, KeyID: keyID, CreatedAt: time.Now().UTC()}
			if err := a.Store.AddRunner(ctx, rec); errors.Is(err, store.ErrAlreadyExists) {
				continue // another connection claimed it first: judge against its record
			} else if err != nil {
				return "", sandbox.Unavailable("store", err)
			}
			return rec.ID, nil
		}
		if err != nil {
			return "", sandbox.Unavailable("store", err)
		}
		next := rec
		switch {
		case enrolled && rec.Enrolled, !enrolled && !rec.Enrolled && rec.KeyID == keyID:
			return rec.ID, nil
		case enrolled:
			next.Enrolled, next.KeyID = true, "" // an enrolment takes over a key's claim
		case rec.Enrolled:
			return "", refusal{runnerprov.ErrForbidden, fmt.Sprintf("runner %q is enrolled: only its own credential connects as it, no API key (not after a delete either)", name)}
		default:
			k, err := a.Store.KeyByID(ctx, rec.KeyID)
			if err == nil && k.RevokedAt.IsZero() {
				return "", refusal{runnerprov.ErrForbidden, fmt.Sprintf("runner name %q is held by another API key of the account (%s): only it connects as the name while it is valid", name, rec.KeyID)}
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return "", sandbox.Unavailable("store", err)
			}
			next.KeyID = keyID // its key is revoked or gone: this key takes the name over
		}
		if err := a.Store.UpdateRunner(ctx, rec, next); errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrNotFound) {
			continue
		} else if err != nil {
			return "", sandbox.Unavailable("store", err)
		}
		return rec.ID, nil
	}
	return "", sandbox.Unavailable("store", errors.New("the runner's record kept changing"))
}

// refusal is a runner's refusal with its own message, matching the
// relay's error (runner.ErrForbidden, ErrResourceExhausted) for its status.
type refusal struct {
	kind error
	msg  string
}

func (r refusal) Error() string { return r.msg }
func (r refusal) Unwrap() error { return r.kind }

// Authenticate implements runner.Authenticator with account API keys (for
// the runner list and the proxy of the relay).
func (a RunnerAuth) Authenticate(r *http.Request, key string) (string, error) {
	k, err := Authenticate(r.Context(), a.Store, key)
	if err != nil {
		return "", runnerprov.ErrUnauthorized
	}
	return k.AccountID, nil
}
