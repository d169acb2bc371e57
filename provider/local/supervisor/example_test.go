package supervisor_test

import (
	"context"
	"fmt"
	"os"

	"github.com/managoat/managoat/provider/local/journal"
	"github.com/managoat/managoat/provider/local/supervisor"
)

// Launch re-executes this binary as the sandbox's supervisor (its main,
// here TestMain, calls MaybeRun first); a Client then spawns a session and
// follows its journal from byte zero.
func Example() {
	dir, _ := os.MkdirTemp("", "supervisor-example-")
	defer os.RemoveAll(dir)
	ctx := context.Background()
	if err := supervisor.Launch(ctx, dir); err != nil {
		fmt.Println(err)
		return
	}
	c := supervisor.Client{Dir: dir}
	defer c.Shutdown(ctx, true)

	id, _ := c.Spawn(ctx, supervisor.SpawnRequest{Argv: []string{"sh", "-c", "echo hello; exit 3"}})
	out, _ := c.Follow(ctx, id, func(r journal.Record) bool {
		fmt.Printf("%s %q\n", r.Kind, r.Data)
		return true
	})
	fmt.Println("exit", out.Code)
	// Output:
	// stdout "hello\n"
	// exit 3
}
