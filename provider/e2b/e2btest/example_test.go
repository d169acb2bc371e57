package e2btest_test

import (
	"context"
	"fmt"

	"github.com/managoat/managoat/provider/e2b"
	"github.com/managoat/managoat/provider/e2b/e2btest"
	"github.com/managoat/managoat/sandbox"
)

// The fake on its own: stage sandboxes, inject faults, inspect state.
func ExampleNewServer() {
	srv := e2btest.NewServer(e2btest.Options{MaxPage: 10})
	defer srv.Close()
	id := srv.CreateSandbox(map[string]string{e2b.MetaName: "staged", e2b.MetaMarker: "1"}, 300, true)
	srv.Inject(e2btest.Fault{Plane: e2btest.API, Path: "/v2/sandboxes", Status: 429,
		Body: `{"code":429,"message":"Rate limit exceeded"}`, Header: map[string]string{"Retry-After": "2"}})

	p, _ := e2b.New(e2b.Config{APIKey: srv.APIKey(), APIURL: srv.APIURL(), SandboxURL: srv.SandboxURL()})
	defer p.Close()
	_, err := p.ListAllNames(context.Background())
	fmt.Println(sandbox.Kind(err), err)
	names, _ := p.ListAllNames(context.Background())
	fmt.Println(names)
	sb, _ := srv.Lookup(id)
	fmt.Println(sb.State)
	// Output:
	// rate_limited sandbox: rate limited (retry after 2s)
	// [staged]
	// running
}
