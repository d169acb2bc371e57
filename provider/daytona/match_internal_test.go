package daytona

import (
	"encoding/base64"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// The patterns isShellName, envelopePayload and displayCommand hand-implement.
var (
	envKeyRe   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	envelopeRe = regexp.MustCompile(`printf %s ([A-Za-z0-9+/=]+) \| base64 -d`)
	cmdTagRe   = regexp.MustCompile(`' managoat ([A-Za-z0-9+/=]+)$`)
)

// regexpDisplayCommand is displayCommand as it was written with cmdTagRe.
func regexpDisplayCommand(recorded string) string {
	if m := cmdTagRe.FindStringSubmatch(recorded); m != nil {
		if b, err := base64.StdEncoding.DecodeString(m[1]); err == nil {
			return string(b)
		}
	}
	return recorded
}

// matchCorpus mixes the patterns' literal pieces with base64 and stray bytes.
func matchCorpus() []string {
	env, _ := envelope("echo hi; exit 3", "x")
	c := []string{"", "A", "_", "0", "a0", "0a", "_9", "A_b9", "a b", "a-b", "a\n", "é", "a\xff", "a\x00",
		env, env + " ' managoat " + base64.StdEncoding.EncodeToString([]byte("echo 'hi'")),
		"printf %s  | base64 -d", "printf %s QQ== | base64 -d", "printf %s QQ==| base64 -d",
		"printf %s printf %s QQ== | base64 -d", "printf %s Q Q | base64 -d printf %s QUI= | base64 -d",
		"' managoat ", "' managoat QQ==", "' managoat QQ== ", "x' managoat QQ=", "'' managoat ' managoat QQ==",
		"' managoat \xffQQ==", "' managoat é"}
	pieces := []string{"printf %s ", " | base64 -d", "' managoat ", "QQ==", "aGk=", "+", "/", "=", " ", "'",
		"a", "Z", "9", "_", "|", "\n", "\xff", "é", "-", "printf", "managoat", "base64 -d"}
	r := rand.New(rand.NewPCG(5, 6))
	for range 3000 {
		var b strings.Builder
		for range r.IntN(8) {
			b.WriteString(pieces[r.IntN(len(pieces))])
		}
		c = append(c, b.String())
	}
	return c
}

func checkMatchers(t *testing.T, s string) {
	t.Helper()
	if got, want := isShellName(s), envKeyRe.MatchString(s); got != want {
		t.Fatalf("isShellName(%q) = %v, regexp says %v", s, got, want)
	}
	p, ok := envelopePayload(s)
	if m := envelopeRe.FindStringSubmatch(s); (m != nil) != ok || ok && m[1] != p {
		t.Fatalf("envelopePayload(%q) = %q, %v; regexp says %q", s, p, ok, m)
	}
	if got, want := displayCommand(s), regexpDisplayCommand(s); got != want {
		t.Fatalf("displayCommand(%q) = %q, regexp version says %q", s, got, want)
	}
}

func TestMatchersAgreeWithRegexps(t *testing.T) {
	for _, s := range matchCorpus() {
		checkMatchers(t, s)
	}
}

func FuzzMatchers(f *testing.F) {
	for _, s := range matchCorpus()[:60] {
		f.Add(s)
	}
	f.Fuzz(checkMatchers)
}
