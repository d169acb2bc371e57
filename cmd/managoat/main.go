// Command managoat runs commands in sandboxes: on this machine by default
// (provider local over the jail mechanism: no account, no daemon), or on any
// registered provider (--provider sprites, e2b, daytona, runner, fake).
//
// Usage:
//
//	managoat run [limits] [--] CMD [ARGS...]     ephemeral sandbox: create, run with live output, destroy
//	managoat create NAME [limits]
//	managoat exec NAME [--env K=V] [--dir D] [--timeout D] -- CMD [ARGS...]
//	managoat spawn NAME [--detach] -- CMD [ARGS...]
//	managoat attach NAME SESSION
//	managoat sessions NAME
//	managoat terminate NAME SESSION [--force] [--grace D]
//	managoat ls [--json]
//	managoat rm NAME...
//	managoat suspend NAME | resume NAME
//	managoat policy NAME --allow a.example,b.example   (--allow "" denies all egress)
//	managoat url NAME
//	managoat cp SRC DST          (one of them NAME:/path)
//	managoat doctor
//	managoat version
//	managoat runner --url URL --token T --name N [--root DIR] [--mechanism jail|trusted]
//	managoat serve --listen 127.0.0.1:8080
//
// Limits: --memory 512M, --pids 256, --cpu 0.5 (or 500m), --timeout 30s.
// Every command takes --provider P (default local) and --mechanism M
// (jail, trusted, oci, oci:runsc; default jail).
//
// Exit codes: a command's own exit code is managoat's; 125 means managoat
// could not run it (the error names the operation and the taxonomy kind);
// 2 is a usage error; 130 after Ctrl-C detached from a session.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/managoat/managoat/sandbox"
)

// Exit codes of managoat itself.
const (
	exitCouldNotRun = 125
	exitUsage       = 2
	exitDetached    = 130
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	reexecHooks() // a supervisor or jail init started from this binary never returns
	os.Exit(run(os.Args[1:]))
}

// hooks run before anything else; provider and mechanism files append to it.
var reexec []func()

func reexecHooks() {
	for _, h := range reexec {
		h()
	}
}

type command struct {
	name  string
	usage string
	run   func(ctx context.Context, g *globals, args []string) error
}

var commands []command

func register(name, usage string, run func(ctx context.Context, g *globals, args []string) error) {
	commands = append(commands, command{name, usage, run})
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: managoat [--provider P] [--mechanism M] COMMAND [ARGS...]")
	fmt.Fprintln(os.Stderr, "commands:")
	for _, c := range commands {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", c.name, c.usage)
	}
	fmt.Fprintln(os.Stderr, "providers:", providerNames())
}

func run(args []string) int {
	g := current
	fs := g.flagSet("managoat")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			usage()
			return 0
		}
		fmt.Fprintln(os.Stderr, "managoat:", err)
		usage()
		return exitUsage
	}
	args = fs.Args()
	if len(args) == 0 {
		usage()
		return exitUsage
	}
	name := args[0]
	for _, c := range commands {
		if c.name != name {
			continue
		}
		ctx, stop := notifyContext(os.Interrupt, syscall.SIGTERM)
		defer stop()
		err := c.run(ctx, g, args[1:])
		return report(name, err)
	}
	if name == "help" || name == "-h" || name == "--help" {
		usage()
		return 0
	}
	fmt.Fprintf(os.Stderr, "managoat: unknown command %q\n", name)
	usage()
	return exitUsage
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
		select {
		case <-ch:
			cancel()
			<-stopped
		case <-stopped:
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

// usageError is a malformed invocation, reported before anything is done.
type usageError struct{ msg string }

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
	kind := sandbox.Kind(err)
	fmt.Fprintf(os.Stderr, "managoat %s: %s (%s)\n", cmd, err, kind)
	return exitCouldNotRun
}
