package policy_test

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/sandbox"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

var (
	canRun    = func() error { return nil }
	cannotRun = func() error { return errors.New("no user namespaces") }
)

func TestEnablementAndDefault(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		probe   func() error
		enabled []string
		def     string
	}{
		{"nothing set, local works", nil, canRun, []string{"local", "runner"}, "local"},
		{"local cannot run", nil, cannotRun, []string{"runner"}, "runner"},
		{"local switched off", []string{"SANDBOX_LOCAL_ENABLED", "off"}, canRun, []string{"runner"}, "runner"},
		{"credential enables hosted", []string{"E2B_API_KEY", "k", "DAYTONA_API_KEY", "d"}, cannotRun, []string{"e2b", "daytona", "runner"}, "e2b"},
		{"local beats hosted", []string{"SPRITES_TOKEN", "t"}, canRun, []string{"local", "sprites", "runner"}, "local"},
		{"blank credential is unset", []string{"SPRITES_TOKEN", "  "}, cannotRun, []string{"runner"}, "runner"},
		{"runners off", []string{"SANDBOX_RUNNERS_ENABLED", "false"}, canRun, []string{"local"}, "local"},
		{"runners blank is on", []string{"SANDBOX_RUNNERS_ENABLED", ""}, cannotRun, []string{"runner"}, "runner"},
		{"explicit default", []string{"SPRITES_TOKEN", "t", "SANDBOX_PROVIDER", "sprites"}, canRun, []string{"local", "sprites", "runner"}, "sprites"},
		{"runner as default needs no credential", []string{"SANDBOX_PROVIDER", "runner"}, canRun, []string{"local", "runner"}, "runner"},
		{"nothing enabled", []string{"SANDBOX_RUNNERS_ENABLED", "0"}, cannotRun, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.FromEnv(env(tc.env...), policy.Options{LocalProbe: tc.probe})
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.Join(p.EnabledNames(), ","); got != strings.Join(tc.enabled, ",") {
				t.Errorf("enabled = %s, want %s", got, strings.Join(tc.enabled, ","))
			}
			if p.Default() != tc.def {
				t.Errorf("default = %q, want %q", p.Default(), tc.def)
			}
		})
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		want []string // substrings of the error
	}{
		{[]string{"SANDBOX_PROVIDER", "e2b"}, []string{"SANDBOX_PROVIDER", "E2B_API_KEY is not set"}},
		{[]string{"SANDBOX_PROVIDER", "local", "SANDBOX_LOCAL_ENABLED", "no"}, []string{"SANDBOX_PROVIDER", "SANDBOX_LOCAL_ENABLED is false"}},
		{[]string{"SANDBOX_PROVIDER", "runner", "SANDBOX_RUNNERS_ENABLED", "no"}, []string{"SANDBOX_PROVIDER", "SANDBOX_RUNNERS_ENABLED is false"}},
		{[]string{"SANDBOX_PROVIDER", "modal"}, []string{"SANDBOX_PROVIDER", "unknown provider"}},
		{[]string{"SANDBOX_RUNNERS_ENABLED", "maybe"}, []string{"SANDBOX_RUNNERS_ENABLED", "maybe"}},
		{[]string{"SANDBOX_LOCAL_ENABLED", "2"}, []string{"SANDBOX_LOCAL_ENABLED"}},
	} {
		_, err := policy.FromEnv(env(tc.env...), policy.Options{LocalProbe: canRun})
		if err == nil {
			t.Errorf("%v: no error", tc.env)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", tc.env, err, w)
			}
		}
	}
}

func TestChoose(t *testing.T) {
	p, err := policy.FromEnv(env("SPRITES_TOKEN", "secret-token"), policy.Options{LocalProbe: cannotRun, Extra: []string{"fake"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := p.Choose(""); err != nil || got != "sprites" {
		t.Fatalf("Choose(\"\") = %q, %v", got, err)
	}
	for _, pin := range []string{"sprites", "runner", "fake"} {
		if got, err := p.Choose(pin); err != nil || got != pin {
			t.Errorf("Choose(%q) = %q, %v", pin, got, err)
		}
	}
	for pin, want := range map[string]string{"e2b": "E2B_API_KEY is not set", "local": "no user namespaces", "modal": "unknown provider"} {
		_, err := p.Choose(pin)
		var iv *sandbox.InvalidError
		if !errors.As(err, &iv) || iv.Reason != sandbox.ReasonProvider || !strings.Contains(err.Error(), pin) || !strings.Contains(err.Error(), want) {
			t.Errorf("Choose(%q) = %v, want Invalid{provider} naming it and %q", pin, err, want)
		}
		if strings.Contains(err.Error(), "secret-token") {
			t.Errorf("a credential leaked into %v", err)
		}
	}
	if p.Default() == "fake" {
		t.Error("an extra provider became the implicit default")
	}
}

func TestNothingEnabledNamesWhatToSet(t *testing.T) {
	p, err := policy.FromEnv(env("SANDBOX_RUNNERS_ENABLED", "off"), policy.Options{})
	if err != nil {
		t.Fatalf("nothing enabled must still start: %v", err)
	}
	_, err = p.Choose("")
	for _, w := range []string{"SPRITES_TOKEN", "E2B_API_KEY", "DAYTONA_API_KEY", "SANDBOX_RUNNERS_ENABLED"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Choose with nothing enabled = %v, want it to name %s", err, w)
		}
	}
}

// TestDefaultIsSaid (issue 42 item 5): the chosen default and its reason
// are logged when the policy is read: a warning naming the hosted
// provider, and why local is off, when a hosted key alone made it the
// default; info for local or an explicit SANDBOX_PROVIDER. Fails on the
// old code: nothing was said (no DefaultReason, no log).
func TestDefaultIsSaid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		env   []string
		probe func() error
		level string
		want  []string
	}{
		{"a hosted key alone", []string{"E2B_API_KEY", "k"}, cannotRun, "WARN", []string{"default=e2b", "no user namespaces", "SANDBOX_PROVIDER"}},
		{"local", []string{"E2B_API_KEY", "k"}, canRun, "INFO", []string{"default=local", "first choice"}},
		{"explicit", []string{"E2B_API_KEY", "k", "SANDBOX_PROVIDER", "e2b"}, canRun, "INFO", []string{"default=e2b", "SANDBOX_PROVIDER names it"}},
		{"runner only", []string{"SANDBOX_LOCAL_ENABLED", "false"}, canRun, "WARN", []string{"default=runner", "SANDBOX_LOCAL_ENABLED is false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf strings.Builder
			p, err := policy.FromEnv(env(tc.env...), policy.Options{LocalProbe: tc.probe, Logger: slog.New(slog.NewTextHandler(&buf, nil))})
			if err != nil {
				t.Fatal(err)
			}
			out := buf.String()
			if strings.Count(out, "\n") != 1 || !strings.Contains(out, "level="+tc.level) {
				t.Fatalf("log %q, want one %s line", out, tc.level)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("log %q lacks %q", out, w)
				}
			}
			if p.DefaultReason() == "" || !strings.Contains(out, p.DefaultReason()) {
				t.Errorf("DefaultReason %q not in the log %q", p.DefaultReason(), out)
			}
		})
	}
}
