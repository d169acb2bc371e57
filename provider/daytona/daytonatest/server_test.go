package daytonatest

import (
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestParseCommand pins the daemon's splitter: spaces split, either quote
// toggles, the other quote is literal inside, no escapes.
func TestParseCommand(t *testing.T) {
	for in, want := range map[string][]string{
		`echo hi`:            {"echo", "hi"},
		`  a   b  `:          {"a", "b"},
		`sh -c 'echo "x y"'`: {"sh", "-c", `echo "x y"`},
		`a "b 'c' d"`:        {"a", "b 'c' d"},
		`'it'\''s'`:          {`it\s`},
		`a''b`:               {"ab"},
		`x "unterminated`:    {"x", "unterminated"},
		"new\nline":          {"new\nline"},
		``:                   nil,
	} {
		if got := parseCommand(in); fmt.Sprint(got) != fmt.Sprint(want) || len(got) != len(want) {
			t.Errorf("parseCommand(%q) = %q, want %q", in, got, want)
		}
	}
}
