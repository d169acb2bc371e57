package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// A host registers providers and calls the facade.
func Example() {
	reg := sandbox.NewRegistry(fake.New())
	ctx := context.Background()

	h, err := reg.Create(ctx, "fake", "agent-1", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println(sandbox.Kind(err), err)
		return
	}
	res, err := reg.Exec(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:hi", "exit:2"}}, sandbox.ExecOptions{Timeout: time.Minute})
	fmt.Println(string(res.Output), res.ExitCode, err)

	_, err = reg.Get(ctx, sandbox.BuildHandle("fake", "never-made"))
	fmt.Println(errors.Is(err, sandbox.ErrNotFound))
	// Output:
	// hi 2 <nil>
	// true
}

// Retry wraps idempotent calls only.
func ExampleRetry() {
	calls := 0
	err := sandbox.Retry(context.Background(), sandbox.Backoff{Base: time.Millisecond}, func(ctx context.Context) error {
		calls++
		if calls < 2 {
			return sandbox.Unavailable(sandbox.ReasonTimeout, nil)
		}
		return nil
	})
	fmt.Println(calls, err)
	// Output: 2 <nil>
}
