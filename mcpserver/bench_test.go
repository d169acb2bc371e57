package mcpserver_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/mcpserver"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkRunTrue runs `true` in one local (jail) sandbox through the
// MCP run tool (the Go SDK's client over an in-memory transport, JSON-RPC
// both ways) and, alternately in the same loop, through the registry's
// Spawn as `managoat exec` does: mcp/exec is the ratio of the medians
// (target ≤ 1.5).
func BenchmarkRunTrue(b *testing.B) {
	_, be := localBackend(b)
	srv, _ := mcpserver.New(mcpserver.Options{Backend: be})
	cs, _ := connect(b, srv, nil)
	var sb mcpserver.SandboxOutput
	call(b, cs, mcpserver.ToolCreate, map[string]any{}, &sb)
	h := sandbox.BuildHandle("local", sb.Name)
	ctx := context.Background()
	direct := func() {
		cmd, err := be.Registry.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for range cmd.Events() {
		}
	}
	viaMCP := func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: mcpserver.ToolRun, Arguments: map[string]any{"sandbox": sb.Name, "argv": []string{"true"}}})
		if err != nil || res.IsError {
			b.Fatal(err, text(res))
		}
	}
	direct()
	viaMCP()
	var d, m []time.Duration
	for b.Loop() {
		t0 := time.Now()
		direct()
		t1 := time.Now()
		viaMCP()
		d, m = append(d, t1.Sub(t0)), append(m, time.Since(t1))
	}
	med := func(x []time.Duration) time.Duration { slices.Sort(x); return x[len(x)/2] }
	md, mm := med(d), med(m)
	b.ReportMetric(float64(md.Microseconds()), "exec-us")
	b.ReportMetric(float64(mm.Microseconds()), "mcp-us")
	b.ReportMetric(float64(mm)/float64(md), "mcp/exec")
}
