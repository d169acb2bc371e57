package e2b

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Defaults of Config.
const (
	DefaultAPIURL             = "https://api.e2b.app"
	DefaultTemplate           = "base"
	DefaultUser               = "user"
	DefaultRequestTimeout     = 30 * time.Second
	DefaultLongRequestTimeout = 2 * time.Minute
	DefaultSandboxTimeout     = 1800 * time.Second
	DefaultHeartbeat          = 240 * time.Second
	DefaultKeepaliveInterval  = 50 * time.Second
	DefaultKillTimeout        = 10 * time.Second
	DefaultMaxPages           = 40
	// EnvdPort is the port of envd inside every sandbox.
	EnvdPort = 49983
)

// Config configures a Provider. The zero value of every field but APIKey
// takes its default; ConfigFromEnv fills it from the environment.
type Config struct {
	// APIKey is sent as X-API-Key to the control plane (E2B_API_KEY).
	APIKey string
	// Domain is the E2B domain (E2B_DOMAIN), default e2b.app. It names
	// the control plane when APIURL is empty (https://api.<Domain>) and
	// is the envd domain of a sandbox whose create or connect answer
	// names none. When Domain is empty and APIURL is set, Domain is
	// APIURL's host without its leading "api.".
	Domain string
	// APIURL is the control plane (E2B_API_URL, or E2B_BASE_URL),
	// default https://api.<Domain>.
	APIURL string
	// SandboxURL, when set (E2B_SANDBOX_URL), is the one endpoint that
	// serves every sandbox's envd, routed by the E2b-Sandbox-Id and
	// E2b-Sandbox-Port headers. When empty, envd is reached at
	// <scheme>://49983-<sandboxID>.<domain>, the domain being the one the
	// sandbox's create or connect answer (or GET /sandboxes/{id}) gave,
	// else Domain; scheme is APIURL's.
	SandboxURL string
	// Template is the templateID of created sandboxes (E2B_TEMPLATE),
	// default "base".
	Template string
	// User is the envd user that runs commands and owns files (E2B_USER),
	// default "user", the stock templates' user.
	User string
	// RequestTimeout bounds every control-plane and unary envd request and
	// spawn's wait for envd's start event; default 30 s.
	RequestTimeout time.Duration
	// LongRequestTimeout bounds create, pause and connect: create starts
	// a VM from its template (E2B's SDK gives every request 60 s and the
	// server holds a create until the sandbox has started), pause and
	// connect snapshot or restore a whole VM (memory included); each can
	// take longer than an ordinary request. Default 2 min, never less than
	// RequestTimeout.
	LongRequestTimeout time.Duration
	// KillTimeout bounds the process-tree kill of an exec that outlived
	// its deadline or was cancelled. The kill runs in the background: Exec
	// returns its exec_timeout or its context's error at once, and the
	// kill's outcome is logged. Close waits for kills still running.
	// Default 10 s.
	KillTimeout time.Duration
	// ExecWaitsForKill makes Exec return only once that kill is over (at
	// most KillTimeout later), for a process that may exit as soon as Exec
	// returns without calling Close first (a CLI): a background kill dies
	// with its process.
	ExecWaitsForKill bool
	// TransitionBackoff paces the retries of idempotent calls that E2B
	// answers 409 while the sandbox changes state (connect, timeout,
	// network, envd's List, ListDir, file reads and uploads); its zero
	// fields take 5 attempts, a 250 ms base and a 2 s ceiling. Only the
	// 409 is retried.
	TransitionBackoff sandbox.Backoff
	// SandboxTimeout is the TTL given at create, connect and on every
	// heartbeat, sent in whole seconds; default 1800 s.
	SandboxTimeout time.Duration
	// Heartbeat is how often a live command renews its sandbox's TTL;
	// default 4 min. The first heartbeat is sent when the command starts.
	Heartbeat time.Duration
	// KeepaliveInterval is the keepalive period asked of envd for streams
	// (whole seconds); default 50 s.
	KeepaliveInterval time.Duration
	// StallTimeout is how long a stream may stay silent (not even a
	// keepalive) before it is declared stalled and fails Unavailable;
	// default three keepalive intervals.
	StallTimeout time.Duration
	// MaxPages caps the listing's pages; default 40. Past it a full listing
	// is ErrTruncated.
	MaxPages int
	// HTTPClient is used for every request; default a client of its own
	// (no timeout: requests are bounded by RequestTimeout or the stream's
	// rules).
	HTTPClient *http.Client
	// Logger receives heartbeat failures and similar; default slog.Default().
	Logger *slog.Logger
}

