package mcpserver_test

import (
	"context"
	"fmt"
	"os"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/managoat/managoat/mcpserver"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// A server over a local provider (trusted mechanism: no root needed),
// reached by the Go SDK's client in memory: create a sandbox, run a
// command in it, and end the session, which destroys the sandbox.
func Example() {
	state, _ := os.MkdirTemp("", "managoat-mcp-example-")
	defer os.RemoveAll(state)
	p, err := local.New(local.Config{StateDir: state, MechanismName: "trusted"})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, _ := mcpserver.New(mcpserver.Options{Backend: &mcpserver.Backend{Registry: sandbox.NewRegistry(p), Provider: local.Name}})
	ct, st := mcp.NewInMemoryTransports()
	ctx := context.Background()
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "example"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	res, _ := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_create", Arguments: map[string]any{}})
	name := res.StructuredContent.(map[string]any)["name"].(string)
	res, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: "run", Arguments: map[string]any{"sandbox": name, "shell": "echo hello"}})
	out := res.StructuredContent.(map[string]any)
	fmt.Printf("exit %v: %q\n", out["exit_code"], out["stdout"])
	cs.Close()
	<-done
	names, _ := p.ListAllNames(ctx)
	fmt.Println("left after the session:", len(names))
	// Output:
	// exit 0: "hello\n"
	// left after the session: 0
}
