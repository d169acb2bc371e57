package local_test

import (
	"context"
	"fmt"
	"os"

	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// A sandbox on the trusted mechanism (the jail is the default and needs
// root or user namespaces), a detached session, and an attach from byte
// zero after the spawning command was stopped.
func Example() {
	state, _ := os.MkdirTemp("", "managoat-example-")
	defer os.RemoveAll(state)
	p, err := local.New(local.Config{StateDir: state, MechanismName: "trusted"})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	h, err := p.Create(ctx, "example", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer p.Destroy(ctx, h)

	res, _ := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hello"}}, sandbox.ExecOptions{})
	fmt.Printf("exec: %q exit %d\n", res.Output, res.ExitCode)

	cmd, _ := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo one; echo two"}}, sandbox.SpawnOptions{})
	for ev := range cmd.Events() {
		if ev.Kind == sandbox.Exit {
			fmt.Println("spawn exit", ev.Code)
		}
	}
	// Later, perhaps from another process: replay the session from byte zero.
	a, _ := p.Attach(ctx, h, cmd.SessionID, sandbox.AttachOptions{})
	var replay []byte
	for ev := range a.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			replay = append(replay, ev.Data...)
		case sandbox.Exit:
			fmt.Printf("replay: %q exit %d\n", replay, ev.Code)
		}
	}
	// Output:
	// exec: "hello\n" exit 0
	// spawn exit 0
	// replay: "one\ntwo\n" exit 0
}

// The hook a binary calls first thing in main: when the process was
// started as a sandbox's supervisor it serves, then exits; otherwise it
// returns at once.
func ExampleMaybeRunSupervisor() {
	local.MaybeRunSupervisor()
	fmt.Println("not a supervisor")
	// Output: not a supervisor
}

func ExampleDefaultStateDir() {
	os.Setenv("MANAGOAT_HOME", "/srv/managoat")
	defer os.Unsetenv("MANAGOAT_HOME")
	fmt.Println(local.DefaultStateDir())
	// Output: /srv/managoat
}
