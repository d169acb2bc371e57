package e2b_test

import (
	"context"
	"fmt"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// A provider pointed at the fake of both planes; with E2B_API_KEY set,
// e2b.NewFromEnv() talks to E2B itself.
func Example() {
	srv := e2btest.NewServer(e2btest.Options{})
	defer srv.Close()
	p, err := e2b.New(e2b.Config{APIKey: srv.APIKey(), APIURL: srv.APIURL(), SandboxURL: srv.SandboxURL()})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()

	h, err := reg.Create(ctx, "e2b", "agent-1", sandbox.CreateOptions{})
	if err != nil {
		panic(err)
	}
	res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hello; exit 3"}}, sandbox.ExecOptions{})
	fmt.Printf("%q %d %v\n", res.Output, res.ExitCode, err)

	// A detachable spawn is a session that can be attached again.
	c, err := reg.Spawn(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"journaled"}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		panic(err)
	}
	for ev := range c.Events() {
		fmt.Println(ev.Kind, string(ev.Data), ev.Code)
	}
	a, err := reg.Attach(ctx, h, c.SessionID, sandbox.AttachOptions{})
	if err != nil {
		panic(err)
	}
	for ev := range a.Events() {
		fmt.Println("replay:", ev.Kind, string(ev.Data), ev.Code)
	}
	fmt.Println(reg.Destroy(ctx, h))
	// Output:
	// "hello\n" 3 <nil>
	// stdout journaled
	//  0
	// exit  0
	// replay: stdout journaled
	//  0
	// replay: exit  0
	// <nil>
}
