package main

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/time/rate"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/dashboard"
	"github.com/managoat/managoat/platform/doors/daytonadoor"
	"github.com/managoat/managoat/platform/doors/e2bdoor"
	"github.com/managoat/managoat/platform/doors/spritesdoor"
	"github.com/managoat/managoat/platform/lifecycle"
	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/postgres"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/local"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// envAPIKey is an account's API key for the platform client: with it and
// MANAGOAT_URL set, every command goes to the platform (provider
// "platform"), unless --provider says otherwise.
const envAPIKey = "MANAGOAT_API_KEY"

func init() {
	registerProvider(client.Name, platformClient(""))
	// platform:NAME pins the provider of the sandboxes a command creates.
	for _, pin := range []string{policy.Local, policy.Sprites, policy.E2B, policy.Daytona, policy.Runner} {
		registerProvider(client.Name+":"+pin, platformClient(pin))
	}
	if os.Getenv(envAPIKey) != "" && os.Getenv(envPlatformURL) != "" {
		current.provider, current.providerChosen = client.Name, true
	}
}

// noteLocalFallback says once, on stderr, that the local provider is used
// though MANAGOAT_URL names a platform: without MANAGOAT_API_KEY the
// platform is not chosen, and a user who exported only the URL would
// otherwise see this machine's sandboxes as if they were the platform's.
func noteLocalFallback(name string) {
	if name != defaultProvider || current.chosenProvider() || os.Getenv(envPlatformURL) == "" || os.Getenv(envAPIKey) != "" {
		return
	}
	noteOnce("MANAGOAT_URL is set but MANAGOAT_API_KEY is not: using the local provider on this machine, not the platform at " +
		runner.RedactURL(os.Getenv(envPlatformURL)) + " (export MANAGOAT_API_KEY, or give --provider local)")
}

// platformKey is the API key, read from the environment (never a flag: ps
// shows flags) once and taken out of it, so that no process started from
// here inherits it; a command that opens the client more than once (rm of
// several names) reads the same key each time.
var platformKey = sync.OnceValue(func() string {
	key := strings.TrimSpace(os.Getenv(envAPIKey))
	os.Unsetenv(envAPIKey)
	return key
})

// defaultedPlatformURL is MANAGOAT_URL, else serve's default address,
// which is said once on stderr (a fallback the user did not choose).
func defaultedPlatformURL() string {
	if u := os.Getenv(envPlatformURL); u != "" {
		return u
	}
	noteOnce("MANAGOAT_URL is not set: using the platform at http://127.0.0.1:8080, serve's default address")
	return "http://127.0.0.1:8080"
}

// platformClient builds the platform client with platformKey.
func platformClient(pin string) func() (sandbox.Provider, error) {
	return func() (sandbox.Provider, error) {
		url := defaultedPlatformURL()
		key := platformKey()
		if key == "" {
			return nil, fmt.Errorf("%s is not set: an API key of your account on the platform at %s (managoat serve admin key create ACCOUNT)", envAPIKey, url)
		}
		return client.New(client.Options{URL: url, APIKey: key, Provider: pin})
	}
}

// platformSecrets are the variables serve reads once and takes out of its
// environment.
var platformSecrets = []string{policy.EnvSprites, policy.EnvE2B, policy.EnvDaytona, envDatabaseURL, envNATSURL, "PGPASSWORD"}

// defaultPlatformDB is where serve keeps its records.
func defaultPlatformDB() string {
	return filepath.Join(local.DefaultStateDir(), "platform", "platform.db")
}

// platformOptions are serve's settings of the platform.
type platformOptions struct {
	db        string
	mechanism string
	token     string       // the static token of Fountain's relay ("" for none)
	runners   string       // the enrolled runners' file
	natsURL   string       // NATS of a platform of several replicas ("" for one)
	nats      *natsOptions // its connection's credentials and the cluster key (natsflags.go)
	publicURL string       // the platform's URL as clients reach it ("": each request's)
	open      bool         // --open-runners
	idle      time.Duration
	reapEvery time.Duration
	logger    *slog.Logger
	// streams, authRate, authBurst: api.Config's StreamMaxPerAccount,
	// FailedAuthRate and FailedAuthBurst (zero: its defaults).
	streams   int
	authRate  rate.Limit
	authBurst int
	// sandboxes, runnerNames: api.Config.MaxSandboxesPerAccount and
	// api.RunnerAuth.MaxRunners (zero: their defaults).
	sandboxes, runnerNames int
}

