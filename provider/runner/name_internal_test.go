package runner

import (
	"regexp"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/corpus"
)

// runnerNameRe is the pattern validRunnerName hand-implements (spec §3.9).
var runnerNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

func runnerNameCorpus() []string {
	c := []string{"", "a", "0", ".", "_", "-", "a.", "a-", "a_", "-a", ".a", "_a", "A", "aB", "a b", "a\n",
		"\na", "é", "a\xff", "a\x00", strings.Repeat("x", 62), strings.Repeat("x", 63), strings.Repeat("x", 64),
		"laptop-1.home_lan", "z", "9", "{", "`", "/", ":"}
	return corpus.Strings(3, 4, c, "az09._-", "AZ :\n\x00\xffé/+{`", 5, 67, 2000)
}

func TestValidRunnerNameMatchesRegexp(t *testing.T) {
	for _, s := range runnerNameCorpus() {
		if got, want := validRunnerName(s), runnerNameRe.MatchString(s); got != want {
			t.Fatalf("validRunnerName(%q) = %v, regexp says %v", s, got, want)
		}
	}
}

func FuzzValidRunnerName(f *testing.F) {
	for _, s := range runnerNameCorpus()[:40] {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validRunnerName(s), runnerNameRe.MatchString(s); got != want {
			t.Fatalf("validRunnerName(%q) = %v, regexp says %v", s, got, want)
		}
	})
}
