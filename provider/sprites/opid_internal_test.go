package sprites

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

// operationIDRe is the pattern validOperationID hand-implements (spec §6.1.12).
var operationIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)

func opIDCorpus() []string {
	c := []string{"", "a", "A", "0", "_", "-", "a-b_C9", "a b", "a\n", "\na", "a.b", "é", "a\x00",
		"a\xff", strings.Repeat("x", 127), strings.Repeat("x", 128), strings.Repeat("x", 129),
		strings.Repeat("é", 64), "sandbox-operation:1", "/", "+", "=", "`", "@", "[", "{", "Z", "z", "9"}
	r := rand.New(rand.NewPCG(1, 2))
	const alpha = "aZ09_-. :\n\x00\xffé/+=`@[{"
	for range 2000 {
		n := r.IntN(132)
		if r.IntN(2) == 0 {
			n = r.IntN(6)
		}
		var b strings.Builder
		for range n {
			if r.IntN(8) == 0 {
				b.WriteByte(alpha[r.IntN(len(alpha))])
			} else {
				b.WriteByte("azAZ09_-"[r.IntN(8)])
			}
		}
		c = append(c, b.String())
	}
	return c
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
