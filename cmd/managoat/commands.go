package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/managoat/managoat/provider/local/journal"
	"github.com/managoat/managoat/sandbox"
)

func init() {
	register("run", "[flags] [--] CMD [ARGS...]", "Run a command in a new sandbox with live output, then destroy the sandbox", cmdRun)
	register("create", "[flags] NAME", "Create a sandbox (or adopt the one of that name) that lasts until rm, and print its name", cmdCreate)
	register("exec", "[flags] NAME [--] CMD [ARGS...]", "Run a command in a sandbox; Ctrl-C goes to it, --timeout kills it, Ctrl-P Ctrl-Q detaches", cmdExec)
	register("spawn", "[flags] NAME [--] CMD [ARGS...]", "Start a command in a session that outlives managoat; Ctrl-P Ctrl-Q detaches", cmdSpawn)
	register("attach", "[flags] NAME SESSION", "Replay a session's output from byte zero, then follow it; Ctrl-P Ctrl-Q detaches", cmdAttach)
	register("sessions", "[flags] NAME", "List a sandbox's sessions", cmdSessions)
	register("terminate", "[flags] NAME SESSION", "End a session: SIGTERM, then SIGKILL when the grace period ends", cmdTerminate)
	register("ls", "[flags]", "List the provider's sandboxes", cmdLs)
	register("rm", "[flags] NAME...", "Destroy sandboxes", cmdRm)
	register("suspend", "[flags] NAME", "Park a sandbox, keeping its disk", cmdSuspend)
	register("resume", "[flags] NAME", "Wake a suspended sandbox", cmdResume)
	register("policy", "[flags] NAME [--allow DOMAIN|CIDR,... | --deny all]", `Set a sandbox's egress allow list (--allow "" or --deny all denies all egress); without flags, print it and what it refused lately`, cmdPolicy)
	register("url", "[flags] NAME", "Print a sandbox's public URL", cmdURL)
	register("cp", "[flags] SRC DST", "Copy files or directories into or out of a sandbox (one of SRC and DST is NAME:PATH; - is a tar stream)", cmdCp)
	register("version", "[flags]", "Print managoat's version", cmdVersion)
	register("help", "[COMMAND]", "Print managoat's help, or a command's", cmdHelp)
}

func randomName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// positionals parses args into exactly n positionals (flags may come
// before, between and after them) and the rest; a missing positional is a
// usage error naming what.
func positionals(fs *flag.FlagSet, args []string, n int, what string) ([]string, []string, error) {
	pos, rest, err := parseN(fs, args, n)
	if err != nil {
		return nil, nil, err
	}
	if len(pos) < n || (n < 0 && len(pos) == 0) {
		return nil, nil, usageError{msg: "missing " + what}
	}
	return pos, rest, nil
}

// noMore refuses stray arguments.
func noMore(rest []string) error {
	if len(rest) > 0 {
		return usageError{msg: fmt.Sprintf("unexpected argument %q", rest[0])}
	}
	return nil
}

