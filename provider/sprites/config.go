package sprites

import (
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Defaults for the fields of Config left unset.
const (
	DefaultBaseURL       = "https://api.sprites.dev"
	DefaultTimeout       = 30 * time.Second  // ordinary REST calls
	DefaultCreateTimeout = 120 * time.Second // the adopting Create (the SDK's fixed value)
	DefaultPolicyTimeout = 90 * time.Second  // the network-policy POST (a cold sprite boots first)
)

// The environment variables FromEnv reads.
const (
	EnvToken                     = "SPRITES_TOKEN"
	EnvAPIURL                    = "SPRITES_API_URL"
	EnvBaseURL                   = "SPRITES_BASE_URL" // older spelling, read when SPRITES_API_URL is unset
	EnvTimeoutMS                 = "SPRITES_TIMEOUT_MS"
	EnvPublicURLs                = "SPRITES_PUBLIC_URLS"
	EnvCheckpointCreationEnabled = "SPRITES_CHECKPOINT_CREATION_ENABLED"
)

// Config configures the provider. A zero field takes its default, so a
// host may fill every field unconditionally from its environment.
//
// Config never prints its Token: every fmt verb, %#v included, and slog
// show it as "[redacted]".
type Config struct {
	// Token is the bearer token (SPRITES_TOKEN). Required.
	Token string
	// BaseURL is the REST base (SPRITES_API_URL); the WebSocket base is
	// derived from it (http→ws). Default DefaultBaseURL.
	BaseURL string
	// Timeout bounds each ordinary REST call. Default 30 s.
	Timeout time.Duration
	// CreateTimeout bounds the adopting Create. Default 120 s.
	CreateTimeout time.Duration
	// PolicyTimeout bounds ApplyNetworkPolicy. Default 90 s.
	PolicyTimeout time.Duration
	// PublicURLs makes a new sprite's URL reachable without a platform
	// credential (url_settings.auth "public" rather than "sprite").
	// Nil means true.
	PublicURLs *bool
	// CheckpointCreationEnabled advertises checkpoint and
	// create_checkpoint_once and lets those calls through. Default false:
	// they answer ErrNotSupported without contacting Sprites.
	CheckpointCreationEnabled bool
	// Logger receives the provider's few log lines. Default slog.Default().
	Logger *slog.Logger
}

// Bool returns a pointer to v, for Config.PublicURLs.
func Bool(v bool) *bool { return &v }

// FromEnv reads a Config from SPRITES_TOKEN, SPRITES_API_URL (or
// SPRITES_BASE_URL), SPRITES_TIMEOUT_MS, SPRITES_PUBLIC_URLS and
// SPRITES_CHECKPOINT_CREATION_ENABLED. Unset variables leave the field
// zero, which New turns into the default. A malformed value is an error
// naming the variable.
func FromEnv() (Config, error) {
	var c Config
	c.Token = strings.TrimSpace(os.Getenv(EnvToken))
	c.BaseURL = strings.TrimSpace(os.Getenv(EnvAPIURL))
	if c.BaseURL == "" {
		c.BaseURL = strings.TrimSpace(os.Getenv(EnvBaseURL))
	}
	if v := strings.TrimSpace(os.Getenv(EnvTimeoutMS)); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return c, sandbox.Invalid("config", fmt.Sprintf("%s=%q is not a positive integer of milliseconds", EnvTimeoutMS, v))
		}
		c.Timeout = time.Duration(ms) * time.Millisecond
	}
	if v := strings.TrimSpace(os.Getenv(EnvPublicURLs)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, sandbox.Invalid("config", fmt.Sprintf("%s=%q is not a boolean", EnvPublicURLs, v))
		}
		c.PublicURLs = &b
	}
	if v := strings.TrimSpace(os.Getenv(EnvCheckpointCreationEnabled)); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, sandbox.Invalid("config", fmt.Sprintf("%s=%q is not a boolean", EnvCheckpointCreationEnabled, v))
		}
		c.CheckpointCreationEnabled = b
	}
	return c, nil
}

// withDefaults returns c with every unset field at its default, or an
// error when the token is missing or the base URL is unusable.
func (c Config) withDefaults() (Config, error) {
	if c.Token == "" {
		return c, sandbox.Invalid("config", EnvToken+" is not set (Config.Token is empty) — cannot talk to Sprites")
	}
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	u, err := url.Parse(c.BaseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, sandbox.Invalid("config", fmt.Sprintf("base URL %q is not an http(s) URL", c.BaseURL))
	}
	c.BaseURL = strings.TrimRight(c.BaseURL, "/")
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.CreateTimeout <= 0 {
		c.CreateTimeout = DefaultCreateTimeout
	}
	if c.PolicyTimeout <= 0 {
		c.PolicyTimeout = DefaultPolicyTimeout
	}
	if c.PublicURLs == nil {
		c.PublicURLs = Bool(true)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

func (c Config) publicURLs() bool { return c.PublicURLs == nil || *c.PublicURLs }

// String shows the configuration with the token redacted.
func (c Config) String() string {
	tok := ""
	if c.Token != "" {
		tok = "[redacted]"
	}
	pub := "default"
	if c.PublicURLs != nil {
		pub = strconv.FormatBool(*c.PublicURLs)
	}
	return fmt.Sprintf("sprites.Config{Token:%s BaseURL:%s Timeout:%v CreateTimeout:%v PolicyTimeout:%v PublicURLs:%s CheckpointCreationEnabled:%v}",
		tok, c.BaseURL, c.Timeout, c.CreateTimeout, c.PolicyTimeout, pub, c.CheckpointCreationEnabled)
}

// Format makes every verb, %+v and %#v included, print String's form.
func (c Config) Format(f fmt.State, verb rune) { fmt.Fprint(f, c.String()) }

// GoString is String, so %#v never shows the token.
func (c Config) GoString() string { return c.String() }

// LogValue keeps the token out of slog output.
func (c Config) LogValue() slog.Value {
	return slog.GroupValue(slog.String("base_url", c.BaseURL), slog.Bool("token_set", c.Token != ""),
		slog.Bool("checkpoint_creation_enabled", c.CheckpointCreationEnabled))
}

// MarshalJSON writes the configuration without the token.
func (c Config) MarshalJSON() ([]byte, error) {
	return fmt.Appendf(nil, `{"base_url":%q,"token_set":%v,"checkpoint_creation_enabled":%v}`,
		c.BaseURL, c.Token != "", c.CheckpointCreationEnabled), nil
}
