package main

import (
	"flag"
	"fmt"
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
