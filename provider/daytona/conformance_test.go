package daytona_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/daytona"
	"github.com/managoat/managoat/provider/daytona/daytonatest"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// fakeProvider starts a daytonatest server and a provider pointed at it,
// with fast polling.
func fakeProvider(t testing.TB, tweak func(*daytonatest.Server, *daytona.Config)) (*daytonatest.Server, *daytona.Provider) {
	t.Helper()
	srv, err := daytonatest.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	cfg := daytona.Config{APIKey: srv.APIKey, APIURL: srv.URL, HTTPClient: srv.Client(),
		PollMin: 10 * time.Millisecond, PollMax: 50 * time.Millisecond, Timeout: 10 * time.Second,
		Logger: slog.New(slog.DiscardHandler)}
	if tweak != nil {
		tweak(srv, &cfg)
	}
	p, err := daytona.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv, p
}

func fixtures() sandboxtest.Fixtures {
	fx := sandboxtest.ShellFixtures()
	// Kill the whole process group, shim included: the command never
	// reports an exit, and the shim's sentinel never appears.
	fx.SpawnDrop = sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo partial; kill -9 0"}}
	if (&daytonatest.Server{}).EnforcesEgress() {
		fx.Connect = sandboxtest.ShellConnect // the fake runs a closed sandbox's commands without a network
	}
	return fx
}

// hosted models the hosted service's runners, which enforce a domain
// allow-list (the conformance suite applies one).
func hosted(s *daytonatest.Server, c *daytona.Config) {
	s.EnforceDomains, c.DomainAllowListEnforced = true, true
}

func TestConformance(t *testing.T) {
	srv, p := fakeProvider(t, hosted)
	sandboxtest.Run(t, p, fixtures(), sandboxtest.WithDir(srv.Root()), sandboxtest.WithTimeout(10*time.Second))
}

// TestConformanceOlderDaemon runs the suite against the shapes of older
// daemons: exit codes in command records, JSON journals, a toolbox proxy
// URL that must be asked for, a /process/execute that splits its command
// on spaces without a shell, and the public daemon's /files/upload with no
// upload-v2 (Daemon0190); session commands under bash. TestConformance
// plays the current service (upload-v2).
func TestConformanceOlderDaemon(t *testing.T) {
	if testing.Short() {
		t.Skip("second full suite run")
	}
	srv, p := fakeProvider(t, func(s *daytonatest.Server, c *daytona.Config) {
		s.RecordExitCodes, s.LegacyLogs, s.ProxyURLInRecord, s.Shell, s.SplitExecute = true, true, false, "bash", true
		s.Generation = daytonatest.Daemon0190
		hosted(s, c)
	})
	fx := fixtures()
	// Under a recorded exit code a killed shim is still an unknown verdict
	// (the recording shell dies with it), so the drop fixture applies too.
	sandboxtest.Run(t, p, fx, sandboxtest.WithDir(srv.Root()), sandboxtest.WithTimeout(10*time.Second))
}
