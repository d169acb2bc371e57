package runner_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/trusted"
	"github.com/managoat/managoat/provider/local"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// openMech opens the built-in mechanisms and trusted (which provider/local
// does not list among its built-ins yet).
func openMech(name, stateDir string) (mechanism.Mechanism, error) {
	if name == "trusted" {
		return trusted.New(filepath.Join(stateDir, "mech", "trusted"))
	}
	return local.OpenMechanism(name, stateDir)
}

func openLocal(mech, dir string) (*local.Provider, error) {
	m, err := openMech(mech, dir)
	if err != nil {
		return nil, err
	}
	return local.New(local.Config{StateDir: dir, Mechanism: m})
}

func newLocal(t testing.TB, mech, dir string) *local.Provider {
	t.Helper()
	p, err := openLocal(mech, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		names, _ := p.ListAllNames(ctx)
		for _, n := range names {
			_ = p.Destroy(ctx, sandbox.BuildHandle(local.Name, n))
		}
	})
	return p
}

// localOverWire starts a platform and a daemon that serves provider/local
// on mech to it, and returns the platform's provider and a namer of the
// runner's sandboxes.
func localOverWire(t *testing.T, mech string) (*prov.Provider, func() string) {
	t.Helper()
	pl := newPlatform(t, prov.ServerConfig{})
	startDaemon(t, pl.ts.URL, newLocal(t, mech, t.TempDir()), nil)
	return pl.srv.Provider(), namer(pl.online(t))
}

func conformLocal(t *testing.T, mech string, wrap func(*prov.Provider) sandbox.Provider, opts ...sandboxtest.Option) {
	pl := newPlatform(t, prov.ServerConfig{})
	p := newLocal(t, mech, t.TempDir())
	startDaemon(t, pl.ts.URL, p, nil)
	id := pl.online(t)
	var sp sandbox.Provider = pl.srv.Provider()
	if wrap != nil {
		sp = wrap(pl.srv.Provider())
	}
	fx := sandboxtest.ShellFixtures()
	fx.Connect = sandboxtest.ShellConnect // the jail's deny-all, through the wire
	sandboxtest.Run(t, sp, fx, append([]sandboxtest.Option{sandboxtest.WithNames(namer(id)),
		sandboxtest.WithTimeout(20 * time.Second)}, opts...)...)
}

// TestConformanceOverWireLocalTrusted: the suite through the platform, the
// wire and the daemon, with provider/local on mechanism/trusted behind it.
// Trusted paths are host paths, so the suite's working directory is /tmp.
// provider/local refuses to write outside the sandbox's home, even on
// trusted (Fountain's daemon's trusted mode wrote absolute host paths as given,
// spec §2.3), so the suite's one file write is redirected into the home:
// see TestTrustedSemanticsOverWire for that gap.
func TestConformanceOverWireLocalTrusted(t *testing.T) {
	conformLocal(t, "trusted", func(p *prov.Provider) sandbox.Provider { return homeWriter{p} })
}

type homeWriter struct{ *prov.Provider }

func (w homeWriter) WriteFile(ctx context.Context, h *sandbox.Handle, path string, data []byte, o sandbox.WriteFileOptions) error {
	if rest, ok := strings.CutPrefix(path, "/tmp/"); ok {
		path = "/home/sprite/" + rest
	}
	return w.Provider.WriteFile(ctx, h, path, data, o)
}

func (w homeWriter) ReadFile(ctx context.Context, h *sandbox.Handle, path string) ([]byte, error) {
	if rest, ok := strings.CutPrefix(path, "/tmp/"); ok {
		path = "/home/sprite/" + rest
	}
	return w.Provider.ReadFile(ctx, h, path)
}

// TestConformanceOverWireLocalJail: the same on the jail (root only).
func TestConformanceOverWireLocalJail(t *testing.T) {
	testenv.RequireRoot(t)
	if testing.Short() {
		t.Skip("the jail suite over the wire takes about a minute; run without -short")
	}
	conformLocal(t, "jail", nil, sandboxtest.WithDir("/home/sprite"))
}

// The daemon as a child process, so the test can kill -9 it mid-stream.
const (
	envDaemonURL   = "MANAGOAT_RUNNER_TEST_URL"
	envDaemonState = "MANAGOAT_RUNNER_TEST_STATE"
)

