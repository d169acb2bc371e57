package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/time/rate"

	"github.com/managoat/managoat/internal/connlimit"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/provider/local"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// Environment variables of the runner commands.
const (
	envRunnerToken = "MANAGOAT_RUNNER_TOKEN" // the platform's static token (serve, runner, --provider runner)
	envPlatformURL = "MANAGOAT_URL"          // where --provider runner finds the platform
)

func init() {
	register("runner", "[flags] --url URL", "Run the self-hosted runner daemon: dial a platform and serve it this machine's sandboxes", cmdRunner)
	register("serve", "[flags] | serve [--db FILE] admin ...", "Serve the platform: the sandbox API (/v1) over every enabled provider, and the relay runners dial into", cmdServe)
	register("enroll", "[flags] NAME", "Enroll a runner with the platform served from this machine and print its credential", cmdEnroll)
	registerProvider("runner", func() (sandbox.Provider, error) {
		url := defaultedPlatformURL() // platform.go: said once when MANAGOAT_URL is unset
		tok := strings.TrimSpace(os.Getenv(envRunnerToken))
		if tok == "" {
			return nil, fmt.Errorf("%s is not set: the token of the platform at %s", envRunnerToken, url)
		}
		return runnerprov.NewProvider(runnerprov.NewClient(url, tok), runnerprov.ProviderOptions{}), nil
	})
}

// readToken reads the token from file, else from the environment, and
// takes it out of this process's environment either way, so no process
// started from here (a supervisor, a session's command) inherits it. A
// token on the command line is refused: every user sees it in ps.
func readToken(flagValue, file string) (string, error) {
	env := strings.TrimSpace(os.Getenv(envRunnerToken))
	os.Unsetenv(envRunnerToken)
	switch {
	case flagValue != "":
		return "", usageError{msg: "--token would show the token to every user of this host (ps): use --token-file FILE or " + envRunnerToken}
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, nil
		}
		return "", usageError{msg: "the token file " + file + " is empty"}
	case env != "":
		return env, nil
	}
	return "", usageError{msg: "a token is required: --token-file FILE or " + envRunnerToken}
}

func cmdRunner(g *globals, fs *flag.FlagSet) action {
	url := fs.String("url", "", "the platform's base URL")
	token := fs.String("token", "", "refused: a token on the command line shows in ps (use --token-file or "+envRunnerToken+")")
	tokenFile := fs.String("token-file", "", "a file holding the token")
	name := fs.String("name", "", "this runner's name (default from the hostname)")
	root := fs.String("root", "", "where this runner keeps its sandboxes")
	fleet := runnerFleetFlags(fs) // runners.go
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if *url == "" {
			return usageError{msg: "--url is required"}
		}
		tok, err := readToken(*token, *tokenFile)
		if err != nil {
			return err
		}
		if *name == "" {
			host, _ := os.Hostname()
			*name = runner.DefaultName(host)
		}
		if *root == "" {
			*root = filepath.Join(local.DefaultStateDir(), "runners", *name)
		}
		p, err := local.New(local.Config{StateDir: *root, MechanismName: g.mechanism})
		if err != nil {
			return wrap("runner", err)
		}
		fmt.Fprintf(os.Stderr, "managoat runner %s: serving %s sandboxes from %s to %s\n", *name, g.mechanism, *root, runner.RedactURL(*url))
		rcfg := runner.Config{URL: *url, Token: tok, Name: *name, Root: *root, Provider: p, Version: version,
			Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})),
			OnDisconnect: func(attempt int, delay time.Duration, err error) {
				if err != nil {
					fmt.Fprintf(os.Stderr, "managoat runner: disconnected (%v); reconnecting in %v\n", err, delay)
				}
			}}
		fleet.apply(&rcfg)
		err = runner.Run(ctx, rcfg)
		var perm *runner.PermanentError
		switch {
		case errors.As(err, &perm):
			return fmt.Errorf("runner: the platform refused this runner for good: %w", err)
		case errors.Is(err, context.Canceled):
			fmt.Fprintln(os.Stderr, "managoat runner: stopped")
			return nil
		}
		return wrap("runner", err)
	}
}

// Environment of a platform of several replicas.
const (
	envDatabaseURL = "MANAGOAT_DATABASE_URL"
	envNATSURL     = "MANAGOAT_NATS_URL"
)

// hasPassword reports whether a URL carries a password.
func hasPassword(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return true // unparsable: assume the worst, say nothing of it
	}
	_, ok := u.User.Password()
	return ok
}