// sandboxArgs parses exactly n positionals whose first is a sandbox name,
// refusing anything after them, and returns the registry and the handle.
func sandboxArgs(g *globals, fs *flag.FlagSet, args []string, n int, what string) (*sandbox.Registry, *sandbox.Handle, []string, error) {
	pos, rest, err := positionals(fs, args, n, what)
	if err == nil {
		err = noMore(rest)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	reg, h, err := handleFor(g, pos[0])
	return reg, h, pos, err
}

// handleFor validates name and returns a registry and a handle for it.
func handleFor(g *globals, name string) (*sandbox.Registry, *sandbox.Handle, error) {
	if err := sandbox.ValidateName(name); err != nil {
		return nil, nil, usageError{msg: err.Error(), bare: true}
	}
	reg, p, err := openProvider(g.provider)
	if err != nil {
		return nil, nil, err
	}
	return reg, sandbox.BuildHandle(p.Name(), name), nil
}

// mustExist turns a missing sandbox into a one-line error that names it.
func mustExist(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) error {
	if _, err := reg.Get(ctx, h); err != nil {
		if errors.Is(err, sandbox.ErrNotFound) {
			return fmt.Errorf("sandbox %q: %w", h.Name, err)
		}
		return wrap("get", err)
	}
	return nil
}

func cmdRun(g *globals, fs *flag.FlagSet) action {
	var lf limitFlags
	lf.add(fs)
	var ef envFlags
	ef.add(fs)
	var iof ioFlags
	iof.add(fs, true, false) // no detach: the sandbox is run's own
	name := fs.String("name", "", "sandbox name (default run-<random>)")
	imgRef := imageFlag(fs)
	var vf volumeFlags
	vf.add(fs) // volumes.go
	var caf trustCAFlag
	caf.add(fs) // cacert.go
	var pf policyFlags
	pf.add(fs) // network.go
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		pol, withPolicy, err := pf.policy(fs)
		if err != nil {
			return err
		}
		mounts, err := vf.mounts()
		if err != nil {
			return err
		}
		argv, err := imageArgv(ctx, g, *imgRef, fs.Args()) // image.go
		if err != nil {
			return err
		}
		if len(argv) == 0 {
			return usageError{msg: "missing CMD"}
		}
		limits, err := lf.limits()
		if err != nil {
			return err
		}
		env, err := ef.environ()
		if err != nil {
			return err
		}
		if err := ef.checkUser(g); err != nil {
			return err
		}
		if env, mounts, err = caf.apply(g, *imgRef, env, mounts); err != nil {
			return err
		}
		g.ephemeral = true
		reg, p, err := openProvider(g.provider)
		if err != nil {
			return err
		}
		named := *name != ""
		if *name == "" {
			// A provider that routes by name (the runner) mints its own.
			if m, ok := p.(minter); ok {
				if *name, err = m.Mint(ctx); err != nil {
					return wrap("mint a name", err)
				}
			} else {
				*name = randomName("run-")
			}
		}
		if err := sandbox.ValidateName(*name); err != nil {
			return usageError{msg: err.Error(), bare: true}
		}
		if named {
			// Create adopts an existing sandbox, and run destroys what it
			// made: never one it did not make. (A create of the same name by
			// another process between this look and run's own is not seen.)
			if _, err := reg.Get(ctx, sandbox.BuildHandle(p.Name(), *name)); err == nil {
				return fmt.Errorf("sandbox %q already exists; run makes and destroys a sandbox of its own (use exec for this one): %w", *name, sandbox.ErrAlreadyExists)
			}
		}
		noteNoIsolation(g, p) // provider_local.go
		sp := startSpinner("creating sandbox " + *name)
		copts := sandbox.CreateOptions{Limits: limits, Image: *imgRef, Mounts: mounts}
		if p.Name() == "local" {
			copts.Dir = ef.dir // made at create, as docker run -w does
		}
		h, err := reg.Create(ctx, p.Name(), *name, copts)
		sp.Stop()
		if err != nil {
			return createErr(ctx, err)
		}
		defer func() {
			dctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := reg.Destroy(dctx, h); err != nil {
				fmt.Fprintf(os.Stderr, "managoat run: destroy %s: %v (%s)\n", h.Name, err, sandbox.Kind(err))
			}
		}()
		if withPolicy {
			if err := applyPolicy(ctx, reg, h, pol, false); err != nil { // destroyed by the defer
				return err
			}
		}
		sctx := ctx
		if limits.WallClock > 0 { // the budget of run's one command
			var cancel context.CancelFunc
			sctx, cancel = context.WithTimeout(ctx, limits.WallClock)
			defer cancel()
		}
		code, err := stream(sctx, reg, h, sandbox.Cmd{Name: argv[0], Args: argv[1:]}, sandbox.SpawnOptions{Stdin: true, Env: env, Dir: ef.dir}, false, &iof)
		if errors.Is(err, context.DeadlineExceeded) {
			return wrap("run", sandbox.ExecTimeout(limits.WallClock))
		}
		if errors.Is(err, context.Canceled) {
			fmt.Fprintln(os.Stderr, "managoat run: interrupted; destroying the sandbox")
			return exitError{exitDetached}
		}
		if err != nil {
			return err
		}
		return exitError{code}
	}
}

// createErr is a failed create's error, or, when Ctrl-C (or SIGTERM) cut
// it short, that, rather than whatever the cancellation broke first.
func createErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "managoat: interrupted while creating the sandbox")
		return exitError{exitDetached}
	}
	return wrap("create", err)
}

