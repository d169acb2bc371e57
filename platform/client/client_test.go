package client_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// TestGetSaysWhereItLives: Get's Raw is the provider's body plus the
// platform's word (provider, platform_state), and List names each
// sandbox's provider.
func TestGetSaysWhereItLives(t *testing.T) {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "fake")
	ctx := context.Background()
	h, err := c.Create(ctx, "box", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Get(ctx, h)
	if err != nil || info.Status != sandbox.StatusRunning {
		t.Fatalf("Get = %+v, %v", info, err)
	}
	var raw map[string]any
	if err := json.Unmarshal(info.Raw, &raw); err != nil || raw["provider"] != "fake" || raw["platform_state"] != "running" {
		t.Fatalf("Raw = %s (%v)", info.Raw, err)
	}
	l, err := c.List(ctx)
	if err != nil || len(l) != 1 || l[0].Provider != "fake" || l[0].Name != "box" {
		t.Fatalf("List = %+v, %v", l, err)
	}
	if _, err := c.Get(ctx, sandbox.BuildHandle("fake", "box")); err == nil {
		t.Fatal("a handle of another provider was accepted")
	}
}