// ConfigFromEnv reads E2B_API_KEY, E2B_DOMAIN, E2B_API_URL (or
// E2B_BASE_URL), E2B_SANDBOX_URL, E2B_TEMPLATE and E2B_USER.
func ConfigFromEnv() Config {
	c := Config{
		APIKey:     os.Getenv("E2B_API_KEY"),
		Domain:     os.Getenv("E2B_DOMAIN"),
		APIURL:     os.Getenv("E2B_API_URL"),
		SandboxURL: os.Getenv("E2B_SANDBOX_URL"),
		Template:   os.Getenv("E2B_TEMPLATE"),
		User:       os.Getenv("E2B_USER"),
	}
	if c.APIURL == "" {
		c.APIURL = os.Getenv("E2B_BASE_URL")
	}
	return c
}

// ErrNoAPIKey is returned by New when Config.APIKey is empty.
var ErrNoAPIKey = errors.New("e2b: E2B_API_KEY is not set — cannot talk to e2b.dev")

func (c Config) withDefaults() (Config, error) {
	if c.APIKey == "" {
		return c, ErrNoAPIKey
	}
	c.Domain = strings.Trim(c.Domain, "./")
	if c.APIURL == "" {
		c.APIURL = DefaultAPIURL
		if c.Domain != "" {
			c.APIURL = "https://api." + c.Domain
		}
	}
	c.APIURL = strings.TrimRight(c.APIURL, "/")
	u, err := url.Parse(c.APIURL)
	if err != nil {
		return c, errors.New("e2b: bad API URL: " + err.Error())
	}
	if c.Domain == "" {
		c.Domain = strings.TrimPrefix(u.Host, "api.")
	}
	c.SandboxURL = strings.TrimRight(c.SandboxURL, "/")
	if c.Template == "" {
		c.Template = DefaultTemplate
	}
	if c.User == "" {
		c.User = DefaultUser
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.LongRequestTimeout <= 0 {
		c.LongRequestTimeout = DefaultLongRequestTimeout
	}
	c.LongRequestTimeout = max(c.LongRequestTimeout, c.RequestTimeout)
	if c.KillTimeout <= 0 {
		c.KillTimeout = DefaultKillTimeout
	}
	if c.TransitionBackoff.Attempts <= 0 {
		c.TransitionBackoff.Attempts = 5
	}
	if c.TransitionBackoff.Base <= 0 {
		c.TransitionBackoff.Base = 250 * time.Millisecond
	}
	if c.TransitionBackoff.Max <= 0 {
		c.TransitionBackoff.Max = 2 * time.Second
	}
	if c.SandboxTimeout <= 0 {
		c.SandboxTimeout = DefaultSandboxTimeout
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.KeepaliveInterval <= 0 {
		c.KeepaliveInterval = DefaultKeepaliveInterval
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 3 * c.KeepaliveInterval
	}
	if c.MaxPages <= 0 {
		c.MaxPages = DefaultMaxPages
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// seconds renders d in whole seconds, at least 1.
func seconds(d time.Duration) int {
	s := int(d / time.Second)
	if s < 1 {
		s = 1
	}
	return s
}

// envdURL is the base URL of a sandbox's envd: SandboxURL when set,
// else 49983-<id>.<domain>, domain being the sandbox's own (from its
// create or connect answer) or, when it named none, Config.Domain.
func (c Config) envdURL(sandboxID, domain string) string {
	if c.SandboxURL != "" {
		return c.SandboxURL
	}
	if domain == "" {
		domain = c.Domain
	}
	scheme := "https"
	if u, err := url.Parse(c.APIURL); err == nil && u.Scheme != "" {
		scheme = u.Scheme
	}
	return scheme + "://" + itoa(EnvdPort) + "-" + sandboxID + "." + domain
}
