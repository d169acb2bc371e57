// Package runner is the self-hosted runner daemon: it dials out to a
// managoat platform over one WebSocket (no inbound port, works behind NAT)
// and serves any sandbox.Provider over the runner protocol of
// provider/runner/wire. The CLI wires provider/local into it:
//
//	err := runner.Run(ctx, runner.Config{URL: url, Token: tok, Name: name, Root: root, Provider: p})
//
// Run reconnects with backoff 1, 2, 4, 8, 16, then 30 s (the counter is reset
// by a clean close, which waits 1 s, and by any connection that was made, so
// a platform's restart costs a connected daemon 1 s, not the 30 s its
// earlier refusals had reached), and stops for good, with a message saying
// why, when the platform answers 400, 401, 403 or 404.
//
// Sessions. A spawn asks the provider for a detachable session and the
// daemon keeps one upstream Command per session, journals every event, and
// sends frames only while a platform listener is attached. spawn and attach
// answer, replay the journal tagged replay_for, and switch live output on,
// all under the session's lock, so no frame is missed or duplicated (Fountain's
// daemon could duplicate a frame for an attach to an attached session,
// spec §2.9 D2). Output is bound to the connection of the most recent spawn
// or attach, so after a reconnect an attach rebinds it to the new socket (Fountain's
// daemon kept the dead socket's writer, D1). stdin and stdin_close of one
// session run in arrival order (Fountain's daemon ran every request in its own
// goroutine, so two writes could swap, D4); other ops run concurrently and
// their replies may be reordered.
//
// The daemon holds a session in memory (upstream and journal) only while a
// platform listener is attached: on detach, or when the socket closes, a
// session the provider can give back through Attach is dropped, and the
// next attach or stdin takes it back from the provider, replaying from byte
// zero (Fountain's daemon kept every journal in memory for the daemon's life,
// D6). Output the provider replays after such an attach's reply reaches the
// platform untagged, as live frames; the platform had no listener left on
// that session, so every listener still gets every byte exactly once, in
// order. Even while attached, a session keeps at most 8 MiB of output in
// the daemon's memory: past it the journal is dropped and a later attach
// is replayed by the provider (see maxJournal); 256 MB of output while
// attached peaked at 80 MB of heap, against 470 MB with the whole output
// held (go test -run '^$' -bench AttachedSessionMemory -benchtime 1x
// ./runner/).
//
// The runner host is bounded (bounds.go): durations and sizes from the
// wire are checked before use (wall_clock_ms 2^62 is invalid, not "no
// limit"); a create's disk_bytes may ask at most Config.DiskShare (one
// half) of the homes' free space, and one without gets the daemon's
// default home quota (Config.DefaultDiskBytes) when it has one; a connection has at most Config.MaxOpsPerConn requests served
// at once, the socket left unread while none is free, for up to
// Config.BusyWait, before a request is answered rate_limited; file reads
// and writes are bounded in number (Config.MaxFileOps) and a read is
// refused from the file's size before it is read, then encoded from the
// file straight into its reply (three concurrent read_file of a 1 GB
// file no longer take the daemon to 3 GB: go test -run
// TestReadFileMemoryBounded -v ./runner/ measures 80 MiB of growth for
// six reads of 20 MiB beside them).
//
// Keep-alive (the later original's fix for half-open sockets): the daemon
// pings the platform every PingInterval and reconnects when a ping goes
// unanswered for PingTimeout.
//
// Sessions outlive the socket and the daemon: stopping the daemon detaches
// its upstream Commands locally and never terminates a session, so with
// provider/local (whose supervisors own the processes and journals on disk)
// an attach after a restart recovers the session through the provider's own
// Attach, which replays from byte zero. Finished sessions beyond 100 per
// sandbox are dropped from the daemon's memory too.
//
// A session's id on the wire is the provider's own (sandbox.Command.
// SessionID), followed by "--" and 16 hex digits of the SHA-256 of its
// sandbox's name, so list_sessions and attach agree across restarts and
// two sandboxes' sessions never share an id (provider/local numbers the
// sessions of each sandbox s1, s2, ...; keyed by that alone, one
// sandbox's output, stdin and attach reached another's). A request reaches
// only the sessions of the sandbox it names, and stdin, stdin_close and
// attach must name one; one may name a session by its wire id or by the
// provider's id. A command whose provider names no session gets a daemon
// id s-<unix>-<n> (tagged too), which attaches only while the daemon
// lives.
//
// list_sessions says each session's state (the extension field "state" of
// wire.Session: running, exited or lost), as the provider's own listing
// gives it (provider/local reads it from its supervisors' records, so it
// holds across the daemon's restarts), else as this daemon saw a session
// it holds; an exited session has its exit_code either way. The platform
// keeps a sandbox with a running session from being parked however quiet
// the session is.
//
// Two extension ops, network_policy and terminate_session, are served when
// the provider advertises the capability; the daemon reports them in the
// handshake's caps parameter so the platform can advertise them. An
// extension field, create's limits, passes a sandbox's resource limits to
// the provider (which refuses a limit it cannot enforce); the daemon
// reports it as create_limits, and the platform sends limits to no daemon
// without it (Fountain's daemon ignores the field: the limits would be lost).
//
// Fleet placement: the daemon sends its labels (Config.Labels, the CLI's
// --label) in the handshake and answers the extension op capacity
// (capacity.go says each figure) with its host's CPUs, memory, the
// homes' disk, load and its sandboxes running and idle; the platform asks
// it at every heartbeat and places new sandboxes by it (provider/runner's
// placement policy).
package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// Version is reported in the handshake when Config.Version is empty.
var Version = "dev"

