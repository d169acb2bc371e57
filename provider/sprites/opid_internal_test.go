package sprites

import (
	"regexp"
	"strings"
	"testing"

	"github.com/managoat/managoat/internal/corpus"
)

// operationIDRe is the pattern validOperationID hand-implements (spec §6.1.12).
var operationIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func opIDCorpus() []string {
	c := []string{"", "a", "A", "0", "_", "-", "a-b_C9", "a b", "a\n", "\na", "a.b", "é", "a\x00",
		"a\xff", strings.Repeat("x", 127), strings.Repeat("x", 128), strings.Repeat("x", 129),
		strings.Repeat("é", 64), "sandbox-operation:1", "/", "+", "=", "`", "@", "[", "{", "Z", "z", "9"}
	return corpus.Strings(1, 2, c, "azAZ09_-", "aZ09_-. :\n\x00\xffé/+=`@[{", 6, 132, 2000)
}

func TestValidOperationIDMatchesRegexp(t *testing.T) {
	for _, s := range opIDCorpus() {
		if got, want := validOperationID(s), operationIDRe.MatchString(s); got != want {
			t.Fatalf("validOperationID(%q) = %v, regexp says %v", s, got, want)
		}
	}
}

func FuzzValidOperationID(f *testing.F) {
	for _, s := range opIDCorpus()[:40] {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validOperationID(s), operationIDRe.MatchString(s); got != want {
			t.Fatalf("validOperationID(%q) = %v, regexp says %v", s, got, want)
		}
	})
}
