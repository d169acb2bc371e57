package daytona

import (
	"bytes"
	"fmt"
	"testing"
)

func seg(ch int, s string) segment { return segment{ch, []byte(s)} }

func TestDemux(t *testing.T) {
	for _, tc := range []struct {
		name  string
		in    string
		final bool
		want  []segment
	}{
		{name: "empty", in: ""},
		{name: "no marker is stdout", in: "hello", want: []segment{seg(chOut, "hello")}},
		{name: "markers", in: "\x01\x01\x01out\x02\x02\x02err\x01\x01\x01more",
			want: []segment{seg(chOut, "out"), seg(chErr, "err"), seg(chOut, "more")}},
		{name: "lone marker bytes are data", in: "a\x01b\x02\x02c", want: []segment{seg(chOut, "a\x01b\x02\x02c")}},
		{name: "mixed run is data", in: "\x01\x01\x02x", want: []segment{seg(chOut, "\x01\x01\x02x")}},
		{name: "trailing 01 held", in: "ab\x01", want: []segment{seg(chOut, "ab")}},
		{name: "trailing 02 02 held", in: "ab\x02\x02", want: []segment{seg(chOut, "ab")}},
		{name: "trailing partial flushed when final", in: "ab\x02\x02", final: true, want: []segment{seg(chOut, "ab\x02\x02")}},
		{name: "full trailing marker switches", in: "ab\x02\x02\x02", want: []segment{seg(chOut, "ab")}},
		{name: "four 01 is marker then held 01", in: "\x01\x01\x01\x01", want: nil},
		{name: "stderr first", in: "\x02\x02\x02e", want: []segment{seg(chErr, "e")}},
	} {
		got := demux([]byte(tc.in), tc.final)
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: demux(%q) = %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestCursorPolls replays a journal through sequences of polls — growing
// prefixes, prefixes that split a marker or a multi-byte character, reads
// that come back shorter (truncated) — and checks that the concatenation
// of what was delivered is exactly the final demultiplexed journal: no byte
// twice, none skipped, per stream.
func TestCursorPolls(t *testing.T) {
	journal := []byte("\x01\x01\x01h\xc3\xa9llo \xe2\x82\xac\x02\x02\x02warn\xf0\x9f\x98\x80\x01\x01\x01!\x01x\x02\x02\x02\xff\xfeend")
	final := demux(journal, true)
	var want [2][]byte
	for _, s := range final {
		want[s.ch] = append(want[s.ch], s.data...)
	}
	cuts := map[string][]int{
		"one poll":          {len(journal)},
		"byte by byte":      seq(1, len(journal)),
		"split é":           {5, 6, len(journal)},
		"split €":           {12, 13, 14, len(journal)},
		"split marker":      {16, 17, 18, 19, len(journal)},
		"split 😀":           {24, 26, len(journal)},
		"truncated reads":   {20, 10, 3, 30, 0, len(journal)},
		"repeat same":       {9, 9, 9, len(journal), len(journal)},
		"shrink then whole": {len(journal) - 1, 4, len(journal)},
	}
	for name, cs := range cuts {
		var c cursor
		var got [2][]byte
		for i, n := range cs {
			isFinal := i == len(cs)-1
			for _, s := range c.advance(demux(journal[:n], isFinal)) {
				got[s.ch] = append(got[s.ch], s.data...)
			}
		}
		for ch := range 2 {
			if !bytes.Equal(got[ch], want[ch]) {
				t.Errorf("%s: stream %d delivered %q, want %q", name, ch, got[ch], want[ch])
			}
		}
	}
}

func seq(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestCursorAdvanceArithmetic(t *testing.T) {
	var c cursor
	steps := []struct {
		segs []segment
		want string
	}{
		{[]segment{seg(chOut, "one")}, "[{0 one}]"},
		{[]segment{seg(chOut, "one"), seg(chOut, "two"), seg(chErr, "err")}, "[{0 two} {1 err}]"},
		{[]segment{seg(chOut, "onetwo"), seg(chErr, "err"), seg(chOut, "!")}, "[{0 !}]"},
		{[]segment{seg(chOut, "on")}, "[]"}, // a shorter read delivers nothing
		{[]segment{seg(chOut, "onetwo!"), seg(chErr, "err+")}, "[{1 +}]"},
	}
	for i, st := range steps {
		got := c.advance(st.segs)
		s := "["
		for j, g := range got {
			if j > 0 {
				s += " "
			}
			s += fmt.Sprintf("{%d %s}", g.ch, g.data)
		}
		s += "]"
		if s != st.want {
			t.Errorf("step %d: advance = %s, want %s", i, s, st.want)
		}
	}
	if c.delivered != [2]int{7, 4} {
		t.Errorf("delivered = %v", c.delivered)
	}
}

func TestLegacySegmentsHoldBackReplacement(t *testing.T) {
	var c cursor
	var out []byte
	// The poll split "é": JSON shows U+FFFD, the next poll the real char.
	for i, p := range []struct {
		s     string
		final bool
	}{{"h\uFFFD", false}, {"hé", false}, {"hé\uFFFD", true}} {
		for _, s := range c.advance(legacySegments(p.s, "", p.final)) {
			out = append(out, s.data...)
		}
		_ = i
	}
	if string(out) != "hé\uFFFD" {
		t.Fatalf("delivered %q", out)
	}
}