// Config configures the daemon. URL, Token, Name and Provider are required.
type Config struct {
	URL      string // the platform's base URL, http(s)://host[:port][/path]
	Token    string // the API key, sent as a Bearer token
	Name     string // the runner's name, ^[a-z0-9][a-z0-9._-]{0,62}$
	Root     string // the sandbox root on this host, reported to the platform
	Provider sandbox.Provider

	Version  string // reported in the handshake; default Version
	Hostname string // default os.Hostname()
	Logger   *slog.Logger

	BackoffBase  time.Duration // first reconnect delay; default 1 s
	BackoffMax   time.Duration // delay cap; default 30 s
	DialTimeout  time.Duration // default 30 s
	WriteTimeout time.Duration // per frame; default 30 s
	// PingInterval is the daemon's keep-alive: it pings the platform this
	// often and drops a socket whose ping is not answered within
	// PingTimeout, so a half-open socket (a laptop that slept) reconnects.
	// Default 10 s and 5 s; negative disables.
	PingInterval, PingTimeout time.Duration
	HTTPClient                *http.Client
	// TextStreamsOnly keeps output in base64 text frames, as Fountain's
	// daemon: the daemon does not report wire.CapBinaryStream. Otherwise
	// it reports it and sends output as binary frames when the platform
	// takes them (the upgrade's wire.HeaderAccept lists the cap).
	TextStreamsOnly bool
	// The runner host's bounds (bounds.go says each rule). DiskShare is
	// the share of the homes' free space one create's disk_bytes may ask
	// (default DefaultDiskShare, one half); DefaultDiskBytes the home
	// quota of a create that asks none (0 or negative: none added, the
	// provider's own default stands). MaxOpsPerConn bounds the
	// requests of one connection served at once (default 64), MaxFileOps
	// the daemon's read_file and write_file under way (default 2); a
	// request finding no place waits up to BusyWait (default 1 s), the
	// socket unread, then is answered rate_limited.
	DiskShare        float64
	DefaultDiskBytes int64
	// Labels are the runner's labels (key=value, wire.CheckLabel's
	// bounds), sent in the handshake: the platform places sandboxes by
	// them (a create's runner selector). CapacityCPUs, CapacityMemory
	// and CapacityDisk replace the host's own figures in the capacity the
	// daemon reports (wire.OpCapacity; 0 is the host's), and MaxSandboxes
	// is the most sandboxes the platform should place here (0: no bound).
	Labels                       map[string]string
	CapacityCPUs                 int
	CapacityMemory, CapacityDisk int64
	MaxSandboxes                 int
	MaxOpsPerConn                int
	MaxFileOps                   int
	BusyWait                     time.Duration
	// OnDisconnect, if set, is called after each connection attempt ends
	// and before the wait: the attempt counter (0 after a clean close), the
	// delay, and the error (nil for a clean close).
	OnDisconnect func(attempt int, delay time.Duration, err error)
}

// PermanentError is a refusal that retrying cannot fix: Run stops with it.
type PermanentError struct {
	Status int // the HTTP status, 0 for a configuration error
	Msg    string
}

func (e *PermanentError) Error() string { return e.Msg }

// Run runs a daemon until ctx is done (then it returns nil) or the platform
// refuses it for good (a *PermanentError).
func Run(ctx context.Context, cfg Config) error {
	d, err := New(cfg)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Run(ctx)
}

// Daemon serves a provider to a platform. Its sessions outlive connections.
type Daemon struct {
	cfg Config
	p   sandbox.Provider
	log *slog.Logger
	u   string // the dial URL
	// connected is set by Once when its dial succeeded; Run takes it.
	connected atomic.Bool

	mu       sync.Mutex
	sessions map[string]*session
	seq      atomic.Int64
	recoMu   sync.Mutex // serialises session recovery
	closed   bool
	wg       sync.WaitGroup

	fileOps   chan struct{} // a place per read_file or write_file under way
	frameBufs chan []byte   // read_file reply buffers for reuse, at most MaxFileOps
}