func daemonChild() bool {
	u := os.Getenv(envDaemonURL)
	if u == "" {
		return false
	}
	p, err := openLocal("trusted", os.Getenv(envDaemonState))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	err = runner.Run(ctx, runner.Config{URL: u, Token: token, Name: "child", Root: os.Getenv(envDaemonState), Provider: p,
		Logger: quiet, BackoffBase: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	return true
}

func startChildDaemon(t *testing.T, url, state string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envDaemonURL+"="+url, envDaemonState+"="+state)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd
}

// TestDaemonKilledMidStreamAttachReplaysEveryByte: a session streams; the
// daemon is killed with SIGKILL mid-stream and started again; list_sessions
// and attach through the platform replay every byte from zero, then the
// rest, then the real exit.
func TestDaemonKilledMidStreamAttachReplaysEveryByte(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	state := t.TempDir()
	t.Cleanup(func() { // the supervisors outlive the daemon: stop them
		p, err := openLocal("trusted", state)
		if err != nil {
			return
		}
		ctx := context.Background()
		names, _ := p.ListAllNames(ctx)
		for _, n := range names {
			_ = p.Destroy(ctx, sandbox.BuildHandle(local.Name, n))
		}
	})
	child := startChildDaemon(t, pl.ts.URL, state)
	id := pl.online(t)
	p := pl.srv.Provider()
	ctx := context.Background()
	h, err := p.Create(ctx, namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const lines = 3000
	script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo line-$i; i=$((i+1)); if [ $((i %% 100)) -eq 0 ]; then sleep 0.02; fi; done`, lines)
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var before strings.Builder
	for before.Len() < 2000 {
		ev := recv(t, c, 20*time.Second)
		if ev.Kind != sandbox.Stdout {
			t.Fatalf("before the kill: %+v", ev)
		}
		before.Write(ev.Data)
	}
	_ = child.Process.Signal(syscall.SIGKILL)
	_ = child.Wait()
	for ev := range c.Events() {
		if ev.Kind == sandbox.Exit {
			t.Fatal("an exit after the daemon died")
		}
		if ev.Kind == sandbox.Error && !isReason(ev.Err, prov.ReasonDisconnected) {
			t.Fatalf("want runner_disconnected, got %v", ev.Err)
		}
	}
	pl.offline(t)
	startChildDaemon(t, pl.ts.URL, state)
	if id2 := pl.online(t); id2 != id {
		t.Fatalf("runner id changed: %s → %s", id, id2)
	}
	ss, err := p.ListSessions(ctx, h)
	if err != nil || len(ss) != 1 || ss[0].ID != c.SessionID {
		t.Fatalf("sessions after restart: %+v, %v", ss, err)
	}
	a, err := p.Attach(ctx, h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop()
	var all strings.Builder
	code := -1
	for code < 0 {
		ev := recv(t, a, 30*time.Second)
		switch ev.Kind {
		case sandbox.Stdout:
			all.Write(ev.Data)
		case sandbox.Exit:
			code = ev.Code
		default:
			t.Fatalf("attach: %+v", ev)
		}
	}
	if !strings.HasPrefix(all.String(), before.String()) {
		t.Fatal("the replay does not start with the bytes seen before the kill")
	}
	sc := bufio.NewScanner(strings.NewReader(all.String()))
	n := 0
	for sc.Scan() {
		if sc.Text() != fmt.Sprintf("line-%d", n) {
			t.Fatalf("line %d is %q", n, sc.Text())
		}
		n++
	}
	if n != lines || code != 0 {
		t.Fatalf("%d lines, exit %d; want %d lines, exit 0", n, code, lines)
	}
}

// TestJailIsolatedOverWire: through the wire, a jailed sandbox does not see
// the host's files, and an empty allowlist is enforced when the runner
// advertises network_policy.
func TestJailIsolatedOverWire(t *testing.T) {
	testenv.RequireRoot(t)
	rp, name := localOverWire(t, "jail")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(secret, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := rp.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "cat " + secret}}, sandbox.ExecOptions{})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("a jailed command read a host file: %+v %v", res, err)
	}
	// A runner whose sandboxes are jails reports network_policy (its
	// provider/local enforces allow lists through the jail's egress
	// proxy), and allow: [] denies all: nothing leaves the sandbox.
	caps, err := rp.CapabilitiesOf(ctx, h)
	if err != nil || !caps.Has(sandbox.CapNetworkPolicy) {
		t.Fatalf("capabilities of a jail sandbox over the wire = %v, %v; want network_policy", caps, err)
	}
	if err := rp.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}}); err != nil {
		t.Fatal(err)
	}
	err = rp.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"not a domain"}})
	if err == nil || !strings.Contains(err.Error(), "not a domain") {
		t.Fatalf("a bad entry over the wire = %v, want it refused naming it", err)
	}
	if err := rp.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatal(err)
	}
	res, err = rp.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "exec 3<>/dev/tcp/1.1.1.1/80 && echo reached"}}, sandbox.ExecOptions{})
	if err == nil && strings.Contains(string(res.Output), "reached") {
		t.Fatal("egress reached the network under allow: []")
	}
}

// drain reads c to its end and returns its stdout and exit code (-1 for a
// terminal error).
func drain(t *testing.T, c *sandbox.Command) (string, int) {
	t.Helper()
	var out strings.Builder
	for {
		ev := recv(t, c, 30*time.Second)
		switch {
		case ev.Kind == sandbox.Stdout:
			out.Write(ev.Data)
		case ev.Kind == sandbox.Exit:
			return out.String(), ev.Code
		case ev.Kind == sandbox.Error:
			t.Logf("error event: %v", ev.Err)
			return out.String(), -1
		}
	}
}

// TestSessionsStayInTheirSandbox: two sandboxes on one runner number
// their sessions alike (s1 in each, on provider/local); their sessions run
// at once, with distinct output and stdin, and neither output, nor stdin,
// nor an attach, nor a fresh sandbox's spawn, nor a termination reaches
// the other's.
func TestSessionsStayInTheirSandbox(t *testing.T) {
	rp, name := localOverWire(t, "trusted")
	ctx := context.Background()
	a, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ca, err := rp.Spawn(ctx, a, sandbox.Cmd{Name: "sh", Args: []string{"-c", "for i in 1 2 3 4 5 6; do echo A $i; sleep 0.1; done"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	cb, err := rp.Spawn(ctx, b, sandbox.Cmd{Name: "sh", Args: []string{"-c", "read x; echo B got $x"}}, sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if ca.SessionID == cb.SessionID {
		t.Fatalf("both sandboxes' sessions are %q on the wire", ca.SessionID)
	}
	// A's session cannot be reached through B's name, whatever its id.
	if _, err := rp.Attach(ctx, b, ca.SessionID, sandbox.AttachOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("attach of A's session %s through B: %v, want not found", ca.SessionID, err)
	}
	if err := cb.WriteStdin(ctx, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	outB, codeB := drain(t, cb)
	outA, codeA := drain(t, ca)
	if outB != "B got hello\n" || codeB != 0 {
		t.Errorf("B's session: %q exit %d", outB, codeB)
	}
	if outA != "A 1\nA 2\nA 3\nA 4\nA 5\nA 6\n" || codeA != 0 {
		t.Errorf("A's session: %q exit %d", outA, codeA)
	}
	// Attach by the id the provider gave (s1 in each sandbox) replays the
	// session of the sandbox named.
	for _, c := range []struct {
		h    *sandbox.Handle
		want string
	}{{a, outA}, {b, outB}} {
		ss, err := rp.ListSessions(ctx, c.h)
		if err != nil || len(ss) != 1 {
			t.Fatalf("sessions of %s: %+v %v", c.h.Name, ss, err)
		}
		for _, sid := range []string{ss[0].ID, "s1"} {
			at, err := rp.Attach(ctx, c.h, sid, sandbox.AttachOptions{})
			if err != nil {
				t.Fatalf("attach %s in %s: %v", sid, c.h.Name, err)
			}
			if out, code := drain(t, at); out != c.want || code != 0 {
				t.Errorf("attach %s in %s: %q exit %d, want %q", sid, c.h.Name, out, code, c.want)
			}
		}
	}
	// A fresh sandbox's first session is its own, not an old s1.
	cfresh, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cc, err := rp.Spawn(ctx, cfresh, sandbox.Cmd{Name: "echo", Args: []string{"C"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if out, code := drain(t, cc); out != "C\n" || code != 0 {
		t.Errorf("a fresh sandbox's spawn: %q exit %d", out, code)
	}
	// Exec in B while A runs prints B's own output.
	ca2, err := rp.Spawn(ctx, a, sandbox.Cmd{Name: "sh", Args: []string{"-c", "for i in 1 2 3; do echo A $i; sleep 0.2; done"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rp.Exec(ctx, b, sandbox.Cmd{Name: "echo", Args: []string{"B"}}, sandbox.ExecOptions{})
	if err != nil || string(res.Output) != "B\n" {
		t.Errorf("exec in B: %+v %v", res, err)
	}
	// Terminating B's s2 (its exec made none on this path: take s1, ended)
	// never ends A's running session.
	_ = rp.TerminateSession(ctx, b, "s2", sandbox.TerminateOptions{Mode: sandbox.Force})
	if out, code := drain(t, ca2); out != "A 1\nA 2\nA 3\n" || code != 0 {
		t.Errorf("A's second session: %q exit %d", out, code)
	}
}

// TestLimitsOverWire: a create's limits reach the runner's provider and
// hold in the sandbox (a pids cap of 8 stops the 30th fork); a runner
// that did not report create_limits (Fountain's daemon, which would
// drop them) gets no create at all: ErrNotSupported.
func TestLimitsOverWire(t *testing.T) {
	testenv.RequireRoot(t)
	rp, name := localOverWire(t, "jail")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{Limits: sandbox.Limits{Pids: 8, MemoryBytes: 256 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	script := "import os, time\nn = 0\nfor i in range(30):\n    try:\n        if os.fork() == 0:\n            time.sleep(3)\n            os._exit(0)\n        n += 1\n    except OSError:\n        pass\nprint('forked', n)\n"
	res, err := rp.Exec(ctx, h, sandbox.Cmd{Name: "python3", Args: []string{"-c", script}}, sandbox.ExecOptions{Timeout: 30 * time.Second})
	t.Logf("30 forks under pids 8: %q %v", res.Output, err)
	if err == nil && strings.Contains(string(res.Output), "forked 30") {
		t.Fatalf("the pids limit did not hold over the wire: %q", res.Output)
	}
	if _, err := rp.Create(ctx, name(), sandbox.CreateOptions{Limits: sandbox.Limits{Pids: -1}}); err == nil {
		t.Fatal("a negative limit was accepted")
	}
	// A disk limit travels too (disk_bytes, to a daemon that reports
	// create_disk_limit) and bounds the home.
	d, err := rp.Create(ctx, name(), sandbox.CreateOptions{Limits: sandbox.Limits{DiskBytes: 16 << 20}})
	if err != nil {
		t.Fatal(err)
	}
	res, err = rp.Exec(ctx, d, sandbox.Cmd{Name: "sh", Args: []string{"-c", `dd if=/dev/zero of="$HOME/f" bs=1M count=32 2>&1; echo rc=$?`}}, sandbox.ExecOptions{Timeout: time.Minute})
	if err != nil || !strings.Contains(string(res.Output), "No space left") || strings.Contains(string(res.Output), "rc=0") {
		t.Fatalf("32 MiB into a 16 MiB home over the wire: %q %v", res.Output, err)
	}
}

func TestLimitsRefusedByARunnerWithoutThem(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "old") // reports no caps, as Fountain's daemon
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	done := make(chan error, 1)
	go func() {
		_, err := pl.srv.Provider().Create(context.Background(), namer(id)(), sandbox.CreateOptions{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, sandbox.ErrNotSupported) {
			t.Fatalf("create with limits on a runner without create_limits: %v, want not supported", err)
		}
	case <-time.After(10 * time.Second):
		req := rd.next()
		t.Fatalf("the platform sent %+v to a runner without create_limits", req)
	}
}

// TestLargeExecOverWire: an exec whose output is far past a frame's limit
// comes back cut to wire.MaxExecOutput and says so, and the connection,
// with a session running on it, carries on (a 60 MB reply closed it).
func TestLargeExecOverWire(t *testing.T) {
	rp, name := localOverWire(t, "trusted")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := rp.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "read x; echo still $x"}}, sandbox.SpawnOptions{Stdin: true, Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	res, err := rp.Exec(ctx, h, sandbox.Cmd{Name: "head", Args: []string{"-c", "70000000", "/dev/zero"}}, sandbox.ExecOptions{Timeout: 5 * time.Minute}) // a loaded machine under -race takes a while
	if err != nil {
		t.Fatalf("a 70 MB exec: %v", err)
	}
	if len(res.Output) != wire.MaxExecOutput || !res.Truncated || res.ExitCode != 0 {
		t.Fatalf("a 70 MB exec: %d bytes, truncated %v, exit %d", len(res.Output), res.Truncated, res.ExitCode)
	}
	res, err = rp.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"small"}}, sandbox.ExecOptions{MaxOutput: 3})
	if err != nil || string(res.Output) != "sma" || !res.Truncated {
		t.Fatalf("an exec capped at 3 bytes: %+v %v", res, err)
	}
	if err := c.WriteStdin(ctx, []byte("here\n")); err != nil {
		t.Fatal(err)
	}
	if out, code := drain(t, c); out != "still here\n" || code != 0 {
		t.Fatalf("the session beside the large exec: %q exit %d", out, code)
	}
}

// TestLargeWriteFileOverWire: a file too large for one frame is refused
// as such before anything is sent, and the connection carries on.
func TestLargeWriteFileOverWire(t *testing.T) {
	rp, name := localOverWire(t, "trusted")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var inv *sandbox.InvalidError
	err = rp.WriteFile(ctx, h, "/home/sprite/big", make([]byte, 60<<20), sandbox.WriteFileOptions{})
	if !errors.As(err, &inv) || inv.Reason != "file_too_large" {
		t.Fatalf("a 60 MB write: %v, want invalid file_too_large", err)
	}
	if err := rp.WriteFile(ctx, h, "/home/sprite/ok", []byte("fine"), sandbox.WriteFileOptions{}); err != nil {
		t.Fatalf("a small write after it: %v", err)
	}
}

// TestReadFileOverWire: the runner provider reads a sandbox's file
// through the daemon (read_file), byte for byte; a missing one is
// not_found, a path outside the home invalid.
func TestReadFileOverWire(t *testing.T) {
	rp, name := localOverWire(t, "trusted")
	ctx := context.Background()
	h, err := rp.Create(ctx, name(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	data := []byte("read\x00\xffback\n")
	if err := rp.WriteFile(ctx, h, "/home/sprite/d/f", data, sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := rp.ReadFile(ctx, h, "/home/sprite/d/f"); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadFile = %q, %v; want %q", got, err, data)
	}
	if _, err := rp.ReadFile(ctx, h, "/home/sprite/none"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("ReadFile of a missing file = %v, want not found", err)
	}
	var inv *sandbox.InvalidError
	if _, err := rp.ReadFile(ctx, h, "/etc/passwd"); !errors.As(err, &inv) {
		t.Fatalf("ReadFile outside the home = %v, want invalid", err)
	}
}

// TestExtensionsCheckedOnTheCarryingConnection: a request with limits, a
// policy or a forced termination that reaches a connection whose daemon
// did not report taking them (the provider looked at another daemon
// under the same id, which then reconnected as Fountain's daemon) is
// refused there, and nothing of it is sent: the daemon's first request
// is the plain one made after.
func TestExtensionsCheckedOnTheCarryingConnection(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "old") // reports no caps, as Fountain's daemon
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	allow := []string{}
	for _, req := range []*wire.Request{
		{Op: wire.OpCreate, Name: namer(id)(), Limits: &wire.Limits{Pids: 8}},
		{Op: wire.OpCreate, Name: namer(id)(), Limits: &wire.Limits{DiskBytes: 1 << 30}},
		{Op: wire.OpNetworkPolicy, Name: namer(id)(), Allow: &allow},
		{Op: wire.OpTerminateSession, Name: namer(id)(), SessionID: "s1", Force: true},
	} {
		if _, err := pl.srv.Call(ctx, id, req, nil); !errors.Is(err, sandbox.ErrNotSupported) {
			t.Errorf("%s with an extension the daemon lacks: %v, want not supported", req.Op, err)
		}
	}
	go func() { _, _ = pl.srv.Call(ctx, id, &wire.Request{Op: wire.OpGet, Name: namer(id)()}, nil) }()
	if req := rd.next(); req.Op != wire.OpGet || req.Limits != nil || req.Allow != nil || req.Force {
		t.Fatalf("the daemon's first request is %+v, want the plain get", req)
	}
}
