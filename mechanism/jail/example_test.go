package jail_test

import (
	"context"
	"fmt"
	"os"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/jail"
)

// Example shows the declarations the gate reads; it runs anywhere.
func Example() {
	dir, _ := os.MkdirTemp("", "jail-example-")
	defer os.RemoveAll(dir)
	j, err := jail.New(jail.Config{StateDir: dir, RunDir: dir + "/run"})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(j.Name(), mechanism.Required(j))
	// Output: jail [process_separation filesystem_confinement privilege_separation network_restriction syscall_filter landlock]
}

// Example_lifecycle is the whole lifecycle (it needs root and Init in main
// or TestMain, so it is compiled but not run here).
func Example_lifecycle() {
	ctx := context.Background()
	j, _ := jail.New(jail.Config{StateDir: "/var/lib/managoat/jail"})
	spec := mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 512 << 20, Pids: 256, CPUMillis: 1000}}
	if err := j.Provision(ctx, "demo", spec); err != nil {
		fmt.Println(err) // an *mechanism.UnavailableError names what this host lacks
		return
	}
	defer j.Destroy(ctx, "demo")
	if err := j.Start(ctx, "demo"); err != nil {
		fmt.Println(err)
		return
	}
	c, err := j.Execute(ctx, "demo", []string{"uname", "-n"}, mechanism.ExecOptions{})
	fmt.Printf("%s %v\n", c.Stdout, err)
}