func cmdServe(g *globals, fs *flag.FlagSet) action {
	listen := fs.String("listen", "127.0.0.1:8080", "address to listen on")
	tokenFile := fs.String("token-file", "", "a file holding the token (default "+envRunnerToken+")")
	maxConns := fs.Int("max-conns", 4096, "connections held at once, in all (more are closed as they arrive)")
	maxPerSource := fs.Int("max-conns-per-source", 256, "connections held at once from one source address")
	runners := fs.String("runners", "", "the enrolled runners' file (default "+defaultRunnersFile()+"); see managoat enroll")
	tlsCert := fs.String("tls-cert", "", "serve HTTPS with this certificate (PEM; with --tls-key), else plain HTTP for a reverse proxy to terminate TLS")
	tlsKey := fs.String("tls-key", "", "the certificate's private key (PEM)")
	open := fs.Bool("open-runners", false, "let the client token connect runners too, as Fountain's platform did (any holder can then pose as a runner)")
	db := fs.String("db", os.Getenv(envDatabaseURL), "the platform's records: a SQLite file (default "+defaultPlatformDB()+"), or a postgres:// URL that several replicas share (default $"+envDatabaseURL+"; a password goes in that variable or PGPASSWORD, never in the flag); 'serve admin' manages its accounts and keys")
	fs.StringVar(db, "database", os.Getenv(envDatabaseURL), "the same as --db")
	natsURL := fs.String("nats", os.Getenv(envNATSURL), "NATS server of a platform of several replicas (default $"+envNATSURL+"): runners connected to any replica are reached from every one")
	natsOpts := addNATSFlags(fs)
	idle := fs.Duration("idle", 15*time.Minute, "park a sandbox unused this long (suspended, or destroyed where its provider cannot suspend); 0 never")
	reapEvery := fs.Duration("reap-every", time.Minute, "how often records are reconciled with the providers")
	streams := fs.Int("streams-per-account", api.DefaultStreamMaxPerAccount, "WebSocket streams one account may hold open at once on this replica (more are 429)")
	authRate := fs.Float64("failed-auth-rate", api.DefaultFailedAuthRate, "failed authentications a second per source address (an IPv6 /64) before its requests are 429 for a while, good keys too; behind a reverse proxy every client shares the proxy's address, so raise it there")
	authBurst := fs.Int("failed-auth-burst", api.DefaultFailedAuthBurst, "failed authentications a source address may make at once before --failed-auth-rate applies")
	sandboxes := fs.Int("sandboxes-per-account", api.DefaultMaxSandboxesPerAccount, "sandboxes one account may hold, every provider's, parked ones too (one more create is 403 resource_exhausted)")
	runnerNames := fs.Int("runners-per-account", api.DefaultMaxRunnersPerAccount, "runner names one account may hold (a connection under one more is 403 resource_exhausted; serve admin runner rm frees one)")
	publicURL := fs.String("public-url", "", "the platform's URL as clients reach it (behind a reverse proxy: its URL), which the URLs of sandboxes' published ports start with (default: the scheme and host each create came to)")
	return func(ctx context.Context, args []string) error {
		if err := parse(fs, args); err != nil {
			return err
		}
		if *db == "" {
			*db = defaultPlatformDB()
		}
		if *natsURL != os.Getenv(envNATSURL) && hasPassword(*natsURL) {
			return usageError{msg: "--nats: a password in the flag shows in ps to every user; put the URL in " + envNATSURL}
		}
		if *db != os.Getenv(envDatabaseURL) && isPostgres(*db) && hasPassword(*db) {
			return usageError{msg: "--db: a password in the flag shows in ps to every user; put the URL in " + envDatabaseURL + " or the password in PGPASSWORD"}
		}
		if a := fs.Args(); len(a) > 0 && a[0] == "admin" {
			rf := *runners
			if rf == "" {
				rf = defaultRunnersFile()
			}
			return serveAdmin(ctx, *db, rf, a[1:])
		}
		if err := noMore(fs.Args()); err != nil {
			return err
		}
		if err := natsOpts.load(*natsURL); err != nil {
			return err
		}
		if *maxConns < 1 || *maxPerSource < 1 {
			return usageError{msg: "--max-conns and --max-conns-per-source must be at least 1"}
		}
		if *streams < 1 || *authBurst < 1 || !(*authRate > 0) || *sandboxes < 1 || *runnerNames < 1 {
			return usageError{msg: "--streams-per-account, --failed-auth-rate, --failed-auth-burst, --sandboxes-per-account and --runners-per-account must be positive"}
		}
		if u, err := url.Parse(*publicURL); *publicURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil) {
			return usageError{msg: fmt.Sprintf("--public-url %q: http(s)://host[:port][/path], without credentials", *publicURL)}
		}
		if (*tlsCert == "") != (*tlsKey == "") {
			return usageError{msg: "--tls-cert and --tls-key go together"}
		}
		var tlsConf *tls.Config
		if *tlsCert != "" {
			cert, err := tls.LoadX509KeyPair(*tlsCert, *tlsKey)
			if err != nil {
				return wrap("serve", sandbox.Invalid("tls", err.Error()))
			}
			tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		}
		// The static token of Fountain's relay is optional: accounts'
		// API keys (serve admin) are the platform's credentials.
		var tok string
		if *tokenFile != "" || os.Getenv(envRunnerToken) != "" {
			t, err := readToken("", *tokenFile)
			if err != nil {
				return err
			}
			tok = t
		}
		if *runners == "" {
			*runners = defaultRunnersFile()
		}
		mux, closePlatform, err := newPlatform(ctx, platformOptions{db: *db, mechanism: g.mechanism, token: tok, runners: *runners,
			open: *open, idle: *idle, reapEvery: *reapEvery, natsURL: *natsURL, nats: natsOpts, publicURL: *publicURL, logger: slog.New(slog.NewTextHandler(os.Stderr, nil)),
			streams: *streams, authRate: rate.Limit(*authRate), authBurst: *authBurst, sandboxes: *sandboxes, runnerNames: *runnerNames})
		if err != nil {
			return err
		}
		mux, closePlatform = serveMCP(mux, closePlatform) // /mcp: mcp.go
		defer closePlatform()

		ln, err := net.Listen("tcp", *listen)
		if err != nil {
			return wrap("serve", err)
		}
		// Bounded: connections (in all and per source), the time to send
		// headers and their size, and how long a kept-alive connection
		// may idle; a refused caller's connection is closed after its
		// 401 or 403. A runner's WebSocket, once upgraded, is kept alive
		// by its pings instead.
		ln = connlimit.New(ln, *maxConns, *maxPerSource)
		scheme := "http"
		if tlsConf != nil {
			ln, scheme = tls.NewListener(ln, tlsConf), "https"
		}
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 60 * time.Second, MaxHeaderBytes: 64 << 10}
		how := "their account's API key, or an enrolment in " + *runners + " (managoat enroll NAME)"
		if *open {
			how = "any holder of the client token, as a runner too (--open-runners)"
		}
		fmt.Fprintf(os.Stderr, "managoat serve: listening on %s://%s; the API is /v1 (API keys: managoat serve admin); runners dial /api/runners/ws: %s\n", scheme, ln.Addr(), how)
		errc := make(chan error, 1)
		go func() { errc <- hs.Serve(ln) }()
		select {
		case err := <-errc:
			return wrap("serve", err)
		case <-ctx.Done():
		}
		closePlatform()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return wrap("serve", hs.Shutdown(sctx))
	}
}

