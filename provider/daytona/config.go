package daytona

import (
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"
)

// Environment variables read by ConfigFromEnv.
const (
	EnvAPIKey   = "DAYTONA_API_KEY"
	EnvAPIURL   = "DAYTONA_API_URL"
	EnvSnapshot = "DAYTONA_SNAPSHOT"
	// EnvDomainAllowListEnforced set to 1 or true sets
	// Config.DomainAllowListEnforced.
	EnvDomainAllowListEnforced = "DAYTONA_DOMAIN_ALLOWLIST_ENFORCED"
)

// DefaultAPIURL is the hosted control plane; self-hosted installations set
// Config.APIURL (or DAYTONA_API_URL) to their own base, which ends in /api.
const DefaultAPIURL = "https://app.daytona.io/api"

// Config configures a Provider. Only APIKey is required; every zero field
// takes the default documented on it.
type Config struct {
	// APIKey is the bearer token for the control plane and the toolbox.
	APIKey string
	// APIURL is the control-plane base URL; zero means DefaultAPIURL.
	APIURL string
	// Snapshot, when set, is the snapshot new sandboxes are created from
	// (it must be registered with the organization; an unknown one answers
	// 400, which Create surfaces as Invalid). Zero means the organization's
	// default image.
	Snapshot string
	// Timeout bounds each HTTP request; zero means 30 s.
	Timeout time.Duration
	// HTTPClient is the client used for every request; zero means a client
	// of its own (never http.DefaultClient, whose settings others may change).
	HTTPClient *http.Client
	// ShimDir is the directory inside the sandbox that holds the stdin FIFO,
	// the exit-code sentinel and their companions. Zero means
	// "${TMPDIR:-/tmp}/managoat", expanded by the sandbox's shell.
	ShimDir string
	// PollMin and PollMax bound the LogStream's polling interval: it polls
	// at PollMin after new output and backs off, doubling, to PollMax while
	// nothing changes. Zero means 100 ms and 1 s.
	PollMin, PollMax time.Duration
	// StartTimeout bounds the wait for a sandbox to reach "started" after a
	// start (or while it is starting). Zero means 2 min.
	StartTimeout time.Duration
	// DomainAllowListEnforced says that this installation's runners enforce
	// a sandbox's domainAllowList. The hosted service (DefaultAPIURL) is
	// taken to, as its documentation says (its runner is not public); the
	// public-source runner (release v0.190.0) stores the list and ignores
	// it, so elsewhere ApplyNetworkPolicy refuses a non-empty allow-list
	// unless this is set, rather than leave the network open.
	DomainAllowListEnforced bool
	// Logger receives warnings (LogStream failures); zero means slog.Default().
	Logger *slog.Logger
}

// ErrNoAPIKey is returned when no API key is configured.
var ErrNoAPIKey = errors.New("daytona: " + EnvAPIKey + " is not set — cannot talk to Daytona")

// ConfigFromEnv reads DAYTONA_API_KEY (required), DAYTONA_API_URL,
// DAYTONA_SNAPSHOT and DAYTONA_DOMAIN_ALLOWLIST_ENFORCED (1 or true). Blank
// values count as unset.
func ConfigFromEnv() (Config, error) {
	enf := strings.ToLower(strings.TrimSpace(os.Getenv(EnvDomainAllowListEnforced)))
	cfg := Config{
		APIKey:                  strings.TrimSpace(os.Getenv(EnvAPIKey)),
		APIURL:                  strings.TrimSpace(os.Getenv(EnvAPIURL)),
		Snapshot:                strings.TrimSpace(os.Getenv(EnvSnapshot)),
		DomainAllowListEnforced: enf == "1" || enf == "true",
	}
	if cfg.APIKey == "" {
		return cfg, ErrNoAPIKey
	}
	return cfg, nil
}

func (c Config) withDefaults() Config {
	if c.APIURL == "" {
		c.APIURL = DefaultAPIURL
	}
	c.APIURL = strings.TrimRight(c.APIURL, "/")
	if c.Timeout <= 0 {
		c.Timeout = 30 * time.Second
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if c.PollMin <= 0 {
		c.PollMin = 100 * time.Millisecond
	}
	if c.PollMax <= 0 {
		c.PollMax = time.Second
	}
	if c.PollMax < c.PollMin {
		c.PollMax = c.PollMin
	}
	if c.StartTimeout <= 0 {
		c.StartTimeout = 2 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}
