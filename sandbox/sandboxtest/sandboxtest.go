// Package sandboxtest is the conformance suite for sandbox.Provider
// implementations, a test kit a user calls from their own tests the way
// testing/fstest.TestFS is called:
//
//	func TestConformance(t *testing.T) {
//		sandboxtest.Run(t, myprovider.New(cfg), sandboxtest.ShellFixtures())
//	}
//
// It holds every case of the Elixir library's suite (tests 1–20), the contract-level
// cases the Elixir library kept outside it, and the gaps it left: output strictly
// before the terminal event, stderr events, the exec timeout, env and
// working-directory options, stdin on a stopped command, destroy_once,
// create_checkpoint_once and checkpoints when advertised, force termination,
// capabilities that agree with the optional interfaces, concurrent
// create_new, and bad input that must be Invalid without a panic. Where the
// original's cases asked only for no error, these observe the outcome:
// deny-all is a connection from the sandbox that never arrives
// (Fixtures.Connect), an adopting Create keeps the first sandbox's file or
// session, a suspended sandbox reads suspended, a missing one is
// ErrNotFound. TestWrongAdaptersFail runs the suite against adapters wrong
// in each of these ways and sees each fail.
//
// Each case is a named subtest, so `go test -run 'Conformance/Streaming/StdinRoundTrip'`
// selects one. A case gated by a capability the provider does not advertise
// is skipped, with the capability's name in the reason; a skip is not a pass.
// Cases run serially. Every sandbox a case creates is destroyed when the
// case ends, and every command is stopped.
package sandboxtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/managoat/managoat/sandbox"
)

// Fixtures are provider-appropriate commands.
type Fixtures struct {
	// ExecOK exits 0 with stdout containing ExecOKWant.
	ExecOK     sandbox.Cmd
	ExecOKWant string
	// ExecFail exits with ExecFailCode, which is not 0.
	ExecFail     sandbox.Cmd
	ExecFailCode int
	// SpawnOK emits some stdout, then exits 0.
	SpawnOK sandbox.Cmd
	// SpawnDrop (optional) emits stdout, then its transport closes without
	// an exit. Leave Name empty when the provider cannot stage that.
	SpawnDrop sandbox.Cmd
	// SpawnStay emits a first stdout chunk, then echoes stdin to stdout
	// until EOF, then exits 0.
	SpawnStay sandbox.Cmd
	// Stderr writes StderrWant to stderr (and nothing of it to stdout) and
	// exits 0.
	Stderr     sandbox.Cmd
	StderrWant string
	// EnvDir prints the value of $MANAGOAT_CONFORMANCE, then the working
	// directory. The suite runs it with that variable set and Dir set.
	EnvDir sandbox.Cmd
	// Slow runs for at least 5 s, printing output every ~100 ms.
	Slow sandbox.Cmd
	// Connect, for a provider that advertises network_policy, is a command
	// that opens a TCP connection to addr ("host:port", an address of the
	// test's host) and exits 0 once connected, non-zero when the
	// connection is refused or has not been made within 5 s. The suite
	// observes deny-all with it: under an empty allow list the connection
	// is never made. Unset, that case checks only that the policies are
	// accepted, then is skipped (deny-all not observed; a skip is not a
	// pass).
	Connect func(addr string) sandbox.Cmd
}

// ShellFixtures returns fixtures for a provider whose sandboxes have a
// POSIX sh.
func ShellFixtures() Fixtures {
	sh := func(script string) sandbox.Cmd { return sandbox.Cmd{Name: "sh", Args: []string{"-c", script}} }
	return Fixtures{
		ExecOK: sh("echo hello"), ExecOKWant: "hello",
		ExecFail: sh("echo oops; exit 3"), ExecFailCode: 3,
		SpawnOK:   sh("echo hello"),
		SpawnStay: sh("echo ready; exec cat"),
		Stderr:    sh("echo to-stderr >&2"), StderrWant: "to-stderr",
		EnvDir: sh(`echo "$MANAGOAT_CONFORMANCE"; pwd`),
		Slow:   sh("i=0; while [ $i -lt 100 ]; do echo tick; sleep 0.1; i=$((i+1)); done"),
	}
}

