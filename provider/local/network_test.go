package local

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/managoat/managoat/mechanism/egress"
	"github.com/managoat/managoat/sandbox"
)

// On the jail: network_policy is advertised, an allow list is put in
// force, a bad entry is Invalid naming it, a list past the limit is
// refused, and a sandbox made with network none keeps only lo (deny-all
// accepted, an allow list refused naming egress_allowlist).
func TestJailPolicy(t *testing.T) {
	p := newJail(t)
	ctx := context.Background()
	if !p.Capabilities().Has(sandbox.CapNetworkPolicy) {
		t.Fatal("network_policy not advertised on the jail")
	}
	h, err := p.Create(ctx, "pol", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("deny-all: %v", err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", "*.example.org:443", "203.0.113.0/24"}}); err != nil {
		t.Fatalf("allow list: %v", err)
	}
	err = p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: []string{"api.example.com", "not a domain"}})
	if !isInvalid(err) || !strings.Contains(err.Error(), `"not a domain"`) {
		t.Fatalf("bad entry = %v, want Invalid naming it", err)
	}
	long := make([]string, egress.MaxEntries+1)
	for i := range long {
		long[i] = "example.com"
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: long}); !isInvalid(err) {
		t.Fatalf("%d entries = %v, want Invalid", len(long), err)
	}
	if err := p.ApplyNetworkPolicy(ctx, h, sandbox.NetworkPolicy{Allow: long[:egress.MaxEntries]}); err != nil {
		t.Fatalf("%d entries: %v", egress.MaxEntries, err)
	}
	// The list is in force inside: a name outside it does not resolve.
	res, err := p.Exec(ctx, h, sandbox.Cmd{Name: "getent", Args: []string{"hosts", "denied.example"}}, sandbox.ExecOptions{})
	if err != nil || res.ExitCode == 0 {
		t.Errorf("a name outside the list resolved: %+v %v", res, err)
	}
	if _, err := p.Create(ctx, "bad", sandbox.CreateOptions{Network: "bridge"}); !isInvalid(err) {
		t.Fatalf("network bridge = %v, want Invalid", err)
	}
	off, err := p.Create(ctx, "off", sandbox.CreateOptions{Network: sandbox.NetworkNone})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.ApplyNetworkPolicy(ctx, off, sandbox.NetworkPolicy{Allow: []string{}}); err != nil {
		t.Fatalf("deny-all on network none: %v", err)
	}
	if err := p.ApplyNetworkPolicy(ctx, off, sandbox.NetworkPolicy{Allow: []string{"api.example.com"}}); err == nil || !strings.Contains(err.Error(), "egress_allowlist") {
		t.Fatalf("allow list on network none = %v, want a refusal naming egress_allowlist", err)
	}
}

func isInvalid(err error) bool {
	var ie *sandbox.InvalidError
	return errors.As(err, &ie)
}
