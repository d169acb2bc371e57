package runner_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// A platform (NewServer) with a daemon (runner.Run) serving provider/fake;
// the platform's provider runs a command on the runner.
func ExampleNewServer() {
	srv := prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken("s3cret"), Logger: quiet})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()

	f := fake.New()
	defer f.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runner.Run(ctx, runner.Config{URL: ts.URL, Token: "s3cret", Name: "laptop", Provider: f, Logger: quiet})
	}()
	defer func() { stop(); <-done }()

	p := srv.Provider()
	var name string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n, err := p.Mint(ctx); err == nil {
			name = n
			break
		}
	}
	h, err := p.Create(ctx, name, sandbox.CreateOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:hello from the runner"}}, sandbox.ExecOptions{})
	fmt.Printf("%s (exit %d, err %v)\n", res.Output, res.ExitCode, err)
	// Output: hello from the runner (exit 0, err <nil>)
}

// Another process reaches the same runners through the platform's proxy.
func ExampleNewClient() {
	srv := prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken("s3cret"), Logger: quiet})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()
	f := fake.New()
	defer f.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runner.Run(ctx, runner.Config{URL: ts.URL, Token: "s3cret", Name: "laptop", Provider: f, Logger: quiet})
	}()
	defer func() { stop(); <-done }()

	cl := prov.NewClient(ts.URL, "s3cret")
	defer cl.Close()
	p := prov.NewProvider(cl, prov.ProviderOptions{})
	var name string
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if n, err := p.Mint(ctx); err == nil {
			name = n
			break
		}
	}
	h, _ := p.Create(ctx, name, sandbox.CreateOptions{})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:streamed", "exit:4"}}, sandbox.SpawnOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for ev := range c.Events() {
		switch ev.Kind {
		case sandbox.Stdout:
			fmt.Printf("stdout %q\n", ev.Data)
		case sandbox.Exit:
			fmt.Println("exit", ev.Code)
		}
	}
	// Output:
	// stdout "streamed"
	// exit 4
}

func ExampleParse() {
	id, err := prov.Parse("runner-0F0E0D0C0B0A49088706050403020100-abcd1234")
	fmt.Println(id, err)
	name, _ := prov.For(id)
	fmt.Println(len(name), name[:39])
	_, err = prov.Parse("sprite-1")
	fmt.Println(err)
	// Output:
	// 0f0e0d0c-0b0a-4908-8706-050403020100 <nil>
	// 48 runner-0f0e0d0c0b0a49088706050403020100
	// sandbox: invalid not_a_runner_sandbox_name: "sprite-1" is not a runner sandbox name
}
