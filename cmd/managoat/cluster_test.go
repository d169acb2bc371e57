package main

import (
	"bufio"
	"context"
	"io"
	"log"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/managoat/managoat/internal/pgtest"
	"github.com/managoat/managoat/internal/testenv"
)

// startServe runs `managoat serve --listen addr` with env until the test
// ends, and returns its log so far.
func startServe(t *testing.T, env []string, addr string) func() string {
	t.Helper()
	_, logs := startServeCmd(t, env, addr)
	return logs
}

// startServeCmd is startServe with extra flags, returning the process too
// (for a test that kills it).
func startServeCmd(t *testing.T, env []string, addr string, flags ...string) (*exec.Cmd, func() string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, binary, append([]string{"serve", "--listen", addr}, flags...)...)
	serve.Env = append(os.Environ(), env...)
	serve.Cancel = func() error { return serve.Process.Signal(os.Interrupt) }
	serve.WaitDelay = 10 * time.Second
	pr, err := serve.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serve.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs strings.Builder
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		for s := bufio.NewScanner(pr); s.Scan(); {
			mu.Lock()
			logs.WriteString(s.Text() + "\n")
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		_ = serve.Wait()
		<-logged
	})
	return serve, func() string {
		mu.Lock()
		defer mu.Unlock()
		return logs.String()
	}
}

// TestPlatformReplicas is issue 19 through the binary: two `managoat
// serve` replicas share their records in PostgreSQL and their runners
// over NATS. A runner connects to replica a; a client of replica b
// creates a runner sandbox and runs in it (the call travels to a over
// NATS); the client of replica a sees the same sandbox in its listing.
func TestPlatformReplicas(t *testing.T) {
	testenv.RequireRoot(t)
	pg := pgtest.Start(t)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	shared := []string{envDatabaseURL + "=" + pg.URL("postgres"), envNATSURL + "=" + ns.ClientURL(), envClusterKey + "=" + testClusterKey,
		"SANDBOX_LOCAL_ENABLED=false", "SANDBOX_PROVIDER=runner"}
	out, e, code := managoatEnv(t, append(shared, "MANAGOAT_HOME="+t.TempDir()), "serve", "admin", "account", "create", "acme")
	if code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	out, e, code = managoatEnv(t, append(shared, "MANAGOAT_HOME="+t.TempDir()), "serve", "admin", "key", "create", "acme")
	if code != 0 {
		t.Fatalf("key create: %d %q %s", code, out, e)
	}
	key := strings.TrimSpace(out)

	addrA, addrB := freeAddr(t), freeAddr(t)
	logA := startServe(t, append(shared, "MANAGOAT_HOME="+t.TempDir()), addrA)
	logB := startServe(t, append(shared, "MANAGOAT_HOME="+t.TempDir()), addrB)

	// The runner daemon dials replica a with the account's key.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rn := exec.CommandContext(ctx, binary, "runner", "--url", "http://"+addrA, "--name", "laptop")
	rn.Env = append(os.Environ(), "MANAGOAT_HOME="+t.TempDir(), envRunnerToken+"="+key)
	rn.Cancel = func() error { return rn.Process.Signal(os.Interrupt) }
	rn.WaitDelay = 10 * time.Second
	var rlog syncBuffer
	rn.Stderr = &rlog
	if err := rn.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = rn.Wait() }()

	as := func(addr string) []string {
		return []string{"MANAGOAT_HOME=" + t.TempDir(), envPlatformURL + "=http://" + addr, envAPIKey + "=" + key}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, e, code = managoatEnv(t, as(addrB), "create", "box")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create through replica b: %d %s\nreplica a:\n%s\nreplica b:\n%s\nrunner:\n%s", code, e, logA(), logB(), rlog.String())
		}
		time.Sleep(200 * time.Millisecond) // the replicas and the runner are starting
	}
	if out, e, code := managoatEnv(t, as(addrB), "exec", "box", "--", "sh", "-c", "echo across replicas; exit 3"); code != 3 || out != "across replicas\n" {
		t.Fatalf("exec through replica b: %d %q %s", code, out, e)
	}
	if out, e, code := managoatEnv(t, as(addrA), "ls"); code != 0 || !strings.Contains(out, "box") || !strings.Contains(out, "runner") {
		t.Fatalf("ls through replica a: %d %q %s", code, out, e)
	}
	if out, e, code := managoatEnv(t, as(addrA), "exec", "box", "--", "echo", "and back"); code != 0 || out != "and back\n" {
		t.Fatalf("exec through replica a: %d %q %s", code, out, e)
	}
	if _, e, code := managoatEnv(t, as(addrB), "rm", "box"); code != 0 {
		t.Fatalf("rm through replica b: %d %s", code, e)
	}
	if !strings.Contains(logA(), "PostgreSQL; runners shared over NATS") || !strings.Contains(logB(), "PostgreSQL; runners shared over NATS") {
		t.Fatalf("the replicas do not say they share: a: %s\nb: %s", logA(), logB())
	}
}