// stream spawns c and copies its output until it ends. When ctx ends
// first, the command is left running (Stop only detaches), or with kill
// its session is terminated (exec's timeout and Ctrl-C).
func stream(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, c sandbox.Cmd, o sandbox.SpawnOptions, kill bool, iof *ioFlags) (int, error) {
	keys, err := iof.keys()
	if err != nil {
		return 0, err
	}
	p, err := reg.Provider(h.Provider)
	if err != nil {
		return 0, err
	}
	cmd, err := reg.Spawn(ctx, h, c, iof.spawnOptions(o))
	if err != nil {
		return 0, wrap("spawn", err)
	}
	defer func() {
		if kill && ctx.Err() != nil && cmd.SessionID != "" {
			tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
			_ = reg.TerminateSession(tctx, h, cmd.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force})
			cancel()
		}
		_ = cmd.Stop()
	}()
	s := &session{p: p, cmd: cmd, flags: iof, keys: keys, stdin: o.Stdin}
	code, err := s.run(ctx)
	if errors.Is(err, errDetached) {
		detachedFrom(h, cmd.SessionID)
		return 0, exitError{0}
	}
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return 0, wrap("command", err)
	}
	return code, err
}

// detachedFrom says how to attach again to the session left running.
func detachedFrom(h *sandbox.Handle, id string) {
	if id == "" {
		fmt.Fprintln(os.Stderr, "\r\nmanagoat: detached; the command keeps running")
		return
	}
	fmt.Fprintf(os.Stderr, "\r\nmanagoat: detached from session %s; it keeps running (managoat attach %s %s)\r\n", id, h.Name, id)
}

// minter is a provider that routes by name and mints its own (the runner).
type minter interface {
	Mint(context.Context) (string, error)
}

func cmdCreate(g *globals, fs *flag.FlagSet) action {
	var lf limitFlags
	lf.add(fs)
	var ef envFlags
	ef.add(fs)
	var lab labelFlags
	fs.Var(&lab, "label", "a label `KEY=VALUE` kept with the sandbox, for ls --filter (repeatable; local provider, or through serve)")
	var of outputFlags
	of.add(fs, false)
	jsize := fs.String("journal-max-size", "", "bound on all of the sandbox's session journals together, e.g. 256M; the oldest finished ones are pruned (default 1G, local provider)")
	jage := fs.Duration("journal-max-age", 0, "prune a finished session's journal this long after it ended (default 168h, local provider)")
	var nf networkFlags
	nf.add(fs)
	imgRef := imageFlag(fs)
	var vf volumeFlags
	vf.add(fs) // volumes.go
	var caf trustCAFlag
	caf.add(fs) // cacert.go
	var pf policyFlags
	pf.add(fs) // network.go
	var rsf runnerSelectorFlags
	rsf.add(fs) // runners.go
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 1)
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		pol, withPolicy, err := pf.policy(fs)
		if err != nil {
			return err
		}
		mounts, err := vf.mounts()
		if err != nil {
			return err
		}
		limits, err := lf.limits()
		if err != nil {
			return err
		}
		env, err := ef.environ()
		if err != nil {
			return err
		}
		if err := ef.checkUser(g); err != nil {
			return err
		}
		if env, mounts, err = caf.apply(g, *imgRef, env, mounts); err != nil {
			return err
		}
		if *jsize != "" || *jage != 0 {
			r := journal.DefaultRetention
			if *jsize != "" {
				if r.MaxBytes, err = parseSize(*jsize); err != nil {
					return usageError{msg: "--journal-max-size: " + err.Error()}
				}
			}
			if *jage < 0 {
				return usageError{msg: "--journal-max-age must not be negative"}
			} else if *jage > 0 {
				r.MaxAge = *jage
			}
			if g.provider != "local" {
				return &sandbox.InvalidError{Reason: "journal_retention", Msg: fmt.Sprintf("provider %s keeps its sessions' output itself; --journal-max-size and --journal-max-age are the local provider's", g.provider)}
			}
			g.retention = &r
		}
		if err := of.check(); err != nil {
			return err
		}
		labels, err := lab.labels()
		if err != nil {
			return err
		}
		// The platform keeps labels on its records (serve's API), the local
		// provider in its state; no hosted provider keeps them for managoat.
		onPlatform := g.provider == "platform" || strings.HasPrefix(g.provider, "platform:")
		if len(labels) > 0 && g.provider != "local" && !onPlatform {
			return &sandbox.InvalidError{Reason: "labels", Msg: fmt.Sprintf("provider %s keeps no labels through managoat; --label is the local provider's and the platform's", g.provider)}
		}
		network, publish, err := nf.options(g.provider)
		if err != nil {
			return err
		}
		if (len(env) > 0 || ef.dir != "") && g.provider != "local" {
			return &sandbox.InvalidError{Reason: "defaults", Msg: fmt.Sprintf(
				"provider %s keeps no per-sandbox environment or working directory; give -e and -w to each exec instead", g.provider)}
		}
		reg, p, err := openProvider(g.provider)
		if err != nil {
			return err
		}
		var name string
		switch m, ok := p.(minter); {
		case len(pos) == 1:
			name = pos[0]
		case ok:
			if name, err = m.Mint(ctx); err != nil {
				return wrap("mint a name", err)
			}
		default:
			return usageError{msg: "missing NAME"}
		}
		if err := sandbox.ValidateName(name); err != nil {
			return usageError{msg: err.Error(), bare: true}
		}
		if *imgRef != "" {
			if _, err := ensureImage(ctx, g, *imgRef); err != nil { // image.go
				return err
			}
		}
		opts := sandbox.CreateOptions{Limits: limits, Env: env, Dir: ef.dir, Labels: labels, Image: *imgRef, Network: network, Publish: publish, Mounts: mounts}
		if len(pos) == 1 {
			if err := createConflict(ctx, reg, sandbox.BuildHandle(p.Name(), name), fs, opts); err != nil {
				return err
			}
		}
		noteNoIsolation(g, p) // provider_local.go
		existed := false
		if withPolicy {
			_, gerr := reg.Get(ctx, sandbox.BuildHandle(p.Name(), name))
			existed = gerr == nil
		}
		if ctx, err = rsf.context(ctx, g.provider); err != nil {
			return err
		}
		sp := startSpinner("creating sandbox " + name)
		h, err := reg.Create(ctx, p.Name(), name, opts)
		sp.Stop()
		if err != nil {
			return createErr(ctx, err)
		}
		if withPolicy {
			if err := applyPolicy(ctx, reg, h, pol, !existed); err != nil {
				return err
			}
		}
		if of.json() {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"name": name, "provider": p.Name()})
		}
		fmt.Println(name)
		return nil
	}
}

