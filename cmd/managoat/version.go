package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/debug"
)

// buildVersion is managoat's version: the -ldflags one when set, else the
// module's version and the VCS revision the build info holds.
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if v == "dev" && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	var rev, at string
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			at = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	out := v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		out += " (revision " + rev
		if modified {
			out += ", modified"
		}
		if at != "" {
			out += ", " + at
		}
		out += ")"
	}
	return out + " " + bi.GoVersion
}

func cmdVersion(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if err := of.check(); err != nil {
			return err
		}
		if of.json() {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"version": buildVersion()})
		}
		fmt.Println("managoat", buildVersion())
		return nil
	}
}
