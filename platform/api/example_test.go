package api_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/client"
	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// A platform with one provider, an account and its key, used by the Go
// client.
func ExampleNew() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "platform")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "platform.db"))
	if err != nil {
		panic(err)
	}
	defer st.Close()
	env := map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"}
	pol, err := policy.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok }, policy.Options{Extra: []string{"fake"}})
	if err != nil {
		panic(err)
	}
	f := fake.New()
	defer f.Close()
	srv, err := api.New(api.Config{Store: st, Policy: pol, Providers: map[string]sandbox.Provider{"fake": f}})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	defer srv.Close()

	acct, _ := st.CreateAccount(ctx, "alice")
	key, _ := api.NewKey(ctx, st, acct.ID, "example")

	p, _ := client.New(client.Options{URL: ts.URL, APIKey: key})
	defer p.Close()
	h, err := p.Create(ctx, "hello", sandbox.CreateOptions{})
	if err != nil {
		panic(err)
	}
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"out:hi from the platform"}}, sandbox.ExecOptions{})
	fmt.Println(string(res.Output), res.ExitCode, err)
	v, _ := p.Lookup(ctx, h)
	fmt.Println(v.Name, v.Provider, v.State)
	// Output:
	// hi from the platform 0 <nil>
	// hello fake running
}

// The URL the platform proxies for port 8080 of the account's sandbox
// "web" (what its url field and `managoat url web` say): every method, an
// Upgrade too, with the account's key in the Authorization header.
func ExamplePortURL() {
	fmt.Println(api.PortURL("https://sandboxes.example.com", "web", 8080))
	// Output:
	// https://sandboxes.example.com/v1/sandboxes/web/ports/8080/
}