func cmdExec(g *globals, fs *flag.FlagSet) action {
	var ef envFlags
	ef.add(fs)
	var iof ioFlags
	iof.add(fs, true, true)
	timeout := fs.Duration("timeout", 0, "budget for the whole command")
	return func(ctx context.Context, args []string) error {
		pos, argv, err := positionals(fs, args, 1, "NAME")
		if err != nil {
			return err
		}
		if len(argv) == 0 {
			return usageError{msg: "missing CMD"}
		}
		env, err := ef.environ()
		if err != nil {
			return err
		}
		if err := ef.checkUser(g); err != nil {
			return err
		}
		reg, h, err := handleFor(g, pos[0])
		if err != nil {
			return err
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		sctx := ctx
		if *timeout > 0 {
			var cancel context.CancelFunc
			sctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		code, err := stream(sctx, reg, h, sandbox.Cmd{Name: argv[0], Args: argv[1:]},
			// At a terminal, the command is one a detach (Ctrl-P Ctrl-Q) leaves
			// running; a script's exec stays bound to its connection where the
			// provider ties the two (Sprites, E2B).
			sandbox.SpawnOptions{Stdin: true, Env: env, Dir: ef.dir, Detachable: iof.wantTTY() || isTerminal(os.Stdin)}, true, &iof)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			return wrap("exec", sandbox.ExecTimeout(*timeout))
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(os.Stderr, "managoat exec: interrupted; the command was killed (Ctrl-P Ctrl-Q detaches, leaving it running)")
			return exitError{exitDetached}
		case err != nil:
			return err
		}
		return exitError{code}
	}
}

func cmdSpawn(g *globals, fs *flag.FlagSet) action {
	detach := fs.Bool("detach", false, "print the session id and leave it running")
	var iof ioFlags
	iof.add(fs, true, true)
	var of outputFlags
	of.add(fs, false)
	var ef envFlags
	ef.add(fs)
	return func(ctx context.Context, args []string) error {
		pos, argv, err := positionals(fs, args, 1, "NAME")
		if err != nil {
			return err
		}
		if len(argv) == 0 {
			return usageError{msg: "missing CMD"}
		}
		if err := of.check(); err != nil {
			return err
		}
		env, err := ef.environ()
		if err != nil {
			return err
		}
		if err := ef.checkUser(g); err != nil {
			return err
		}
		reg, h, err := handleFor(g, pos[0])
		if err != nil {
			return err
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		c := sandbox.Cmd{Name: argv[0], Args: argv[1:]}
		keys, err := iof.keys()
		if err != nil {
			return err
		}
		// With --detach, -i keeps the session's stdin open for a later
		// attach to type into (as docker run -d -i); without -i it is
		// closed at once.
		stdin := !*detach || iof.interactive || iof.it
		cmd, err := reg.Spawn(ctx, h, c, iof.spawnOptions(sandbox.SpawnOptions{Stdin: stdin, Detachable: true, Env: env, Dir: ef.dir}))
		if err != nil {
			return wrap("spawn", err)
		}
		defer func() { _ = cmd.Stop() }()
		// The id is the one the provider read from the service, never a
		// guess from a listing (which may not show the session yet, or
		// shows older sessions of the same command).
		id := cmd.SessionID
		if id == "" && *detach {
			return errors.New("spawn --detach: the provider named no session id, so the command (left running) cannot be attached to")
		}
		if *detach && of.json() {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"session": id, "sandbox": h.Name})
		}
		if *detach {
			fmt.Println(id)
			return nil
		}
		return follow(ctx, reg, h, id, cmd, &iof, keys, true)
	}
}

