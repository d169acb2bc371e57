// Package termsafe writes a sandbox's output to a terminal the CLI did not
// allocate for it without letting that output drive the terminal.
//
// Output read back from a sandbox (managoat logs, attach to a session that
// has no terminal) is bytes a workload chose. Written to the user's
// terminal byte for byte, its escape sequences act there: OSC 52 writes
// the clipboard, OSC 0/2 sets the window title and CSI 21 t reports it
// back as if typed, CSI 6 n and DCS requests make the terminal answer on
// its input, CSI 8 m, cursor moves and line erasing hide text, OSC 8 makes
// a link that reads as another. A Writer passes text (UTF-8, tab, newline,
// carriage return, backspace) and the SGR sequences that only colour it,
// and shows every other control character in caret notation, as cat -v
// does (ESC as ^[, BEL as ^G, DEL as ^?, a C1 control as M-^[ and the
// like), so that an OSC 52 reads "^[]52;c;...^G" and does nothing. Bytes
// that are not UTF-8 become U+FFFD (a terminal in an 8-bit mode would take
// some for C1 controls). Hidden by colour alone (the same foreground and
// background) is still possible; conceal (SGR 8) is not.
//
// For uses Writer only when the file is a terminal: a pipe or a file gets
// the bytes unchanged.
package termsafe

import (
	"io"
	"os"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// maxCSI bounds a control sequence held while it is read: one longer is
// shown as text (an SGR of a few colours is 10-30 bytes).
const maxCSI = 64

// Writer filters what it is given for a terminal (see the package doc)
// and writes it to the underlying writer; a raw Writer passes it
// unchanged. Not safe for concurrent use. Call Flush at the end: a
// sequence or character cut at the end of the last Write is held.
type Writer struct {
	w    io.Writer
	raw  bool
	held []byte // an unfinished CSI (from ESC) or UTF-8 character
	out  []byte
}

// NewWriter returns a filtering Writer on w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// NewRaw returns a Writer on w that passes the bytes unchanged.
func NewRaw(w io.Writer) *Writer { return &Writer{w: w, raw: true} }

// For returns a Writer on f that filters when f is a terminal and passes
// the bytes unchanged otherwise.
func For(f *os.File) *Writer {
	return &Writer{w: f, raw: !IsTerminal(f)}
}

// IsTerminal reports whether f is a terminal.
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// Write filters p and writes the result. It reports len(p) when the
// underlying write succeeded (the filtered bytes differ in number).
func (t *Writer) Write(p []byte) (int, error) {
	if t.raw {
		return t.w.Write(p)
	}
	t.out = t.out[:0]
	for _, b := range p {
		t.feed(b)
	}
	if len(t.out) == 0 {
		return len(p), nil
	}
	if _, err := t.w.Write(t.out); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes what is held (an unfinished sequence as text, a cut
// character as U+FFFD).
func (t *Writer) Flush() error {
	if t.raw || len(t.held) == 0 {
		return nil
	}
	t.out = t.out[:0]
	t.release()
	_, err := t.w.Write(t.out)
	return err
}

// release shows what is held as unfiltered would be dangerous: a CSI as
// caret text, UTF-8 bytes as U+FFFD each.
func (t *Writer) release() {
	h := t.held
	t.held = t.held[:0]
	if len(h) > 0 && h[0] == 0x1b {
		t.out = append(t.out, '^', '[')
		t.out = append(t.out, h[1:]...) // printable ASCII, checked in feed
		return
	}
	for range h {
		t.out = utf8.AppendRune(t.out, utf8.RuneError)
	}
}

func (t *Writer) feed(b byte) {
	if len(t.held) > 0 {
		if t.held[0] == 0x1b {
			t.feedCSI(b)
			return
		}
		t.feedRune(b)
		return
	}
	switch {
	case b == 0x1b:
		t.held = append(t.held, b)
	case b == '\t' || b == '\n' || b == '\r' || b == '\b':
		t.out = append(t.out, b)
	case b < 0x20:
		t.out = append(t.out, '^', b+0x40)
	case b == 0x7f:
		t.out = append(t.out, '^', '?')
	case b < 0x80:
		t.out = append(t.out, b)
	default:
		t.feedRune(b)
	}
}

// feedCSI continues after ESC: only ESC [ params final may pass, and only
// as an SGR that colours (safeSGR); anything else is released as text.
func (t *Writer) feedCSI(b byte) {
	if len(t.held) == 1 {
		if b != '[' {
			t.release() // "^[", then b as itself
			t.feed(b)
			return
		}
		t.held = append(t.held, b)
		return
	}
	switch {
	case b >= 0x20 && b <= 0x3f: // parameter or intermediate
		t.held = append(t.held, b)
		if len(t.held) > maxCSI {
			t.release()
		}
	case b >= 0x40 && b <= 0x7e: // final
		t.held = append(t.held, b)
		if b == 'm' && safeSGR(t.held[2:len(t.held)-1]) {
			t.out = append(t.out, t.held...)
			t.held = t.held[:0]
			return
		}
		t.release()
	default: // a control or a non-ASCII byte cuts the sequence
		t.release()
		t.feed(b)
	}
}

// feedRune continues a UTF-8 character; a complete one passes unless it
// is a C1 control (U+0080-U+009F), an invalid one becomes U+FFFD.
func (t *Writer) feedRune(b byte) {
	t.held = append(t.held, b)
	if !utf8.FullRune(t.held) {
		return
	}
	r, n := utf8.DecodeRune(t.held)
	switch {
	case r == utf8.RuneError && n <= 1:
		// Not UTF-8: the first byte is replaced, the rest read again.
		rest := append([]byte(nil), t.held[1:]...)
		t.held = t.held[:0]
		t.out = utf8.AppendRune(t.out, utf8.RuneError)
		for _, c := range rest {
			t.feed(c)
		}
		return
	case r >= 0x80 && r <= 0x9f:
		t.out = append(t.out, 'M', '-', '^', byte(r-0x80+0x40))
	default:
		t.out = append(t.out, t.held[:n]...)
	}
	rest := append([]byte(nil), t.held[n:]...)
	t.held = t.held[:0]
	for _, c := range rest {
		t.feed(c)
	}
}

// safeSGR reports whether params (of ESC [ params m) only colour and
// style text: digits, ';' and ':' only, and no conceal (8) among the
// top-level attributes (an 8 that is a colour index of 38/48/58 is one).
func safeSGR(params []byte) bool {
	var fields [][]byte
	start := 0
	for i, c := range params {
		switch {
		case c >= '0' && c <= '9' || c == ':':
		case c == ';':
			fields = append(fields, params[start:i])
			start = i + 1
		default:
			return false
		}
	}
	fields = append(fields, params[start:])
	for i := 0; i < len(fields); i++ {
		f := string(fields[i])
		switch f {
		case "8", "08":
			return false
		case "38", "48", "58":
			// 38;5;N or 38;2;R;G;B: skip the colour's own numbers.
			if i+1 < len(fields) {
				switch string(fields[i+1]) {
				case "5":
					i += 2
				case "2":
					i += 4
				}
			}
		}
	}
	return true
}
