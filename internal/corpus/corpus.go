// Package corpus makes the deterministic string corpora the tests use to
// check a hand-written matcher against the regular expression it
// replaces (and to seed the matching fuzz tests).
package corpus

import (
	"math/rand/v2"
	"strings"
)

// Strings returns fixed followed by n strings from a generator seeded with
// seed1 and seed2: half of them shorter than short bytes, the rest shorter
// than long; one byte in eight is drawn from rare, the others from common.
// The same arguments give the same corpus.
func Strings(seed1, seed2 uint64, fixed []string, common, rare string, short, long, n int) []string {
	c := append([]string(nil), fixed...)
	r := rand.New(rand.NewPCG(seed1, seed2))
	for range n {
		size := r.IntN(long)
		if r.IntN(2) == 0 {
			size = r.IntN(short)
		}
		var b strings.Builder
		for range size {
			if r.IntN(8) == 0 {
				b.WriteByte(rare[r.IntN(len(rare))])
			} else {
				b.WriteByte(common[r.IntN(len(common))])
			}
		}
		c = append(c, b.String())
	}
	return c
}
