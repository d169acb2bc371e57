// Package apitest starts a platform (the /v1 API, the runner relay and an
// embedded SQLite store) on a loopback httptest server, for tests of the
// API, of its client and of what is built on them:
//
//	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": fake.New()}})
//	key := pl.Account(t, "alice")
package apitest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
)

// Options configure Start.
type Options struct {
	// Providers are enabled besides the runner provider (which is on).
	Providers map[string]sandbox.Provider
	// Env is the policy's environment (SANDBOX_PROVIDER, ...).
	Env map[string]string
	// Store, when set, is used instead of a fresh SQLite file.
	Store store.Store
	// Configure, when set, changes the API's configuration before New.
	Configure func(*api.Config)
	// RunnerAuth, when set, changes how the relay authenticates runners
	// (a Fallback of enrolments, MaxRunners) before it starts.
	RunnerAuth func(*api.RunnerAuth)
}

// Platform is a running platform.
type Platform struct {
	URL   string
	Store store.Store
	API   *api.Server
	Relay *runnerprov.Server
	TS    *httptest.Server
}

// Start starts a platform that ends with t.
func Start(t testing.TB, o Options) *Platform {
	t.Helper()
	st := o.Store
	if st == nil {
		s, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "platform.db"))
		if err != nil {
			t.Fatal(err)
		}
		st = s
		t.Cleanup(func() { _ = s.Close() })
	}
	var extra []string
	for name := range o.Providers {
		if name != policy.Local && name != policy.Sprites && name != policy.E2B && name != policy.Daytona {
			extra = append(extra, name)
		}
	}
	lookup := func(k string) (string, bool) { v, ok := o.Env[k]; return v, ok }
	probe := func() error { return nil }
	if _, ok := o.Providers[policy.Local]; !ok {
		probe = nil
	}
	pol, err := policy.FromEnv(lookup, policy.Options{LocalProbe: probe, Extra: extra})
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	auth := api.RunnerAuth{Store: st}
	if o.RunnerAuth != nil {
		o.RunnerAuth(&auth)
	}
	relay := runnerprov.NewServer(runnerprov.ServerConfig{Auth: auth, RunnerAuth: auth, Host: runnerprov.NewLocalHost(), Logger: quiet, Disabled: !pol.Enabled(policy.Runner)})
	cfg := api.Config{Store: st, Policy: pol, Providers: o.Providers, Runners: relay, Logger: quiet}
	if o.Configure != nil {
		o.Configure(&cfg)
	}
	srv, err := api.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", srv)
	mux.Handle("/api/runners", relay)
	mux.Handle("/api/runners/", relay)
	ts := httptest.NewServer(srv.WithPreviews(mux))
	t.Cleanup(func() {
		srv.Close()
		relay.Close()
		ts.Close()
	})
	return &Platform{URL: ts.URL, Store: st, API: srv, Relay: relay, TS: ts}
}

// Account creates an account (or takes the existing one) and returns a new
// API key of it.
func (p *Platform) Account(t testing.TB, name string) string {
	t.Helper()
	ctx := context.Background()
	a, err := p.Store.AccountByName(ctx, name)
	if err != nil {
		if a, err = p.Store.CreateAccount(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	key, err := api.NewKey(ctx, p.Store, a.ID, "test")
	if err != nil {
		t.Fatal(err)
	}
	return key
}