// ShellConnect is a Fixtures.Connect for a sandbox with bash and
// timeout(1): bash's /dev/tcp, given 5 s. ShellFixtures leaves Connect
// unset: an adapter sets it once its sandboxes (or its test double of the
// provider's API) enforce a network policy on the commands they run.
func ShellConnect(addr string) sandbox.Cmd {
	host, port, _ := strings.Cut(addr, ":")
	return sandbox.Cmd{Name: "sh", Args: []string{"-c", fmt.Sprintf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%s' && echo connected", host, port)}}
}

// Option configures Run.
type Option func(*config)

type config struct {
	timeout   time.Duration
	spawnOpts sandbox.SpawnOptions
	names     func() string
	dir       string
	writeDir  string
	// selfParking: WithSelfParking.
	selfParking bool
}

// WithSelfParking says the provider's sandboxes park by themselves and
// its Suspend is a documented no-op (Sprites scales to zero on its own):
// SuspendResumeAreTotal then does not ask Get for the suspended status
// after Suspend. Without it a provider advertising suspend must show it.
func WithSelfParking() Option { return func(c *config) { c.selfParking = true } }

// WithTimeout sets the wait for each expected event (default 10 s).
func WithTimeout(d time.Duration) Option { return func(c *config) { c.timeout = d } }

// WithSpawnOptions merges o into every spawn the suite makes (Stdin is set
// by each case). Attach does not get them.
func WithSpawnOptions(o sandbox.SpawnOptions) Option { return func(c *config) { c.spawnOpts = o } }

// WithNames sets the function that mints sandbox names.
func WithNames(f func() string) Option { return func(c *config) { c.names = f } }

// WithDir sets the working directory the EnvDir case asks for (default
// /tmp), and the directory the WriteFile case writes into unless
// WithWriteDir says otherwise.
func WithDir(dir string) Option { return func(c *config) { c.dir = dir } }

// WithWriteDir sets the directory the WriteFile case writes into (default:
// the WithDir directory).
func WithWriteDir(dir string) Option { return func(c *config) { c.writeDir = dir } }

// suite is the state shared by the cases of one Run.
type suite struct {
	p   sandbox.Provider
	reg *sandbox.Registry
	fx  Fixtures
	cfg config
}

var runSeq atomic.Int64

func defaultNames() func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	prefix := "conformance-" + hex.EncodeToString(b[:])
	return func() string { return fmt.Sprintf("%s-%d", prefix, runSeq.Add(1)) }
}

// Run runs the conformance suite against p.
func Run(t *testing.T, p sandbox.Provider, fx Fixtures, opts ...Option) {
	t.Helper()
	cfg := config{timeout: 10 * time.Second, dir: "/tmp"}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.writeDir == "" {
		cfg.writeDir = cfg.dir
	}
	if cfg.names == nil {
		cfg.names = defaultNames()
	}
	s := &suite{p: p, reg: sandbox.NewRegistry(p), fx: fx, cfg: cfg}
	t.Run("Identity", s.identity)
	t.Run("Lifecycle", s.lifecycle)
	t.Run("Exec", s.exec)
	t.Run("Streaming", s.streaming)
	t.Run("Sessions", s.sessions)
	t.Run("Termination", s.termination)
	t.Run("Governance", s.governance)
}

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.cfg.timeout+30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (s *suite) has(c sandbox.Capability) bool { return s.p.Capabilities().Has(c) }

func (s *suite) require(t *testing.T, c sandbox.Capability) {
	t.Helper()
	if !s.has(c) {
		t.Skipf("capability %q not advertised", c)
	}
}

// created mints a name, creates it and destroys it when t ends.
func (s *suite) created(t *testing.T) *sandbox.Handle {
	t.Helper()
	name := s.cfg.names()
	h, err := s.reg.Create(s.ctx(t), s.p.Name(), name, sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("Create(%q): %v", name, err)
	}
	s.cleanupDestroy(t, h)
	return h
}

func (s *suite) cleanupDestroy(t *testing.T, h *sandbox.Handle) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.timeout+30*time.Second)
		defer cancel()
		if err := s.reg.Destroy(ctx, h); err != nil {
			t.Errorf("cleanup Destroy(%v): %v", h, err)
		}
	})
}

func (s *suite) spawn(t *testing.T, h *sandbox.Handle, c sandbox.Cmd, stdin bool) *sandbox.Command {
	t.Helper()
	o := s.cfg.spawnOpts
	o.Stdin = stdin
	cmd, err := s.reg.Spawn(s.ctx(t), h, c, o)
	if err != nil {
		t.Fatalf("Spawn(%v): %v", c, err)
	}
	if cmd.Ref == "" || cmd.Provider != s.p.Name() {
		t.Fatalf("Spawn returned command %v: want a non-empty Ref and Provider %q", cmd, s.p.Name())
	}
	t.Cleanup(func() { _ = cmd.Stop() })
	return cmd
}
