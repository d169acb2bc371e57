package spritesdoor_test

import (
	"encoding/json"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/nodesdk"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkExecTrue: sprite.exec('true') (the exec WebSocket, a
// detachable spawn below) and execFileHTTP('true') through the Sprites
// SDK and the door, against exec of true through /v1 with the Go client,
// on the same platform in the same run; ratio is the SDK's WebSocket exec
// over the client's.
func BenchmarkExecTrue(b *testing.B) {
	sdk := nodesdk.Setup(b, SDK)
	url, key, p, _ := start(b)
	n := max(b.N, 20)
	res := sdk.Run(b, "testdata/bench.mjs", nodesdk.Options{Env: map[string]string{
		"SPRITES_URL": url, "SPRITES_TOKEN": key, "BENCH_N": strconv.Itoa(n), "NODE_OPTIONS": "--experimental-websocket",
	}, Timeout: 5 * time.Minute})
	var wsMS, httpMS float64
	for name, v := range map[string]*float64{"exec true": &wsMS, "execFileHTTP true": &httpMS} {
		c := res.Call(b, name)
		if !c.OK || json.Unmarshal(c.Raw, v) != nil {
			b.Fatalf("bench script %s: %s %s\n%s", name, c.Raw, c.Err(), res.Stderr)
		}
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
	if _, err := cl.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	t0 := time.Now()
	for range n {
		if _, err := cl.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	v1MS := float64(time.Since(t0).Microseconds()) / 1000 / float64(n)
	b.ReportMetric(wsMS, "sdk-ws-ms/exec")
	b.ReportMetric(httpMS, "sdk-http-ms/exec")
	b.ReportMetric(v1MS, "v1-ms/exec")
	b.ReportMetric(wsMS/v1MS, "ratio")
}
