package termsafe

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// filtered is what a Writer writes for the pieces given one Write each.
func filtered(t *testing.T, pieces ...string) string {
	t.Helper()
	var b bytes.Buffer
	w := NewWriter(&b)
	for _, p := range pieces {
		n, err := w.Write([]byte(p))
		if err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// The attacks of issue 41 item 5, each as a workload would print it: none
// reaches the terminal as a sequence (no ESC, BEL or C1 byte comes out),
// each is shown as text.
func TestDangerousSequencesAreShownNotSent(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"OSC 52 clipboard write (BEL)", "a\x1b]52;c;cm0gLXJmIH4K\x07b", "a^[]52;c;cm0gLXJmIH4K^Gb"},
		{"OSC 52 clipboard write (ST)", "\x1b]52;c;eA==\x1b\\", "^[]52;c;eA==^[\\"},
		{"window title set", "\x1b]0;pwned\x07", "^[]0;pwned^G"},
		{"title report", "\x1b[21t", "^[[21t"},
		{"status report", "\x1b[6n", "^[[6n"},
		{"DECRQSS", "\x1bP$qm\x1b\\", "^[P$qm^[\\"},
		{"hyperlink", "\x1b]8;;http://evil/\x1b\\ok\x1b]8;;\x1b\\", "^[]8;;http://evil/^[\\ok^[]8;;^[\\"},
		{"conceal", "\x1b[8msecret\x1b[0m", "^[[8msecret\x1b[0m"},
		{"cursor up and erase", "line\x1b[1A\x1b[2K", "line^[[1A^[[2K"},
		{"alternate screen", "\x1b[?1049h", "^[[?1049h"},
		{"reset", "\x1bc", "^[c"},
		{"C1 CSI as UTF-8", "\u009b6n", "M-^[6n"},
		{"C1 OSC as UTF-8", "\u009d52;c;eA==\u009c", "M-^]52;c;eA==M-^\\"},
		{"raw 8-bit CSI", "\x9b6n", "\uFFFD6n"},
		{"other C0", "a\x00b\x0ec\x7f", "a^@b^Nc^?"},
	} {
		got := filtered(t, c.in)
		if got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
		if strings.ContainsAny(strings.ReplaceAll(got, "\x1b[0m", ""), "\x1b\x07\u009b\u009d") {
			t.Errorf("%s: a control reached the terminal: %q", c.name, got)
		}
	}
}

// Text, colours and the controls a log needs pass unchanged, also when a
// sequence or a character is cut between writes.
func TestTextAndColoursPass(t *testing.T) {
	for _, c := range []struct {
		name   string
		pieces []string
		want   string
	}{
		{"text", []string{"héllo, 世界 ✓\tx\r\n\b"}, "héllo, 世界 ✓\tx\r\n\b"},
		{"colours", []string{"\x1b[1;31mred\x1b[0m \x1b[38;5;8mgrey\x1b[m \x1b[38;2;8;8;8mrgb\x1b[39m"}, "\x1b[1;31mred\x1b[0m \x1b[38;5;8mgrey\x1b[m \x1b[38;2;8;8;8mrgb\x1b[39m"},
		{"colour cut", []string{"\x1b", "[3", "2mgreen"}, "\x1b[32mgreen"},
		{"character cut", []string{"\xe4\xb8", "\x96"}, "世"},
		{"OSC cut", []string{"\x1b", "]52;c;", "eA==\x07"}, "^[]52;c;eA==^G"},
		{"held at the end", []string{"x\x1b[31"}, "x^[[31"},
		{"cut character at the end", []string{"x\xe4\xb8"}, "x\uFFFD\uFFFD"},
		{"valid U+FFFD", []string{"\uFFFD"}, "\uFFFD"},
		{"CSI cut by a newline", []string{"\x1b[3\n"}, "^[[3\n"},
	} {
		if got := filtered(t, c.pieces...); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// A sequence that never ends holds at most maxCSI bytes.
func TestLongSequenceIsBounded(t *testing.T) {
	var b bytes.Buffer
	w := NewWriter(&b)
	long := "\x1b[" + strings.Repeat("1;", 1<<16)
	if _, err := w.Write([]byte(long)); err != nil {
		t.Fatal(err)
	}
	if len(w.held) > maxCSI+1 {
		t.Fatalf("holds %d bytes", len(w.held))
	}
	if !strings.HasPrefix(b.String(), "^[[1;1;") || strings.Contains(b.String(), "\x1b") {
		t.Fatalf("%.40q", b.String())
	}
}

// For passes the bytes unchanged to what is not a terminal.
func TestForAPipeIsRaw(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	tw := For(w)
	in := "\x1b]52;c;eA==\x07\u009b"
	if _, err := tw.Write([]byte(in)); err != nil {
		t.Fatal(err)
	}
	tw.Flush()
	w.Close()
	got := make([]byte, 64)
	n, _ := r.Read(got)
	if string(got[:n]) != in {
		t.Fatalf("a pipe got %q, want %q", got[:n], in)
	}
}
