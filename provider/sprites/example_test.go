package sprites_test

import (
	"context"
	"fmt"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

// Create a sprite and run a command in it. The fake stands in for
// api.sprites.dev; with a real account use sprites.NewFromEnv().
func ExampleNew() {
	srv := spritestest.NewServer(spritestest.Options{})
	defer srv.Close()

	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()
	h, err := p.Create(ctx, "agent-1", sandbox.CreateOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", "echo hello; exit 3"}}, sandbox.ExecOptions{})
	fmt.Printf("%q %d %v\n", res.Output, res.ExitCode, err)
	// Output: "hello\n" 3 <nil>
}

// Without a token the provider refuses to start and names the variable.
func ExampleNewFromEnv() {
	_, err := sprites.New(sprites.Config{})
	fmt.Println(err)
	// Output: sandbox: invalid config: SPRITES_TOKEN is not set (Config.Token is empty) — cannot talk to Sprites
}

// CreateNew never adopts: a second attempt on the same name is refused.
func ExampleProvider_CreateNew() {
	srv := spritestest.NewServer(spritestest.Options{})
	defer srv.Close()
	p, _ := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	ctx := context.Background()

	h, err := p.CreateNew(ctx, "fresh", sandbox.CreateNewOptions{})
	fmt.Println(h.InstanceID != "", err)
	_, err = p.CreateNew(ctx, "fresh", sandbox.CreateNewOptions{})
	fmt.Println(err)
	// Output:
	// true <nil>
	// sandbox: already exists
}
