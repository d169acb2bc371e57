package main

import (
	"flag"
	"os"
	"strings"
	"testing"
)

// ownFlags builds c's FlagSet as run does, without running c.
func ownFlags(c command) *flag.FlagSet {
	g := &globals{}
	fs := g.flagSet(c.name)
	c.setup(g, fs)
	return fs
}

// TestEveryCommandHelps walks the registry: for each command, -h, --help
// and `help NAME` print the same help to stdout and exit 0: its one-line
// summary first, its usage line, and every flag its FlagSet defines (the
// global ones too). An unknown flag prints the error, then one line
// pointing at that help, to stderr, and exits 2. None of it opens a provider: the state directory
// stays empty.
func TestEveryCommandHelps(t *testing.T) {
	if len(commands) < 10 {
		t.Fatalf("only %d commands registered", len(commands))
	}
	home := t.TempDir()
	env := []string{"MANAGOAT_HOME=" + home}
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			out, errOut, code := runBinary(t, nil, env, c.name, "--help")
			if code != 0 || errOut != "" {
				t.Fatalf("--help: exit %d stderr %q", code, errOut)
			}
			if !strings.HasPrefix(out, c.summary+"\n") {
				t.Errorf("--help does not start with the summary %q:\n%s", c.summary, out)
			}
			if !strings.Contains(out, "\nUsage: managoat "+c.name) {
				t.Errorf("--help has no usage line:\n%s", out)
			}
			ownFlags(c).VisitAll(func(f *flag.Flag) {
				dash := "--"
				if len(f.Name) == 1 {
					dash = "-" // a one-letter flag as -o, like kubectl's
				}
				if !strings.Contains(out, "\n  "+dash+f.Name+" ") {
					t.Errorf("--help does not list %s%s:\n%s", dash, f.Name, out)
				}
			})
			for _, args := range [][]string{{c.name, "-h"}, {"help", c.name}, {"--provider", "fake", c.name, "--help"}} {
				o, e, code := runBinary(t, nil, env, args...)
				if code != 0 || e != "" || o != out {
					t.Errorf("%v: exit %d stderr %q, and stdout differs from --help's:\n%s", args, code, e, o)
				}
			}
			o, e, code := runBinary(t, nil, env, c.name, "--no-such-flag")
			if code != exitUsage || o != "" {
				t.Errorf("--no-such-flag: exit %d stdout %q, want %d and none", code, o, exitUsage)
			}
			first, rest, _ := strings.Cut(e, "\n")
			if !strings.HasPrefix(first, "managoat "+c.name+": ") || !strings.Contains(first, "no-such-flag") || rest != "Run 'managoat "+c.name+" --help' for usage.\n" {
				t.Errorf("--no-such-flag: stderr is not the error then one line pointing at --help:\n%s", e)
			}
		})
	}
	if ents, err := os.ReadDir(home); err != nil || len(ents) != 0 {
		t.Errorf("help did work: the state directory holds %v (%v)", ents, err)
	}
}

// -h is seen wherever flag parsing reaches: after a command's positionals
// and among its other flags.
func TestHelpAmongArguments(t *testing.T) {
	for _, args := range [][]string{
		{"exec", "box", "--help"},
		{"exec", "--dir", "/", "box", "-h", "--", "true"},
		{"attach", "--no-stdin", "box", "s1", "--help"},
		{"rm", "a", "b", "-h"},
		{"--provider", "fake", "run", "--memory", "1G", "--help", "--", "emit"},
		{"policy", "box", "--allow", "", "-help"},
	} {
		c, _ := lookup(args[0])
		if args[0] == "--provider" {
			c, _ = lookup(args[2])
		}
		out, errOut, code := managoat(t, "", args...)
		if code != 0 || errOut != "" || !strings.HasPrefix(out, c.summary+"\n") {
			t.Errorf("%v: exit %d stdout %q stderr %q", args, code, out, errOut)
		}
	}
}

// A -h or --help after "--", or after the command to run, is that
// command's, not managoat's.
func TestHelpOfTheCommandIsNotIntercepted(t *testing.T) {
	for _, args := range [][]string{
		// The fake refuses an instruction it does not know, by name.
		{"--provider", "fake", "run", "--", "emit", "out:x", "--help"},
		{"--provider", "fake", "run", "emit", "-h"},
		// No sandbox nope: exec got as far as looking for it.
		{"--provider", "fake", "exec", "nope", "--", "emit", "--help"},
		{"--provider", "fake", "exec", "nope", "emit", "-h"},
		{"--provider", "fake", "spawn", "nope", "--", "emit", "--help"},
	} {
		out, errOut, code := managoat(t, "", args...)
		if code != exitCouldNotRun || strings.Contains(out+errOut, "Usage:") {
			t.Errorf("%v: exit %d stdout %q stderr %q, want %d and no usage", args, code, out, errOut, exitCouldNotRun)
		}
	}
	out, errOut, code := managoat(t, "", "--mechanism", "trusted", "run", "--", "sh", "-c", `echo "$@"`, "sh", "--help")
	if code != 0 || out != "--help\n" {
		t.Errorf("run -- sh -c 'echo \"$@\"' sh --help: exit %d stdout %q stderr %q", code, out, errOut)
	}
}

// A bad flag value is a usage error followed by one line pointing at the
// command's --help (not 30 lines of help, as git and kubectl); a value the
// help does not describe (a sandbox name) is one line.
func TestUsageErrorsPointAtHelp(t *testing.T) {
	for _, args := range [][]string{
		{"--provider", "fake", "exec", "box", "--timeout", "soon", "--", "emit"},
		{"--provider", "fake", "run", "--memory", "lots", "--", "emit"},
		{"--provider", "fake", "spawn", "--detach=maybe", "box", "--", "emit"},
		{"--provider", "fake", "run"},
		{"--provider", "fake", "attach", "box"},
		{"--provider", "fake", "policy", "box", "--deny", "example.com"},
	} {
		name := args[2]
		out, errOut, code := managoat(t, "", args...)
		if code != exitUsage || out != "" || !strings.HasPrefix(errOut, "managoat "+name+": ") || strings.Count(errOut, "\n") != 2 ||
			!strings.HasSuffix(errOut, "\nRun 'managoat "+name+" --help' for usage.\n") {
			t.Errorf("%v: exit %d stdout %q stderr %q, want the error and one line pointing at --help", args, code, out, errOut)
		}
	}
	_, errOut, code := managoat(t, "", "--provider", "fake", "rm", "a/b")
	if code != exitUsage || strings.Count(errOut, "\n") != 1 {
		t.Errorf("rm a/b: exit %d stderr %q, want %d and one line", code, errOut, exitUsage)
	}
}