// newPlatform opens the records, reads the provider policy (refusing an
// explicit default that is off), builds the enabled providers and returns
// the handler of /v1 and /api/runners, and what closes them.
func newPlatform(ctx context.Context, o platformOptions) (http.Handler, func(), error) {
	st, err := openStore(ctx, o.db)
	if err != nil {
		return nil, nil, wrap("serve", err)
	}
	var lease func(context.Context) bool
	var holder *postgres.Holder
	localDir := filepath.Join(filepath.Dir(o.db), "local")
	switch st := st.(type) {
	case *sqlite.Store:
		if !st.Owner() {
			st.Close()
			return nil, nil, wrap("serve", fmt.Errorf("%s is in use by another managoat serve: %w", o.db, sandbox.ErrAlreadyExists))
		}
	case *postgres.Store:
		// Several replicas share the records: one parks and reaps at a
		// time, and the local provider keeps its sandboxes on this host.
		holder = st.Holder("lifecycle")
		lease = holder.Held
		localDir = filepath.Join(filepath.Dir(defaultPlatformDB()), "local")
	}
	var nh *natshost.Host
	var nc *nats.Conn
	closeCluster := func() {
		if holder != nil {
			holder.Close()
		}
		if nh != nil {
			nh.Close()
		}
		if nc != nil {
			nc.Close()
		}
	}
	if o.natsURL != "" {
		nc, err = nats.Connect(o.natsURL, append([]nats.Option{nats.Name("managoat serve"), nats.MaxReconnects(-1)}, o.nats.opts...)...)
		if err != nil {
			st.Close()
			return nil, nil, wrap("serve", sandbox.Unavailable("nats", fmt.Errorf("%s: %w", runner.RedactURL(o.natsURL), err)))
		}
		// A cluster named by several URLs keeps presence on three nodes,
		// so that losing one loses no runner.
		replicas := min(3, len(strings.Split(o.natsURL, ",")))
		nh, err = natshost.New(ctx, natshost.Config{Conn: nc, BucketReplicas: replicas, Logger: o.logger, ClusterKey: o.nats.key})
		if err != nil {
			closeCluster()
			st.Close()
			return nil, nil, wrap("serve", err)
		}
	}
	var lp *local.Provider
	// The probe `managoat doctor` runs: the gate admits a sandbox of the
	// mechanism on this host.
	probe := func() error {
		p, err := local.New(local.Config{StateDir: localDir, MechanismName: o.mechanism})
		if err != nil {
			return err
		}
		if err := mechanism.Gate(ctx, p.Mechanism(), mechanism.Spec{}, &mechanism.CachingProber{P: mechanism.NewHostProber()}); err != nil {
			return err
		}
		lp = p
		return nil
	}
	pol, err := policy.FromEnv(os.LookupEnv, policy.Options{LocalProbe: probe, Logger: o.logger})
	if err != nil {
		st.Close()
		return nil, nil, usageError{msg: err.Error(), bare: true}
	}
	provs := map[string]sandbox.Provider{}
	if lp != nil && pol.Enabled(policy.Local) {
		if holder != nil {
			// Each replica's local sandboxes live on its own host: another
			// replica would find them missing and drop their shared records.
			closeCluster()
			st.Close()
			return nil, nil, usageError{msg: "serve: records shared in PostgreSQL with the local provider enabled: a replica's local sandboxes live on its own host, and the other replicas would drop their records; set SANDBOX_LOCAL_ENABLED=false on the replicas (run local sandboxes through runners)", bare: true}
		}
		provs[policy.Local] = lp
	}
	for _, name := range []string{policy.Sprites, policy.E2B, policy.Daytona} {
		if !pol.Enabled(name) {
			continue
		}
		_, p, err := openProvider(name)
		if err != nil {
			st.Close()
			return nil, nil, wrap("serve", err)
		}
		provs[name] = p
	}
	// The hosted providers have read their credentials, and the records
	// and NATS are open (their clients keep what they parsed): no process
	// serve starts from here (a local sandbox's supervisor, which its
	// commands come from) inherits a credential or a URL that may carry a
	// password.
	for _, k := range platformSecrets {
		os.Unsetenv(k)
	}
	auth := platformAuth{store: st, token: o.token}
	rcfg := runnerprov.ServerConfig{Auth: auth, Logger: o.logger, Disabled: !pol.Enabled(policy.Runner), Host: runnerprov.NewLocalHost()}
	if nh != nil {
		rcfg.Host = nh // runners registered cluster-wide, reached from any replica
	}
	if !o.open {
		rcfg.RunnerAuth = api.RunnerAuth{Store: st, Fallback: runnerprov.RunnerFile{Path: o.runners}, MaxRunners: o.runnerNames}
	}
	relay := runnerprov.NewServer(rcfg)
	var runners runnerprov.Caller = relay
	if nh != nil {
		runners = nh
	}
	secretFile := os.Getenv(envServeSecret)
	if secretFile == "" {
		secretFile = filepath.Join(filepath.Dir(localDir), "serve.secret")
	}
	secret, err := serveSecret(secretFile) // serve_secret.go
	if err != nil {
		closeCluster()
		st.Close()
		return nil, nil, wrap("serve", err)
	}
	srv, err := api.New(api.Config{Store: st, Policy: pol, Providers: provs, Runners: runners, Logger: o.logger, BaseURL: o.publicURL,
		StreamMaxPerAccount: o.streams, FailedAuthRate: o.authRate, FailedAuthBurst: o.authBurst, MaxSandboxesPerAccount: o.sandboxes,
		PreviewSecret: secret, PreviewDomain: os.Getenv(envPreviewDomain)})
	if err != nil {
		closeCluster()
		st.Close()
		return nil, nil, err
	}
	dash, err := dashboard.New(dashboard.Config{API: srv, Store: st, Secret: secret, Logger: o.logger})
	if err != nil {
		srv.Close()
		closeCluster()
		st.Close()
		return nil, nil, err
	}
	if o.reapEvery <= 0 {
		o.reapEvery = time.Minute
	}
	idle := o.idle
	if idle == 0 {
		idle = -1 // never
	}
	lm := lifecycle.New(lifecycle.Config{Store: st, API: srv, Idle: idle, Interval: o.reapEvery, Lease: lease, Logger: o.logger})
	lctx, stopLifecycle := context.WithCancel(context.WithoutCancel(ctx))
	lifecycleDone := make(chan struct{})
	go func() {
		defer close(lifecycleDone)
		_ = lm.Run(lctx)
	}()
	mux := http.NewServeMux()
	mux.Handle("/v1/", srv)
	mux.Handle("/api/runners", relay)
	mux.Handle("/api/runners/", relay)
	door, err := e2bdoor.New(e2bdoor.Options{API: srv, Secret: secret, Prefix: "/e2b"}) // E2B's SDK against serve (issue 34)
	if err != nil {
		stopLifecycle()
		<-lifecycleDone
		srv.Close()
		relay.Close()
		closeCluster()
		st.Close()
		return nil, nil, err
	}
	mux.Handle("/e2b/", door)
	sdoor, err := spritesdoor.New(spritesdoor.Options{API: srv, Prefix: "/sprites"}) // @fly/sprites against serve (issue 34)
	if err != nil {
		_ = door.Close()
		stopLifecycle()
		<-lifecycleDone
		srv.Close()
		relay.Close()
		closeCluster()
		st.Close()
		return nil, nil, err
	}
	mux.Handle("/sprites/", sdoor)
	ddoor, err := daytonadoor.New(daytonadoor.Options{API: srv, Prefix: "/daytona"}) // @daytonaio/sdk against serve (issue 34)
	if err != nil {
		_ = door.Close()
		_ = sdoor.Close()
		stopLifecycle()
		<-lifecycleDone
		srv.Close()
		relay.Close()
		closeCluster()
		st.Close()
		return nil, nil, err
	}
	mux.Handle("/daytona/", ddoor)
	mux.Handle("/", dash) // the dashboard; a preview's host is served by srv (WithPreviews)
	def := pol.Default()
	if def == "" {
		def = "none: every create fails until a provider is enabled"
	}
	where := o.db
	if holder != nil {
		where = "PostgreSQL"
	}
	if nh != nil {
		where += "; runners shared over NATS as replica " + nh.Replica()
	}
	fmt.Fprintf(os.Stderr, "managoat serve: records in %s; providers enabled: %s; default: %s\n", where, strings.Join(pol.EnabledNames(), ", "), def)
	var once sync.Once
	return srv.WithPreviews(mux), func() {
		once.Do(func() {
			stopLifecycle()
			<-lifecycleDone
			_ = door.Close()
			_ = sdoor.Close()
			_ = ddoor.Close()
			srv.Close()
			relay.Close()
			closeCluster()
			st.Close()
		})
	}, nil
}

