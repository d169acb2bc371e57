package client_test

import (
	"context"
	"fmt"
	"os"

	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/sandbox"
)

// The client against a running `managoat serve`: MANAGOAT_URL and
// MANAGOAT_API_KEY say where and who. (Without them, it says what to set.)
func ExampleNew() {
	p, err := client.New(client.Options{URL: os.Getenv("MANAGOAT_EXAMPLE_URL"), APIKey: os.Getenv("MANAGOAT_EXAMPLE_KEY")})
	if err != nil {
		fmt.Println(sandbox.Kind(err))
		return
	}
	defer p.Close()
	ctx := context.Background()
	h, err := p.Create(ctx, "hello", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, _ := p.Exec(ctx, h, sandbox.Cmd{Name: "echo", Args: []string{"hi"}}, sandbox.ExecOptions{})
	fmt.Print(string(res.Output))
	// Output: invalid
}