// New validates cfg and returns a daemon.
func New(cfg Config) (*Daemon, error) {
	if cfg.Provider == nil {
		return nil, &PermanentError{Msg: "runner: no provider"}
	}
	if cfg.Name == "" {
		return nil, &PermanentError{Msg: "runner: no name"}
	}
	if cfg.Version == "" {
		cfg.Version = Version
	}
	if cfg.Hostname == "" {
		cfg.Hostname, _ = os.Hostname()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.BackoffBase, time.Second)
	def(&cfg.BackoffMax, 30*time.Second)
	def(&cfg.DialTimeout, 30*time.Second)
	def(&cfg.WriteTimeout, 30*time.Second)
	def(&cfg.PingInterval, 10*time.Second)
	def(&cfg.PingTimeout, 5*time.Second)
	def(&cfg.BusyWait, time.Second)
	if cfg.DiskShare <= 0 || cfg.DiskShare > 1 {
		cfg.DiskShare = DefaultDiskShare
	}
	if cfg.MaxOpsPerConn <= 0 {
		cfg.MaxOpsPerConn = 64
	}
	if cfg.MaxFileOps <= 0 {
		cfg.MaxFileOps = 2
	}
	for k, v := range cfg.Labels {
		if err := wire.CheckLabel(k, v); err != nil {
			return nil, &PermanentError{Msg: "runner: " + err.Error()}
		}
	}
	if len(cfg.Labels) > wire.MaxLabels {
		return nil, &PermanentError{Msg: fmt.Sprintf("runner: more than %d labels", wire.MaxLabels)}
	}
	caps := extraCaps(cfg.Provider)
	if !cfg.TextStreamsOnly {
		caps = append(caps, wire.CapBinaryStream)
	}
	q := url.Values{
		wire.ParamName:     {cfg.Name},
		wire.ParamHostname: {cfg.Hostname},
		wire.ParamOS:       {runtime.GOOS},
		wire.ParamArch:     {runtime.GOARCH},
		wire.ParamVersion:  {cfg.Version},
		wire.ParamRoot:     {cfg.Root},
		wire.ParamCaps:     {strings.Join(caps, ",")},
	}
	if len(cfg.Labels) > 0 {
		q.Set(wire.ParamLabels, wire.FormatLabels(cfg.Labels))
	}
	u, err := DialURL(cfg.URL, q)
	if err != nil {
		return nil, err
	}
	return &Daemon{cfg: cfg, p: cfg.Provider, log: cfg.Logger, u: u, sessions: map[string]*session{},
		fileOps: make(chan struct{}, cfg.MaxFileOps), frameBufs: make(chan []byte, cfg.MaxFileOps)}, nil
}

// extraCaps are the capabilities beyond suspend and attach the daemon serves.
func extraCaps(p sandbox.Provider) []string {
	out := []string{wire.CapLimits, wire.CapDiskLimit, wire.CapCapacity, wire.CapAttachOffset}
	caps := p.Capabilities()
	if caps.Has(sandbox.CapNetworkPolicy) {
		out = append(out, string(sandbox.CapNetworkPolicy))
	}
	if _, ok := p.(sandbox.CommandSignaler); ok {
		out = append(out, wire.CapSignal)
	}
	_, fr := p.(sandbox.FileReader)
	_, fo := p.(sandbox.FileOpener)
	if fr || fo {
		out = append(out, wire.CapReadFile)
	}
	if _, ok := p.(sandbox.SessionTerminator); ok && caps.Has(sandbox.CapTerminateSession) {
		out = append(out, string(sandbox.CapTerminateSession))
		if caps.Has(sandbox.CapForceTerminateSession) {
			out = append(out, string(sandbox.CapForceTerminateSession))
		}
	}
	return out
}