// isPostgres reports whether db names a PostgreSQL database (a
// postgres:// URL, or libpq's keyword form "host=... dbname=...") rather
// than a SQLite file.
func isPostgres(db string) bool {
	if strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://") {
		return true
	}
	for _, k := range []string{"host=", "dbname=", "user="} {
		if strings.HasPrefix(db, k) || strings.Contains(db, " "+k) {
			return true
		}
	}
	return false
}

// openStore opens the records: PostgreSQL for a postgres:// URL (several
// replicas may share it), else the SQLite file db.
func openStore(ctx context.Context, db string) (store.Store, error) {
	if isPostgres(db) {
		return postgres.Open(ctx, db)
	}
	return sqlite.Open(ctx, db)
}

// platformAuth admits account API keys (the account's id), and the static
// token of Fountain's relay (account "local", or the account of that name).
type platformAuth struct {
	store store.Store
	token string
}

func (a platformAuth) Authenticate(r *http.Request, key string) (string, error) {
	if strings.HasPrefix(key, api.KeyPrefix) {
		return api.RunnerAuth{Store: a.store}.Authenticate(r, key)
	}
	if a.token == "" || subtle.ConstantTimeCompare([]byte(key), []byte(a.token)) != 1 {
		return "", runnerprov.ErrUnauthorized
	}
	if ac, err := a.store.AccountByName(r.Context(), "local"); err == nil {
		return ac.ID, nil
	}
	return "local", nil
}