// defaultRunnersFile is where serve and enroll keep the enrolled runners.
func defaultRunnersFile() string {
	return filepath.Join(local.DefaultStateDir(), "platform", "runners.json")
}

func cmdEnroll(g *globals, fs *flag.FlagSet) action {
	runners := fs.String("runners", "", "the enrolled runners' file (default "+defaultRunnersFile()+")")
	rotate := fs.Bool("rotate", false, "replace the credential of a runner enrolled already")
	revoke := fs.Bool("revoke", false, "remove the runner's credential instead")
	account := fs.String("account", "local", "the account the runner serves")
	db := fs.String("db", os.Getenv(envDatabaseURL), "the platform's records, where --label's labels go: serve's --db (default "+defaultPlatformDB()+", or $"+envDatabaseURL+")")
	labels := map[string]string{}
	fs.Func("label", "an operator label of the runner, key=value (repeatable; key= removes one): recorded in the platform's records, over the daemon's own --label of the same key when the platform places (create --runner-selector)", func(s string) error {
		k, v, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("%q is not key=value", s)
		}
		if err := wire.CheckLabel(k, v); err != nil {
			return err
		}
		if _, had := labels[k]; !had && len(labels) >= wire.MaxLabels {
			return fmt.Errorf("more than %d labels", wire.MaxLabels)
		}
		labels[k] = v
		return nil
	})
	return func(ctx context.Context, args []string) error {
		pos, rest, err := parseN(fs, args, 1)
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			return usageError{msg: "missing NAME"}
		}
		if err := noMore(rest); err != nil {
			return err
		}
		if *runners == "" {
			*runners = defaultRunnersFile()
		}
		if *revoke {
			return wrap("enroll", runnerprov.Revoke(*runners, pos[0]))
		}
		if *db == "" {
			*db = defaultPlatformDB()
		}
		secret, err := runnerprov.Enroll(*runners, pos[0], *account, *rotate)
		if err != nil {
			return wrap("enroll", err)
		}
		fmt.Println(secret)
		if len(labels) > 0 {
			st, err := openStore(ctx, *db)
			if err == nil {
				err = api.EnrolLabels(ctx, st, *account, pos[0], labels)
				st.Close()
			}
			if err != nil {
				return wrap("enroll", fmt.Errorf("%s is enrolled (its credential is above), but its labels were not recorded in %s: %w (managoat runners label %s KEY=VALUE... sets them once it is connected)", pos[0], *db, err, pos[0]))
			}
		}
		accountGiven := false
		fs.Visit(func(f *flag.Flag) { accountGiven = accountGiven || f.Name == "account" })
		if !accountGiven {
			// The default is a fallback a user of serve admin's accounts
			// does not expect: their --provider platform:runner would find
			// no runner online while this one is connected.
			noteOnce(fmt.Sprintf("no --account: %s serves account %q, the default (the static token's); a runner for an account made with serve admin needs --account NAME (enroll --rotate --account NAME %s changes it)", pos[0], *account, pos[0]))
		}
		fmt.Fprintf(os.Stderr, "managoat enroll: %s enrolled in %s for account %q; its credential (above) is shown once:\n"+
			"  put it in a file and run: managoat runner --url URL --name %s --token-file FILE\n", pos[0], *runners, *account, pos[0])
		return nil
	}
}
