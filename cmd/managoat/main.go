// Command managoat runs commands in sandboxes: on this machine by default
// (provider local over the jail mechanism: no account, no daemon), or on any
// registered provider (--provider sprites, e2b, daytona, runner, fake).
//
// Usage:
//
//	managoat run [limits] [-it] [-e K=V] [-w DIR] [-v HOST:SANDBOX[:ro]] [--] CMD [ARGS...]   ephemeral sandbox: create, run with live output, destroy
//	managoat create NAME [limits] [-e K=V] [--env-file F] [-w DIR] [--label K=V] [-v HOST:SANDBOX[:ro]] [--trust-host-ca]
//	managoat exec NAME [-it] [-e K=V] [-w DIR] [--timeout D] -- CMD [ARGS...]
//	managoat spawn NAME [--detach] [-t] -- CMD [ARGS...]
//	managoat attach NAME SESSION [--detach-keys ctrl-p,ctrl-q]
//	managoat sessions NAME ; managoat logs NAME [SESSION] [-f] [--tail N] [--since T]
//	managoat terminate NAME SESSION [--force] [--grace D]
//	managoat ls [-o json|wide] [-q] [--filter label=K=V]
//	managoat rm [-f] NAME...
//	managoat suspend NAME | resume NAME
//	managoat policy NAME --allow a.example,b.example   (--allow "" denies all egress)
//	managoat url NAME
//	managoat cp SRC DST          (one of them NAME:PATH; - is a tar stream)
//	managoat checkpoint create|ls|restore NAME [ID]
//	managoat doctor ; managoat version ; managoat completion bash|zsh|fish
//	managoat runner --url URL --token-file F --name N [--root DIR] [--mechanism jail|trusted]
//	managoat serve --listen 127.0.0.1:8080
//	managoat mcp [--idle D]      MCP server over stdio for a coding agent (its sandboxes go with its session; serve has /mcp)
//
// Limits: --memory 512M, --pids 256, --cpu 0.5 (or 500m), --timeout 30s.
// Every command takes --provider P (default local) and --mechanism M
// (jail, trusted, oci, oci:runsc; default jail).
//
// `managoat help COMMAND`, or -h/--help anywhere among a command's flags,
// prints what the command does, its synopsis and its flags with their
// defaults, to stdout; a -h after "--", or after the command to run, is
// that command's. A malformed invocation prints the error and one line
// pointing at the help (Run 'managoat COMMAND --help' for usage.) to
// stderr, as git and kubectl do, not the help itself.
//
// Flags are the standard library's flag package, one FlagSet per command,
// with the help printed here from each FlagSet, and completion scripts
// (completion bash|zsh|fish) generated from the same registry. cobra
// (v1.10.2) was measured and costs start-up: a program with a tree of
// managoat's size (23 commands, 8 flags each) that prints its version
// took 6.2 ms a start with cobra against 3.5 ms with the flag package
// (1.78x, medians of 300 alternating starts in one benchmark run on the
// project's 2-core VM under load), so about 2.7 ms more on each `run`,
// whose whole start-up is about 38 ms.
//
// Exit codes, as docker's: a command's own exit code is managoat's; 125
// means managoat itself failed; 126 the command cannot be invoked (not
// executable), 127 it was not found (the library keeps both the error
// Invalid{could_not_run}: the codes are only the CLI's rendering); 124 a
// --timeout ended it; a command the memory limit killed ends 137, with a
// line "managoat: out of memory" on its stderr; 2 is a usage error; 130
// after Ctrl-C detached from a session. Each error is one line: what
// failed, the taxonomy kind and reason in parentheses, and what to do next
// (errors.go's hint: the thing that helps for that error). A fallback a
// user would not guess (MANAGOAT_URL without MANAGOAT_API_KEY, enroll's
// default account, a sandbox on trusted) is said once on stderr, as a
// line "managoat: note: ...".
//
// MANAGOAT_PROVIDER names the default provider, over the configuration
// file's (provider = NAME, mechanism = NAME in $MANAGOAT_CONFIG, else
// ~/.config/managoat/config); --provider and --mechanism still win.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
)

// Exit codes of managoat itself.
const (
	exitCouldNotRun = 125
	exitUsage       = 2
	exitDetached    = 130
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// main needs no re-exec hook: a jail init or a sandbox supervisor
// started from this binary takes its role in the init function of its
// package (mechanism/jail, provider/local), before main runs.
func main() {
	os.Exit(run(os.Args[1:]))
}

// A command is one of managoat's subcommands.
type command struct {
	name     string
	synopsis string // what follows "managoat NAME" in its usage line
	summary  string // what it does, in one line
	// setup defines the command's flags on fs and returns what runs it.
	// It does nothing else, so help can list the flags of a command it
	// does not run; the returned action parses args with fs (parse,
	// parseN) before it does anything.
	setup func(g *globals, fs *flag.FlagSet) action
}

// An action runs a command on its arguments (those after its name).
type action func(ctx context.Context, args []string) error

var commands []command

func register(name, synopsis, summary string, setup func(g *globals, fs *flag.FlagSet) action) {
	commands = append(commands, command{name, synopsis, summary, setup})
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

// usage writes managoat's own help: its synopsis, its commands and the
// global flags.
func usage(w io.Writer) {
	fmt.Fprintln(w, "managoat runs commands in sandboxes, on this machine or on a provider.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: managoat [global flags] COMMAND [flags] [ARGS...]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, c := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Global flags (before or after COMMAND):")
	printFlags(w, allFlags(globalHelpFlags()), true)
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'managoat help COMMAND' or 'managoat COMMAND --help' for a command's flags.")
}

// help writes c's help: what it does, its synopsis, its own flags (those
// setup defined on fs) and the global ones.
func (c command) help(w io.Writer, fs *flag.FlagSet) {
	fmt.Fprintln(w, c.summary)
	fmt.Fprintln(w)
	fmt.Fprintln(w, strings.TrimRight("Usage: managoat "+c.name+" "+c.synopsis, " "))
	global := globalHelpFlags()
	var own []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) {
		if global.Lookup(f.Name) == nil {
			own = append(own, f)
		}
	})
	if len(own) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Flags:")
		printFlags(w, own, false)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Global flags:")
	printFlags(w, allFlags(global), true)
}

