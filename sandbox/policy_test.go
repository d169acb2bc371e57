package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// TestCheckAllowEntry: domains, wildcards, addresses and CIDRs (each
// optionally with a port) are accepted, as the README promises; a URL, a
// path, a list in one entry, a space, a single label or a bad port is
// Invalid{network_policy} naming the entry. (Fails on the old code:
// 10.0.0.0/8 "is not a domain".)
func TestCheckAllowEntry(t *testing.T) {
	for _, e := range []string{"example.com", "*.example.com", "example.com:443", "*.example.org:443", "Example.COM.",
		"10.0.0.0/8", "10.0.0.0/8:443", "203.0.113.7", "203.0.113.7:22", "2001:db8::1", "2001:db8::/32", "[2001:db8::/32]:443", "[2001:db8::1]:8080"} {
		if err := sandbox.CheckAllowEntry(e); err != nil {
			t.Errorf("%q refused: %v", e, err)
		}
	}
	for _, e := range []string{"", "http://example.com", "example.com/path", "a.com,b.com", "a b.com", "localhost", "example.com:0",
		"example.com:99999", "example.com:", "[2001:db8::1", "[2001:db8::1]x", "*.", "ex ample.com", "exa\x00mple.com", "-a.com", "10.0.0.0/33"} {
		err := sandbox.CheckAllowEntry(e)
		var ie *sandbox.InvalidError
		if err == nil || !errors.As(err, &ie) || ie.Reason != "network_policy" || !strings.Contains(err.Error(), "neither a domain") {
			t.Errorf("%q = %v, want Invalid{network_policy}", e, err)
		}
	}
	reg := sandbox.NewRegistry(fake.New())
	ctx := context.Background()
	h, err := reg.Create(ctx, "fake", "box", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"10.0.0.0/8", "github.com"}}); err != nil {
		t.Errorf("a CIDR through the registry: %v", err)
	}
	if err := reg.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"https://github.com"}}); err == nil {
		t.Errorf("a URL through the registry was accepted")
	}
}