// TestPlatformReplicaDies is issue 19's dead replica through the binary:
// replica a (configured by flags, --database and --nats) holds the
// runner's socket, reached through a load balancer; a client of replica
// b (configured by the environment) starts a detached session there and
// follows it. Replica a is killed (SIGKILL: no orderly release of
// anything). The follower gets an error, not a hang; the runner
// reconnects through the balancer to replica b, which takes over a's
// claim; the session, attached again through b, is replayed from byte
// zero: every line exactly once, and its exit code.
func TestPlatformReplicaDies(t *testing.T) {
	testenv.RequireRoot(t)
	pg := pgtest.Start(t)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	common := []string{"SANDBOX_LOCAL_ENABLED=false", "SANDBOX_PROVIDER=runner"}
	byEnv := append([]string{envDatabaseURL + "=" + pg.URL("postgres"), envNATSURL + "=" + ns.ClientURL(), envClusterKey + "=" + testClusterKey}, common...)
	out, e, code := managoatEnv(t, append(byEnv, "MANAGOAT_HOME="+t.TempDir()), "serve", "admin", "account", "create", "acme")
	if code != 0 {
		t.Fatalf("account create: %d %q %s", code, out, e)
	}
	out, e, code = managoatEnv(t, append(byEnv, "MANAGOAT_HOME="+t.TempDir()), "serve", "admin", "key", "create", "acme")
	if code != 0 {
		t.Fatalf("key create: %d %q %s", code, out, e)
	}
	key := strings.TrimSpace(out)

	addrA, addrB := freeAddr(t), freeAddr(t)
	keyFile := filepath.Join(t.TempDir(), "cluster.key")
	if err := os.WriteFile(keyFile, []byte(testClusterKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serveA, logA := startServeCmd(t, append(common, envDatabaseURL+"=", envNATSURL+"=", envClusterKey+"=", "MANAGOAT_HOME="+t.TempDir()), addrA,
		"--database", pg.URL("postgres"), "--nats", ns.ClientURL(), "--cluster-key-file", keyFile)
	logB := startServe(t, append(byEnv, "MANAGOAT_HOME="+t.TempDir()), addrB)

	// The load balancer: each new connection goes to the replica chosen now.
	var target atomic.Value
	target.Store(addrA)
	lb := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(&url.URL{Scheme: "http", Host: target.Load().(string)})
		},
		ErrorLog: log.New(io.Discard, "", 0),
	})
	t.Cleanup(lb.Close)

	ctx, cancel := context.WithCancel(context.Background())
	rn := exec.CommandContext(ctx, binary, "runner", "--url", lb.URL, "--name", "laptop")
	rn.Env = append(os.Environ(), "MANAGOAT_HOME="+t.TempDir(), envRunnerToken+"="+key)
	rn.Cancel = func() error { return rn.Process.Signal(os.Interrupt) }
	rn.WaitDelay = 10 * time.Second
	var rlog syncBuffer
	rn.Stderr = &rlog
	if err := rn.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = rn.Wait() }()

	asB := []string{"MANAGOAT_HOME=" + t.TempDir(), envPlatformURL + "=http://" + addrB, envAPIKey + "=" + key}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, e, code = managoatEnv(t, asB, "create", "box")
		if code == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("create through replica b: %d %s\nreplica a:\n%s\nreplica b:\n%s\nrunner:\n%s", code, e, logA(), logB(), rlog.String())
		}
		time.Sleep(200 * time.Millisecond) // the replicas and the runner are starting
	}
	script := "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.5; done; exit 7"
	out, e, code = managoatEnv(t, asB, "spawn", "--detach", "box", "--", "sh", "-c", script)
	sid := strings.TrimSpace(out)
	if code != 0 || sid == "" {
		t.Fatalf("spawn --detach through b: %d %q %s", code, out, e)
	}

	// A follower through b, streaming from a over NATS when a dies.
	follow := exec.Command(binary, "attach", "--no-stdin", "box", sid)
	follow.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), asB...)
	pr, err := follow.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var ferr syncBuffer
	follow.Stderr = &ferr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}
	first, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil || first != "line 1\n" {
		t.Fatalf("the follower's first line: %q %v (%s)", first, err, ferr.String())
	}
	target.Store(addrB)
	_ = serveA.Process.Kill()
	fdone := make(chan error, 1)
	go func() { _, _ = io.Copy(io.Discard, pr); fdone <- follow.Wait() }()
	select {
	case err := <-fdone:
		if err == nil {
			t.Fatalf("the follower through b exited 0 though the replica relaying its session died (%s)", ferr.String())
		}
		t.Logf("the follower ended: %v: %s", err, strings.TrimSpace(ferr.String()))
	case <-time.After(30 * time.Second):
		_ = follow.Process.Kill()
		<-fdone
		t.Fatal("the follower through b hung after replica a died")
	}

	// Attached again through b once the runner is back (through b).
	deadline = time.Now().Add(60 * time.Second)
	for {
		out, e, code = managoatEnv(t, asB, "attach", "--no-stdin", "box", sid)
		if code == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("attach again through b: %d %q %s\nreplica b:\n%s\nrunner:\n%s", code, out, e, logB(), rlog.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	want := "line 1\nline 2\nline 3\nline 4\nline 5\nline 6\n"
	if out != want {
		t.Fatalf("the session attached again through b: %q, want every line exactly once %q", out, want)
	}
	if _, e, code := managoatEnv(t, asB, "rm", "box"); code != 0 {
		t.Fatalf("rm through replica b: %d %s", code, e)
	}
	if !strings.Contains(logA(), "PostgreSQL; runners shared over NATS") {
		t.Fatalf("replica a, configured by --database and --nats, does not say it shares: %s", logA())
	}
}