// serveAdmin is `managoat serve [--db FILE] admin ...`: accounts and keys.
func serveAdmin(ctx context.Context, db, runnersFile string, args []string) error {
	usage := usageError{msg: "serve admin: account create NAME | account ls | account delete NAME | key create ACCOUNT [--label L] | key ls ACCOUNT | key revoke KEY_ID | runner ls ACCOUNT | runner rm ACCOUNT NAME"}
	if len(args) < 2 {
		return usage
	}
	st, err := openStore(ctx, db)
	if err != nil {
		return wrap("serve admin", err)
	}
	defer st.Close()
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	defer tw.Flush()
	account := func(name string) (store.Account, error) {
		a, err := st.AccountByName(ctx, name)
		if err != nil {
			return a, wrap("serve admin", fmt.Errorf("account %q: %w", name, err))
		}
		return a, nil
	}
	switch args[0] + " " + args[1] {
	case "account create":
		if len(args) != 3 || args[2] == "" {
			return usage
		}
		a, err := st.CreateAccount(ctx, args[2])
		if err != nil {
			return wrap("serve admin", err)
		}
		fmt.Println(a.ID)
	case "account delete", "account rm":
		// An account with sandboxes is refused: their records would go,
		// and the providers' sandboxes be left with no account.
		if len(args) != 3 {
			return usage
		}
		a, err := account(args[2])
		if err != nil {
			return err
		}
		keys, _ := st.ListKeys(ctx, a.ID)
		switch err := st.DeleteAccount(ctx, a.ID); {
		case errors.Is(err, store.ErrInUse):
			var names []string
			if sbs, err := st.ListSandboxes(ctx, a.ID); err == nil {
				for _, b := range sbs {
					names = append(names, b.Name)
				}
			}
			held := "operations under way (a destroy or checkpoint the platform is settling; try again in a minute)"
			if len(names) > 0 {
				held = fmt.Sprintf("sandboxes (%s): destroy them first (managoat rm, with one of its keys)", strings.Join(names, ", "))
			}
			return &sandbox.InvalidError{Reason: "account_in_use", Msg: fmt.Sprintf("serve admin: account %q holds %s", a.Name, held)}
		case err != nil:
			return wrap("serve admin", err)
		}
		// Its runners' enrolments are its name's: they must not serve the
		// next account given the name.
		gone, err := runnerprov.RevokeAccount(runnersFile, a.Name)
		if err != nil {
			return wrap("serve admin", fmt.Errorf("account %q deleted, but its runners' enrolments in %s were not revoked: %w", a.Name, runnersFile, err))
		}
		fmt.Fprintf(os.Stderr, "managoat serve admin: account %s (%s) deleted, with its %d keys and its runners' records; enrolments revoked: %d %v\n",
			a.Name, a.ID, len(keys), len(gone), gone)
	case "account ls":
		as, err := st.ListAccounts(ctx)
		if err != nil {
			return wrap("serve admin", err)
		}
		fmt.Fprintln(tw, "NAME\tID\tCREATED")
		for _, a := range as {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", a.Name, a.ID, a.CreatedAt.Format(time.RFC3339))
		}
	case "key create":
		fs := flag.NewFlagSet("key create", flag.ContinueOnError)
		fs.SetOutput(os.Stderr)
		label := fs.String("label", "", "a label for the key")
		pos, rest, err := parseN(fs, args[2:], 1)
		if err != nil {
			return err
		}
		if len(pos) != 1 || len(rest) != 0 {
			return usage
		}
		a, err := account(pos[0])
		if err != nil {
			return err
		}
		key, err := api.NewKey(ctx, st, a.ID, *label)
		if err != nil {
			return wrap("serve admin", err)
		}
		fmt.Println(key)
		fmt.Fprintf(os.Stderr, "managoat serve admin: key %s of %s (above) is shown once; export %s=... and %s=URL to use it\n",
			api.KeyID(key), a.Name, envAPIKey, envPlatformURL)
	case "key ls":
		if len(args) != 3 {
			return usage
		}
		a, err := account(args[2])
		if err != nil {
			return err
		}
		ks, err := st.ListKeys(ctx, a.ID)
		if err != nil {
			return wrap("serve admin", err)
		}
		fmt.Fprintln(tw, "ID\tLABEL\tCREATED\tREVOKED")
		for _, k := range ks {
			rev := "-"
			if !k.RevokedAt.IsZero() {
				rev = k.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.ID, k.Label, k.CreatedAt.Format(time.RFC3339), rev)
		}
	case "key revoke":
		if len(args) != 3 {
			return usage
		}
		if err := st.RevokeKey(ctx, args[2], time.Now().UTC()); err != nil {
			return wrap("serve admin", err)
		}
	case "runner ls":
		if len(args) != 3 {
			return usage
		}
		a, err := account(args[2])
		if err != nil {
			return err
		}
		rs, err := st.ListRunners(ctx, a.ID)
		if err != nil {
			return wrap("serve admin", err)
		}
		fmt.Fprintln(tw, "NAME\tID\tHELD BY\tCREATED")
		for _, r := range rs {
			by := "its enrolment"
			if !r.Enrolled {
				by = "key " + r.KeyID
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.Name, r.ID, by, r.CreatedAt.Format(time.RFC3339))
		}
	case "runner rm":
		// Frees the name: its next claimant gets a new id, never the
		// sandboxes of this one.
		if len(args) != 4 {
			return usage
		}
		a, err := account(args[2])
		if err != nil {
			return err
		}
		if err := st.DeleteRunner(ctx, a.ID, args[3]); err != nil {
			return wrap("serve admin", err)
		}
	default:
		return usage
	}
	return nil
}

// isPlatform reports whether p is the platform client.
func isPlatform(p sandbox.Provider) bool { return p.Name() == client.Name }

// platformProviderOf is the provider a sandbox listed through the platform
// lives on ("" for any other provider), from its Get's raw body.
func platformProviderOf(p sandbox.Provider, raw []byte) string {
	if !isPlatform(p) {
		return ""
	}
	var r struct {
		Provider string `json:"provider"`
	}
	if json.Unmarshal(raw, &r) != nil {
		return ""
	}
	return r.Provider
}