// follow streams an attached or spawned session; Ctrl-C detaches. With
// stdin, managoat's stdin goes to the session's, and its end closes it.
func follow(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle, id string, cmd *sandbox.Command, iof *ioFlags, keys []byte, stdin bool) error {
	p, err := reg.Provider(h.Provider)
	if err != nil {
		return err
	}
	s := &session{p: p, cmd: cmd, flags: iof, keys: keys, stdin: stdin}
	code, err := s.run(ctx)
	if errors.Is(err, errDetached) {
		detachedFrom(h, id)
		return exitError{0}
	}
	if errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "\nmanagoat: detached from session %s; it keeps running (managoat attach %s %s)\n", id, h.Name, id)
		return exitError{exitDetached}
	}
	if err != nil {
		return wrap("session "+id, err)
	}
	return exitError{code}
}

func cmdAttach(g *globals, fs *flag.FlagSet) action {
	noStdin := fs.Bool("no-stdin", false, "watch only: managoat's stdin is not forwarded, and its end does not close the session's")
	var iof ioFlags
	iof.add(fs, false, true)
	return func(ctx context.Context, args []string) error {
		reg, h, pos, err := sandboxArgs(g, fs, args, 2, "NAME and SESSION")
		if err != nil {
			return err
		}
		keys, err := iof.keys()
		if err != nil {
			return err
		}
		id := pos[1]
		if ss, err := reg.ListSessions(ctx, h); err == nil {
			for _, s := range ss {
				iof.tty = iof.tty || (s.ID == id && s.TTY) // a terminal session: managoat's goes raw
			}
		}
		cmd, err := reg.Attach(ctx, h, id, sandbox.AttachOptions{Stdin: !*noStdin})
		if err != nil {
			if errors.Is(err, sandbox.ErrNotFound) {
				return fmt.Errorf("attach: session %q of sandbox %q: %w", id, h.Name, err)
			}
			return wrap("attach", err)
		}
		defer func() { _ = cmd.Stop() }()
		return follow(ctx, reg, h, id, cmd, &iof, keys, !*noStdin)
	}
}

