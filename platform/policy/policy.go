// Package policy is the platform's provider policy (sandbox contract §7):
// which providers are enabled, which one a new sandbox goes to, and the
// refusal of a pin on a provider that is off. It reads nothing but the
// environment it is given and a probe of the local mechanism, so a host
// other than `managoat serve` can use it as it is:
//
//	pol, err := policy.FromEnv(os.LookupEnv, policy.Options{LocalProbe: probe})
//	name, err := pol.Choose(pinFromRequest) // "" takes the default
//
// The rules:
//   - A hosted provider (sprites, e2b, daytona) is enabled exactly when its
//     credential is set: SPRITES_TOKEN, E2B_API_KEY, DAYTONA_API_KEY.
//   - The runner provider is enabled unless SANDBOX_RUNNERS_ENABLED is false
//     (blank is true; true/1/yes/on and false/0/no/off; anything else is
//     refused, naming the variable).
//   - The local provider is enabled when the probe (the one `managoat
//     doctor` runs: the chosen mechanism can be opened on this host)
//     passes, unless SANDBOX_LOCAL_ENABLED is false.
//   - SANDBOX_PROVIDER sets the default. Unset, the default is local when
//     local is enabled, else the first enabled hosted provider (sprites,
//     e2b, daytona, in that order), else the runner provider when it is on
//     (a runner needs no credential: the spec makes it a valid default). An
//     explicit default that is not enabled, or unknown, is an error naming
//     SANDBOX_PROVIDER: the host refuses to start. With nothing enabled
//     there is no default and every Choose fails with an error naming what
//     to set.
//   - Why local first, where the Elixir library's default is sprites:
//     managoat's embedded default is a sandbox of this host's kernel (no
//     account, no bill, no daemon, nothing leaves the machine), so a
//     platform that can run one sends an unpinned create there rather than
//     to whichever hosted account has a key in the environment. The
//     consequence to know: with local off (SANDBOX_LOCAL_ENABLED=false, or
//     a host that cannot run the mechanism) a hosted key alone makes that
//     provider the default. So the choice and its reason are said at
//     start (DefaultReason; FromEnv logs them to Options.Logger, a warning
//     when the implicit default is not local), and SANDBOX_PROVIDER makes
//     it explicit.
//   - A pin names a provider for one create; a pin that is unknown or not
//     enabled is Invalid{provider}, naming it.
package policy

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/managoat/managoat/sandbox"
)

// Environment variables the policy reads.
const (
	EnvDefault        = "SANDBOX_PROVIDER"
	EnvRunnersEnabled = "SANDBOX_RUNNERS_ENABLED"
	EnvLocalEnabled   = "SANDBOX_LOCAL_ENABLED"
	EnvSprites        = "SPRITES_TOKEN"
	EnvE2B            = "E2B_API_KEY"
	EnvDaytona        = "DAYTONA_API_KEY"
)

// Provider names the policy knows, in the order of preference of the
// default: local, then the hosted providers, then runner.
const (
	Local   = "local"
	Sprites = "sprites"
	E2B     = "e2b"
	Daytona = "daytona"
	Runner  = "runner"
)

var hosted = []struct{ name, env string }{{Sprites, EnvSprites}, {E2B, EnvE2B}, {Daytona, EnvDaytona}}

// Options are what the environment does not say.
type Options struct {
	// LocalProbe reports why this host cannot run the local provider's
	// mechanism (nil: it can). A nil LocalProbe means local is off.
	LocalProbe func() error
	// Extra providers enabled besides those of the environment, in order
	// (tests enable "fake" this way). An Extra provider is never the
	// implicit default.
	Extra []string
	// Logger, when set, hears the default chosen and why (DefaultReason):
	// info for an explicit or local default, a warning for an implicit one
	// that is another (a hosted key in the environment made it so).
	Logger *slog.Logger
}

// Policy is the outcome of reading the environment once.
type Policy struct {
	enabled []string          // in preference order
	why     map[string]string // why a known provider is off
	def     string
	reason  string // why def is the default
	known   []string
}

