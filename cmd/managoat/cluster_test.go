package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
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
	ctx, cancel := context.WithCancel(context.Background())
	serve := exec.CommandContext(ctx, binary, "serve", "--listen", addr)
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
	return func() string {
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

	shared := []string{envDatabaseURL + "=" + pg.URL("postgres"), envNATSURL + "=" + ns.ClientURL(),
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
