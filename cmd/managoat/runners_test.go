package main

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
)

// TestRunnersFleet: one `managoat serve` and three `managoat runner`
// daemons (the jail, each with its own root, labels and
// reported memory) through the binary: creates spread over the three,
// --runner-selector picks by label, a create that fits nowhere is refused
// naming the memory left, cordon stops placements on a runner and drain
// parks its sandbox, uncordon lets it take sandboxes again.
func TestRunnersFleet(t *testing.T) {
	testenv.RequireRoot(t) // the jail applies the memory limits
	home := t.TempDir()
	base := []string{"MANAGOAT_HOME=" + home, "SANDBOX_PROVIDER=runner"}
	if _, e, code := managoatEnv(t, base, "serve", "admin", "account", "create", "acme"); code != 0 {
		t.Fatalf("account create: %s", e)
	}
	out, e, code := managoatEnv(t, base, "serve", "admin", "key", "create", "acme")
	if code != 0 {
		t.Fatalf("key create: %s", e)
	}
	key := strings.TrimSpace(out)
	addr := freeAddr(t)
	logs := startServe(t, base, addr)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, r := range []struct{ name, labels, mem string }{{"eu1", "zone=eu", "2G"}, {"eu2", "zone=eu,gpu=h100", "2G"}, {"us1", "zone=us", "2G"}} {
		args := []string{"--mechanism", "jail", "runner", "--url", "http://" + addr, "--name", r.name, "--root", t.TempDir(), "--capacity-memory", r.mem}
		for _, l := range strings.Split(r.labels, ",") {
			args = append(args, "--label", l)
		}
		rn := exec.CommandContext(ctx, binary, args...)
		rn.Env = append(os.Environ(), "MANAGOAT_HOME="+t.TempDir(), envRunnerToken+"="+key)
		rn.Cancel = func() error { return rn.Process.Signal(os.Interrupt) }
		rn.WaitDelay = 10 * time.Second
		if err := rn.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cancel(); _ = rn.Wait() })
	}
	cli := []string{"MANAGOAT_HOME=" + t.TempDir(), envPlatformURL + "=http://" + addr, envAPIKey + "=" + key}
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, _, _ := managoatEnv(t, cli, "runners")
		if strings.Count(out, " online") == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runners: %s\nserve:\n%s", out, logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
	runnersJSON := func() string {
		out, e, code := managoatEnv(t, cli, "runners", "--json")
		if code != 0 {
			t.Fatalf("runners --json: %s", e)
		}
		return out
	}
	for _, n := range []string{"a", "b", "c"} {
		if _, e, code := managoatEnv(t, cli, "--provider", "platform:runner", "create", "--memory", "512M", n); code != 0 {
			t.Fatalf("create %s: %s", n, e)
		}
	}
	if out := runnersJSON(); strings.Count(out, `"sandboxes":1}`) != 3 {
		t.Fatalf("three creates not spread one per runner: %s", out)
	}
	if _, e, code := managoatEnv(t, cli, "--provider", "platform:runner", "create", "--runner-selector", "gpu=h100", "--memory", "1G", "g"); code != 0 {
		t.Fatalf("create --runner-selector gpu=h100: %s", e)
	}
	if out, _, _ := managoatEnv(t, cli, "runners"); !strings.Contains(out, "eu2") || !strings.Contains(out, "1.5G mem") {
		t.Fatalf("eu2 does not hold g: %s", out)
	}
	if _, e, code := managoatEnv(t, cli, "--provider", "platform:runner", "create", "--runner-selector", "gpu", "--memory", "1G", "g2"); code == 0 ||
		!strings.Contains(e, "resource_exhausted") || !strings.Contains(e, "eu2: memory: 1.0 GiB asked, 512.0 MiB left of 2.0 GiB") {
		t.Fatalf("1G more on eu2: %d %s", code, e)
	}
	if out, e, code := managoatEnv(t, cli, "runners", "cordon", "us1"); code != 0 || !strings.Contains(out, "runner/us1 cordoned") {
		t.Fatalf("cordon: %s %s", out, e)
	}
	if _, e, code := managoatEnv(t, cli, "--provider", "platform:runner", "create", "--runner-selector", "zone=us", "u"); code == 0 || !strings.Contains(e, "us1: cordoned") {
		t.Fatalf("create on a cordoned runner: %d %s", code, e)
	}
	if out, e, code := managoatEnv(t, cli, "runners", "drain", "us1", "--timeout", "60s"); code != 0 || !strings.Contains(out, "runner/us1 drained") {
		t.Fatalf("drain: %s %s", out, e)
	}
	if out, _, _ := managoatEnv(t, cli, "runners"); !strings.Contains(out, "online,draining") {
		t.Fatalf("runners after drain: %s", out)
	}
	if _, e, code := managoatEnv(t, cli, "runners", "uncordon", "us1"); code != 0 {
		t.Fatalf("uncordon: %s", e)
	}
	if _, e, code := managoatEnv(t, cli, "--provider", "platform:runner", "create", "--runner-selector", "zone=us", "u"); code != 0 {
		t.Fatalf("create after uncordon: %s", e)
	}
	for _, n := range []string{"a", "b", "c", "g", "u"} {
		managoatEnv(t, cli, "rm", n)
	}
}