// FromEnv reads the policy from lookup (os.LookupEnv in a host). It fails
// only on a value it cannot accept: a SANDBOX_RUNNERS_ENABLED or
// SANDBOX_LOCAL_ENABLED that is not a boolean, or a SANDBOX_PROVIDER that
// is unknown or not enabled; the error names the variable.
func FromEnv(lookup func(string) (string, bool), o Options) (*Policy, error) {
	get := func(k string) string {
		v, _ := lookup(k)
		return strings.TrimSpace(v)
	}
	p := &Policy{why: map[string]string{}}
	localOn, err := parseBool(EnvLocalEnabled, get(EnvLocalEnabled))
	if err != nil {
		return nil, err
	}
	switch {
	case !localOn:
		p.why[Local] = EnvLocalEnabled + " is false"
	case o.LocalProbe == nil:
		p.why[Local] = "no local mechanism probe"
	default:
		if err := o.LocalProbe(); err != nil {
			p.why[Local] = "this host cannot run it: " + err.Error() + " (see managoat doctor)"
		} else {
			p.enabled = append(p.enabled, Local)
		}
	}
	for _, h := range hosted {
		if get(h.env) != "" {
			p.enabled = append(p.enabled, h.name)
		} else {
			p.why[h.name] = h.env + " is not set"
		}
	}
	runnersOn, err := parseBool(EnvRunnersEnabled, get(EnvRunnersEnabled))
	if err != nil {
		return nil, err
	}
	if runnersOn {
		p.enabled = append(p.enabled, Runner)
	} else {
		p.why[Runner] = EnvRunnersEnabled + " is false"
	}
	p.known = []string{Local, Sprites, E2B, Daytona, Runner}
	for _, x := range o.Extra {
		if !slices.Contains(p.known, x) {
			p.known = append(p.known, x)
		}
		if !slices.Contains(p.enabled, x) {
			p.enabled = append(p.enabled, x)
			delete(p.why, x)
		}
	}
	if d := get(EnvDefault); d != "" {
		if !slices.Contains(p.known, d) {
			return nil, fmt.Errorf("%s=%q: unknown provider (known: %s)", EnvDefault, d, strings.Join(p.known, ", "))
		}
		if !p.Enabled(d) {
			return nil, fmt.Errorf("%s=%q names a provider that is not enabled: %s", EnvDefault, d, p.why[d])
		}
		p.def = d
		p.reason = EnvDefault + " names it"
		p.logDefault(o.Logger, false)
		return p, nil
	}
	for _, c := range []string{Local, Sprites, E2B, Daytona, Runner} {
		if p.Enabled(c) {
			p.def = c
			break
		}
	}
	switch p.def {
	case "":
		p.reason = "no provider is enabled"
	case Local:
		p.reason = "local is enabled, and is the first choice (" + EnvDefault + " unset)"
	case Runner:
		p.reason = "runner is the only provider enabled (" + EnvDefault + " unset; local: " + p.why[Local] + ")"
	default:
		p.reason = fmt.Sprintf("%s is the first hosted provider with a credential (%s unset; local: %s)", p.def, EnvDefault, p.why[Local])
	}
	p.logDefault(o.Logger, p.def != Local)
	return p, nil
}

// logDefault says the default and why; loud when it is implicit and not
// local.
func (p *Policy) logDefault(l *slog.Logger, loud bool) {
	if l == nil {
		return
	}
	def := p.def
	if def == "" {
		def = "none"
	}
	if loud {
		l.Warn("policy: an unpinned create goes to "+def+"; set "+EnvDefault+" to choose", "default", def, "why", p.reason, "enabled", strings.Join(p.enabled, ","))
		return
	}
	l.Info("policy: default provider", "default", def, "why", p.reason, "enabled", strings.Join(p.enabled, ","))
}

// DefaultReason says why Default is the default: SANDBOX_PROVIDER named
// it, or which rule picked it and why local did not.
func (p *Policy) DefaultReason() string { return p.reason }

// parseBool reads an enablement switch: blank is true.
func parseBool(env, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "", "true", "1", "yes", "on":
		return true, nil
	case "false", "0", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%s=%q: want true/1/yes/on or false/0/no/off", env, v)
}

// Enabled reports whether name is enabled.
func (p *Policy) Enabled(name string) bool { return slices.Contains(p.enabled, name) }

// EnabledNames lists the enabled providers in preference order.
func (p *Policy) EnabledNames() []string { return slices.Clone(p.enabled) }

// Default is the provider of a create that pins none; "" when nothing is
// enabled.
func (p *Policy) Default() string { return p.def }

// WhyDisabled says why a known provider is off ("" when it is on).
func (p *Policy) WhyDisabled(name string) string { return p.why[name] }

// Choose returns the provider a create goes to: pin when it names an
// enabled provider, the default when pin is "". Every refusal is
// Invalid{provider} naming the provider, or, with nothing enabled, naming
// what to set.
func (p *Policy) Choose(pin string) (string, error) {
	if pin == "" {
		if p.def == "" {
			return "", &sandbox.InvalidError{Reason: sandbox.ReasonProvider, Msg: "no sandbox provider is enabled: set " +
				EnvSprites + ", " + EnvE2B + " or " + EnvDaytona + ", connect a runner (" + EnvRunnersEnabled +
				" not false), or run the platform where the local mechanism works (managoat doctor)"}
		}
		return p.def, nil
	}
	if !slices.Contains(p.known, pin) {
		return "", &sandbox.InvalidError{Reason: sandbox.ReasonProvider,
			Msg: fmt.Sprintf("unknown provider %q (known: %s)", clip(pin), strings.Join(p.known, ", "))}
	}
	if !p.Enabled(pin) {
		return "", &sandbox.InvalidError{Reason: sandbox.ReasonProvider,
			Msg: fmt.Sprintf("provider %q is not enabled on this platform: %s", pin, p.why[pin])}
	}
	return pin, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
