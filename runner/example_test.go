package runner_test

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// Run serves a provider (here provider/fake; the CLI passes provider/local)
// to a platform until its context ends.
func ExampleRun() {
	srv := prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken("tok"), Logger: quiet})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()

	f := fake.New()
	defer f.Close()
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runner.Run(ctx, runner.Config{URL: ts.URL, Token: "tok", Name: "laptop", Root: "/srv/sandboxes", Provider: f, Logger: quiet})
	}()
	for deadline := time.Now().Add(10 * time.Second); len(srv.Host().Online()) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	r := srv.Host().Online()[0]
	fmt.Println(r.Name, r.Root)
	name, _ := prov.For(r.ID)
	h, _ := srv.Provider().Create(ctx, name, sandbox.CreateOptions{})
	info, err := srv.Provider().Get(ctx, h)
	fmt.Println(info.Status, err)
	stop()
	fmt.Println(<-done)
	// Output:
	// laptop /srv/sandboxes
	// running <nil>
	// <nil>
}

// A refusal that retrying cannot fix stops Run with a PermanentError.
func ExampleRun_refused() {
	srv := prov.NewServer(prov.ServerConfig{Auth: prov.StaticToken("tok"), Logger: quiet})
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()
	err := runner.Run(context.Background(), runner.Config{URL: ts.URL, Token: "wrong", Name: "laptop", Provider: fake.New(), Logger: quiet})
	var perm *runner.PermanentError
	fmt.Println(errors.As(err, &perm), perm.Status)
	// Output: true 401
}
