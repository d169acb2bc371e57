package client_test

import (
	"context"
	"testing"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// BenchmarkExecOverhead is exec through serve on provider/fake, whose exec
// takes microseconds: the platform's own cost per call (HTTP, the key, the
// record, JSON).
func BenchmarkExecOverhead(b *testing.B) {
	f := fake.New()
	b.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(b, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f},
		Configure: func(c *api.Config) { c.Rate = 1e6 }})
	c := newClient(b, pl.URL, pl.Account(b, "bench"), "fake")
	ctx := context.Background()
	h, err := c.Create(ctx, "o", sandbox.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if res, err := c.Exec(ctx, h, sandbox.Cmd{Name: "emit", Args: []string{"exit:0"}}, sandbox.ExecOptions{}); err != nil || res.ExitCode != 0 {
			b.Fatal(res, err)
		}
	}
}
