package e2bdoor_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkRunTrue: commands.run('true') through E2B's SDK and the door
// against exec of what the SDK runs for it (/bin/bash -l -c true) through /v1 with the Go client, on the same
// platform in the same run; ratio is the SDK's time over the client's
// (target ≤ 1.3).
func BenchmarkRunTrue(b *testing.B) {
	sdk := nodesdk.Setup(b, "e2b@2.51.0")
	url, key, p := startB(b)
	n := max(b.N, 20)
	res := sdk.Run(b, "testdata/bench.mjs", nodesdk.Options{
		Env: map[string]string{"E2B_API_URL": url, "E2B_SANDBOX_URL": url, "E2B_API_KEY": key, "BENCH_N": strconv.Itoa(n)}, Timeout: 5 * time.Minute,
	})
	c := res.Call(b, "run true")
	var sdkMS float64
	if !c.OK || json.Unmarshal(c.Raw, &sdkMS) != nil {
		b.Fatalf("bench script: %s %s\n%s", c.Raw, c.Err(), res.Stderr)
	}
	cl, err := client.New(client.Options{URL: p.URL, APIKey: key})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx := b.Context()
	h, err := cl.Create(ctx, "bench-v1", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Destroy(ctx, h)
	if _, err := cl.Exec(ctx, h, sandbox.Cmd{Name: "/bin/bash", Args: []string{"-l", "-c", "true"}}, sandbox.ExecOptions{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	t0 := time.Now()
	for range n {
		if _, err := cl.Exec(ctx, h, sandbox.Cmd{Name: "/bin/bash", Args: []string{"-l", "-c", "true"}}, sandbox.ExecOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	v1MS := float64(time.Since(t0).Microseconds()) / 1000 / float64(n)
	// What the door itself does for a run: a spawn through /v1, until its exit.
	t0 = time.Now()
	for range n {
		cmd, err := cl.Spawn(ctx, h, sandbox.Cmd{Name: "/bin/bash", Args: []string{"-l", "-c", "true"}}, sandbox.SpawnOptions{Stdin: true})
		if err != nil {
			b.Fatal(err)
		}
		for range cmd.Events() {
		}
	}
	b.ReportMetric(float64(time.Since(t0).Microseconds())/1000/float64(n), "v1-spawn-ms")
	b.ReportMetric(sdkMS, "sdk-ms/run")
	b.ReportMetric(v1MS, "v1-ms/exec")
	b.ReportMetric(sdkMS/v1MS, "ratio")
}