// RedactURL is raw with any password in it replaced by "xxxxx", for logs
// and errors; a URL that does not parse is replaced whole.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// DialURL maps a base URL to the daemon's WebSocket URL: trailing slashes
// stripped, https→wss and http→ws (any other scheme is a PermanentError),
// wire.Path appended, and the query set.
func DialURL(base string, q url.Values) (string, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil {
		return "", &PermanentError{Msg: fmt.Sprintf("runner: bad platform URL %q: %v", RedactURL(base), err)}
	}
	switch u.Scheme {
	case "https":
		u.Scheme = "wss"
	case "http":
		u.Scheme = "ws"
	default:
		return "", &PermanentError{Msg: fmt.Sprintf("runner: platform URL %q must be http or https", RedactURL(base))}
	}
	u.Path = strings.TrimRight(u.Path, "/") + wire.Path
	u.RawPath = ""
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// Backoff is the delay before reconnect attempt n (n ≤ 0 counts as 1):
// base·2^(n-1), capped at max.
func Backoff(n int, base, max time.Duration) time.Duration {
	if n < 1 {
		n = 1
	}
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}

// Run connects and reconnects until ctx is done (nil) or a permanent refusal.
func (d *Daemon) Run(ctx context.Context) error {
	d.log.Info("runner starting", "name", d.cfg.Name, "root", d.cfg.Root, "url", RedactURL(d.cfg.URL))
	attempt := 0
	for {
		err := d.Once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var perm *PermanentError
		if errors.As(err, &perm) {
			d.log.Error("runner stopped", "err", err)
			return err
		}
		why := "closed"
		if d.connected.Swap(false) {
			attempt = 0 // the connection was made: the platform is back
		}
		if err == nil {
			attempt = 0
		} else {
			attempt++
			why = err.Error()
		}
		delay := Backoff(attempt, d.cfg.BackoffBase, d.cfg.BackoffMax)
		d.log.Warn("runner disconnected; reconnecting", "in", delay, "err", why)
		if d.cfg.OnDisconnect != nil {
			d.cfg.OnDisconnect(attempt, delay, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Once dials the platform and serves one connection until it ends: nil for
// a clean close (1000 or 1001 from the platform, or ctx done), a
// *PermanentError for a refusal retrying cannot fix, another error otherwise.
func (d *Daemon) Once(ctx context.Context) error {
	dctx, cancel := context.WithTimeout(ctx, d.cfg.DialTimeout)
	ws, resp, err := websocket.Dial(dctx, d.u, &websocket.DialOptions{
		HTTPClient:      d.cfg.HTTPClient,
		HTTPHeader:      http.Header{"Authorization": {"Bearer " + d.cfg.Token}},
		CompressionMode: websocket.CompressionDisabled,
	})
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			return d.refusal(resp)
		}
		return fmt.Errorf("runner: connect: %w", err)
	}
	ws.SetReadLimit(wire.ReadLimit)
	d.connected.Store(true)
	d.log.Info("runner connected", "name", d.cfg.Name)
	binary := false
	if !d.cfg.TextStreamsOnly {
		for _, c := range strings.Split(resp.Header.Get(wire.HeaderAccept), ",") {
			binary = binary || strings.TrimSpace(c) == wire.CapBinaryStream
		}
	}
	return d.serve(ctx, ws, binary)
}

func (d *Daemon) refusal(resp *http.Response) error {
	var body []byte
	if resp.Body != nil {
		body, _ = io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
	}
	b := strings.TrimSpace(string(body))
	switch s := resp.StatusCode; s {
	case http.StatusUnauthorized, http.StatusForbidden:
		return &PermanentError{Status: s, Msg: fmt.Sprintf("runner: the platform refused the API key (%d): %s", s, b)}
	case http.StatusNotFound:
		return &PermanentError{Status: s, Msg: "runner: self-hosted runners are disabled on this platform (404): " + b}
	case http.StatusBadRequest:
		return &PermanentError{Status: s, Msg: fmt.Sprintf("runner: the platform rejected the runner (400): %s", b)}
	case http.StatusConflict:
		return fmt.Errorf("runner: a runner named %q is already connected for this account", d.cfg.Name)
	default:
		return fmt.Errorf("runner: connect: HTTP %d: %s", s, b)
	}
}

// Close detaches the daemon from its upstream Commands. It never terminates
// a session: with a provider whose sessions outlive this process they go
// on and can be attached again after a restart.
func (d *Daemon) Close() {
	d.mu.Lock()
	d.closed = true
	ss := make([]*session, 0, len(d.sessions))
	for _, s := range d.sessions {
		ss = append(ss, s)
	}
	d.sessions = map[string]*session{}
	d.mu.Unlock()
	for _, s := range ss {
		_ = s.upstream().Stop()
	}
	d.wg.Wait()
}

// Held is how many sessions the daemon holds in memory (those with a
// platform listener, plus running ones a provider cannot give back).
func (d *Daemon) Held() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

// DefaultName derives a runner name from a hostname, as Fountain's daemon did:
// lowercase; cut at the first '.' (unless it leads); every run of characters
// outside [a-z0-9._-] becomes '-'; leading and trailing '-', '.', '_'
// trimmed; "runner" when nothing is left; at most 63 bytes.
func DefaultName(hostname string) string {
	h := strings.ToLower(hostname)
	if i := strings.IndexByte(h, '.'); i > 0 {
		h = h[:i]
	}
	var b strings.Builder
	dash := false
	for i := 0; i < len(h); i++ {
		c := h[i]
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-' {
			b.WriteByte(c)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	n := strings.Trim(b.String(), "-._")
	if n == "" {
		n = "runner"
	}
	if len(n) > 63 {
		n = n[:63]
	}
	return n
}
