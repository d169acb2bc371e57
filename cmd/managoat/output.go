package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// outputFlags are --json and -o FORMAT (json, or with wide, wide), as
// kubectl's -o: every command that prints data takes them, and its JSON
// keys are snake_case, as the wire protocol's.
type outputFlags struct {
	asJSON bool
	format string
	wide   bool // wide is a format here
}

func (o *outputFlags) add(fs *flag.FlagSet, wide bool) {
	o.wide = wide
	fs.BoolVar(&o.asJSON, "json", false, "print JSON (snake_case keys), the same as -o json")
	formats := "json"
	if wide {
		formats = "json, or wide for more columns"
	}
	fs.StringVar(&o.format, "o", "", "output `FORMAT`: "+formats)
}

func (o *outputFlags) check() error {
	switch o.format {
	case "", "json":
		return nil
	case "wide":
		if o.wide {
			return nil
		}
	}
	want := "json"
	if o.wide {
		want = "json or wide"
	}
	return usageError{msg: fmt.Sprintf("-o %q: the output formats are %s", o.format, want)}
}

func (o *outputFlags) json() bool { return o.asJSON || o.format == "json" }

func (o *outputFlags) isWide() bool { return o.format == "wide" }

// snakeJSON encodes v as JSON with every object key in snake_case, for
// values whose types (another package's) carry Go-style or camelCase keys.
func snakeJSON(w io.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var x any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&x); err != nil {
		return err
	}
	return json.NewEncoder(w).Encode(snakeKeys(x))
}

func snakeKeys(x any) any {
	switch v := x.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[snake(k)] = snakeKeys(e)
		}
		return m
	case []any:
		for i := range v {
			v[i] = snakeKeys(v[i])
		}
	}
	return x
}

// snake is s in snake_case: cgroupMode is cgroup_mode, OK is ok, HTTPCode
// is http_code.
func snake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			prevLower := i > 0 && (unicode.IsLower(r[i-1]) || unicode.IsDigit(r[i-1]))
			nextLower := i > 0 && i+1 < len(r) && unicode.IsUpper(r[i-1]) && unicode.IsLower(r[i+1])
			if prevLower || nextLower {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(c))
			continue
		}
		if c == '-' || c == ' ' {
			c = '_'
		}
		b.WriteRune(c)
	}
	return b.String()
}

// maxCell bounds a table cell, in runes: a command of a megabyte is one
// line of the sessions table, not a megabyte of it (-o json has it whole).
const maxCell = 120

// cell is s as one cell of a table: what would break the row or reach the
// terminal as a control (a newline or tab of a multi-line command, an
// escape sequence a sandbox wrote into a name or state, invalid UTF-8) is
// shown escaped as Go does (\n, \t, \x1b), and a cell past maxCell runes
// ends in "…".
func cell(s string) string {
	var b strings.Builder
	n := 0
	for i, w := 0, 0; i < len(s); i += w {
		r, size := utf8.DecodeRuneInString(s[i:])
		w = size
		if n >= maxCell {
			b.WriteString("…")
			break
		}
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, "\\x%02x", s[i])
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029' || !unicode.IsPrint(r) && r != ' ':
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
		n++
	}
	return b.String()
}
