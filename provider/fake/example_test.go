package fake_test

import (
	"context"
	"fmt"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

func Example() {
	p := fake.New()
	defer p.Close()
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()

	h, _ := reg.Create(ctx, "fake", "agent-1", sandbox.CreateOptions{})
	res, _ := reg.Exec(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:hello", "exit:3"}}, sandbox.ExecOptions{})
	fmt.Printf("%s exit %d\n", res.Output, res.ExitCode)

	c, _ := reg.Spawn(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:ready", "stay"}}, sandbox.SpawnOptions{Stdin: true})
	fmt.Println(string((<-c.Events()).Data))
	_ = c.WriteStdin(ctx, []byte("ping"))
	fmt.Println(string((<-c.Events()).Data))
	_ = c.CloseStdin(ctx)
	for ev := range c.Events() {
		fmt.Println(ev.Kind, ev.Code)
	}
	// Output:
	// hello exit 3
	// ready
	// echo:ping
	// exit 0
}
