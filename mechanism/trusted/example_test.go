package trusted_test

import (
	"context"
	"fmt"
	"os"

	"github.com/managoat/managoat/mechanism"
	"github.com/managoat/managoat/mechanism/trusted"
)

// A trusted sandbox is a directory and plain processes: no isolation, an
// honest capability set, and the three outcomes of Execute.
func Example() {
	dir, _ := os.MkdirTemp("", "trusted-example")
	defer os.RemoveAll(dir)
	m, err := trusted.New(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	_ = m.Provision(ctx, "box", mechanism.Spec{})
	_ = m.Start(ctx, "box")
	defer m.Destroy(ctx, "box")

	c, err := m.Execute(ctx, "box", []string{"sh", "-c", "echo hello; exit 3"}, mechanism.ExecOptions{})
	fmt.Printf("%q exit %d err %v\n", c.Stdout, c.ExitStatus, err)

	err = m.Provision(ctx, "capped", mechanism.Spec{Limits: mechanism.Limits{MemoryBytes: 64 << 20}})
	fmt.Println(err != nil) // a memory cap is refused, never silently dropped
	// Output:
	// "hello\n" exit 3 err <nil>
	// true
}