// allFlags is fs's flags, sorted by name.
func allFlags(fs *flag.FlagSet) []*flag.Flag {
	var fl []*flag.Flag
	fs.VisitAll(func(f *flag.Flag) { fl = append(fl, f) })
	return fl
}

// printFlags writes flags one a line with their defaults; withHelp adds
// -h, --help.
func printFlags(w io.Writer, flags []*flag.Flag, withHelp bool) {
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	for _, f := range flags {
		typ, text := flag.UnquoteUsage(f)
		name := "--" + f.Name
		if len(f.Name) == 1 {
			name = "-" + f.Name
		}
		if typ != "" {
			name += " " + typ
		}
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			if typ == "string" {
				text += fmt.Sprintf(" (default %q)", f.DefValue)
			} else {
				text += " (default " + f.DefValue + ")"
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\n", name, text)
	}
	if withHelp {
		fmt.Fprintf(tw, "  %s\t%s\n", "-h, --help", "print this help")
	}
	tw.Flush()
}

// globalHelpFlags are the global flags as help shows them: with their
// defaults (not the values this invocation gave them), and with the
// providers this binary has.
func globalHelpFlags() *flag.FlagSet {
	g := &globals{provider: defaultProvider, mechanism: defaultMechanism}
	fs := g.flagSet("managoat")
	fs.Lookup("provider").Usage += ": " + strings.Join(providerNames(), ", ")
	return fs
}

func run(args []string) int {
	g := current
	defaultsFromEnv(g)
	fs := g.flagSet("managoat")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage(os.Stdout)
			return 0
		}
		fmt.Fprintln(os.Stderr, "managoat:", err)
		fmt.Fprintln(os.Stderr, helpPointer(""))
		return exitUsage
	}
	args = fs.Args()
	if len(args) == 0 {
		usage(os.Stderr)
		return exitUsage
	}
	name := args[0]
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(os.Stderr, "managoat: unknown command %q\n", name)
		fmt.Fprintln(os.Stderr, helpPointer(""))
		return exitUsage
	}
	cfs := g.flagSet(name)
	act := c.setup(g, cfs)
	ctx, stop := notifyContext(os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	err := act(ctx, args[1:])
	closeProviders()
	if errors.Is(err, flag.ErrHelp) {
		c.help(os.Stdout, cfs)
		return 0
	}
	code := report(name, err)
	var ue usageError
	if errors.As(err, &ue) && !ue.bare {
		fmt.Fprintln(os.Stderr, helpPointer(name))
	}
	return code
}

// helpPointer is the one line a usage error ends with, as git's and
// kubectl's do: where the help is, not the help itself.
func helpPointer(cmd string) string {
	if cmd == "" {
		return "Run 'managoat --help' for usage."
	}
	return "Run 'managoat " + cmd + " --help' for usage."
}

// notifyContext is signal.NotifyContext, with the handlers installed by a
// goroutine while the command begins: the runtime's first signal.Notify
// starts a thread and waits for it (about 0.2 ms), on the path of every
// command. A signal in between has its default effect, as one before
// main has; openProvider waits for the handlers (signalsReady) before it
// returns, so they are in place before the command acts on its sandbox
// (opening the local provider may already finish what an interrupted
// command left, which a later one finishes again if need be). As with
// NotifyContext, the signals stay caught until stop.
func notifyContext(sig ...os.Signal) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	ready := make(chan struct{})
	signalsReady = ready
	go func() {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, sig...)
		close(ready)
		defer signal.Stop(ch)
		for {
			select {
			case s := <-ch:
				// A command's signal proxy (interactive.go) takes it
				// first; untaken, it cancels the command.
				if h := signalHook.Load(); h != nil && (*h)(s) {
					continue
				}
				cancel()
				<-stopped
			case <-stopped:
			}
			return
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			cancel()
			close(stopped)
		})
	}
}

// signalsReady is closed once notifyContext's handlers are installed (nil
// when nothing installs them, as in tests that call commands directly).
var signalsReady chan struct{}

// exitError carries a command's own exit code, or a detach.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit %d", e.code) }

// usageError is a malformed invocation, reported before anything is done,
// with a line pointing at the command's --help after it unless bare (a
// value the help does not describe, such as a sandbox name breaking the
// naming rules).
type usageError struct {
	msg  string
	bare bool
}

func (e usageError) Error() string { return e.msg }

// opError names the failing operation.
type opError struct {
	op  string
	err error
}

func (e *opError) Error() string { return e.op + ": " + e.err.Error() }
func (e *opError) Unwrap() error { return e.err }

func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	return &opError{op, err}
}

func report(cmd string, err error) int {
	var ex exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ex):
		return ex.code
	case errors.As(err, &ue):
		fmt.Fprintf(os.Stderr, "managoat %s: %s\n", cmd, ue.msg)
		return exitUsage
	}
	// One line per error (rm of several sandboxes may fail on several).
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		code := 0
		for _, e := range j.Unwrap() {
			if c := report(cmd, e); code == 0 {
				code = c
			}
		}
		return code
	}
	fmt.Fprintln(os.Stderr, errorLine(cmd, err))
	return exitCode(err)
}