func cmdTerminate(g *globals, fs *flag.FlagSet) action {
	force := fs.Bool("force", false, "kill at once (SIGKILL)")
	grace := fs.Duration("grace", 0, "how long to wait after SIGTERM (default 10s)")
	return func(ctx context.Context, args []string) error {
		reg, h, pos, err := sandboxArgs(g, fs, args, 2, "NAME and SESSION")
		if err != nil {
			return err
		}
		if *grace < 0 {
			return usageError{msg: "--grace must not be negative"}
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		if ss, err := reg.ListSessions(ctx, h); err == nil && !slices.ContainsFunc(ss, func(s sandbox.Session) bool { return s.ID == pos[1] }) {
			return fmt.Errorf("session %q of sandbox %q: %w", pos[1], h.Name, sandbox.ErrNotFound)
		}
		mode := sandbox.Graceful
		if *force {
			mode = sandbox.Force
		}
		return wrap("terminate", reg.TerminateSession(ctx, h, pos[1], sandbox.TerminateOptions{Mode: mode, Timeout: *grace}))
	}
}

func cmdRm(g *globals, fs *flag.FlagSet) action {
	force := fs.Bool("f", false, "destroy a sandbox even while sessions run in it (they are killed)")
	fs.BoolVar(force, "force", false, "the same as -f")
	return func(ctx context.Context, args []string) error {
		pos, _, err := positionals(fs, args, -1, "NAME")
		if err != nil {
			return err
		}
		// Every name is checked before anything is destroyed.
		type target struct {
			reg *sandbox.Registry
			h   *sandbox.Handle
		}
		var ts []target
		for _, n := range pos {
			reg, h, err := handleFor(g, n)
			if err != nil {
				return err
			}
			ts = append(ts, target{reg, h})
		}
		var errs []error
		for _, t := range ts {
			err := mustExist(ctx, t.reg, t.h)
			if err == nil && !*force {
				if ids := runningSessions(ctx, t.reg, t.h); len(ids) > 0 {
					err = &sandbox.InvalidError{Reason: "sessions_running", Msg: fmt.Sprintf(
						"sandbox %q has running sessions (%s); terminate them, or rm -f kills them with the sandbox", t.h.Name, strings.Join(ids, ", "))}
				}
			}
			if err == nil {
				err = wrap("rm "+t.h.Name, t.reg.Destroy(ctx, t.h))
			}
			errs = append(errs, err)
		}
		return errors.Join(errs...)
	}
}

func cmdSuspend(g *globals, fs *flag.FlagSet) action {
	return onOne(g, fs, "suspend", func(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) error {
		return reg.Suspend(ctx, h)
	})
}

func cmdResume(g *globals, fs *flag.FlagSet) action {
	return onOne(g, fs, "resume", func(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) error {
		_, err := reg.Resume(ctx, h)
		return err
	})
}

func cmdURL(g *globals, fs *flag.FlagSet) action {
	var of outputFlags
	of.add(fs, false)
	preview := fs.Int("preview", 0, "print a short-lived link a browser opens to this published `PORT` (through a platform: MANAGOAT_URL, MANAGOAT_API_KEY)")
	ttl := fs.Duration("ttl", 0, "with --preview: how long the link may be opened (default 15m, at most 24h)")
	return onOne(g, fs, "url", func(ctx context.Context, reg *sandbox.Registry, h *sandbox.Handle) error {
		if err := of.check(); err != nil {
			return err
		}
		if *preview != 0 { // url_preview.go
			v, err := previewURL(ctx, h.Name, *preview, *ttl)
			if err == nil && of.json() {
				return json.NewEncoder(os.Stdout).Encode(map[string]string{"url": v.URL, "sandbox": h.Name, "expires_at": v.ExpiresAt.Format(time.RFC3339)})
			}
			if err == nil {
				fmt.Println(v.URL)
			}
			return err
		}
		u, err := reg.PublicURL(ctx, h)
		if err == nil && of.json() {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{"url": u, "sandbox": h.Name})
		}
		if err == nil {
			fmt.Println(u)
		}
		return err
	})
}

// onOne is the action of a command that takes one sandbox's NAME and
// does op to it with f.
func onOne(g *globals, fs *flag.FlagSet, op string, f func(context.Context, *sandbox.Registry, *sandbox.Handle) error) action {
	return func(ctx context.Context, args []string) error {
		reg, h, _, err := sandboxArgs(g, fs, args, 1, "NAME")
		if err != nil {
			return err
		}
		err = f(ctx, reg, h)
		if errors.Is(err, sandbox.ErrNotFound) {
			return fmt.Errorf("%s: sandbox %q: %w", op, h.Name, err)
		}
		return wrap(op, err)
	}
}

func cmdPolicy(g *globals, fs *flag.FlagSet) action {
	var pf policyFlags
	pf.add(fs) // network.go
	return func(ctx context.Context, args []string) error {
		pos, rest, err := positionals(fs, args, 1, "NAME")
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		pol, given, err := pf.policy(fs)
		if err != nil {
			return err
		}
		reg, h, err := handleFor(g, pos[0])
		if err != nil {
			return err
		}
		if err := mustExist(ctx, reg, h); err != nil {
			return err
		}
		if !given {
			return wrap("policy", printPolicy(ctx, reg, h)) // network.go
		}
		return wrap("policy", reg.ApplyNetworkPolicy(ctx, h, pol))
	}
}

// cmdHelp prints managoat's help, or a command's (what its --help prints).
func cmdHelp(g *globals, fs *flag.FlagSet) action {
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 1)
		if err != nil {
			return err
		}
		if err := noMore(rest); err != nil {
			return err
		}
		if len(pos) == 0 {
			usage(os.Stdout)
			return nil
		}
		c, ok := lookup(pos[0])
		if !ok {
			return usageError{msg: fmt.Sprintf("unknown command %q (managoat help lists them)", pos[0])}
		}
		cfs := (&globals{}).flagSet(c.name)
		c.setup(&globals{}, cfs)
		c.help(os.Stdout, cfs)
		return nil
	}
}
