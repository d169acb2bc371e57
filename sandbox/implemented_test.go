package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// claimsAll advertises checkpoint and public_url over a fake that has a
// PublicURL but no Checkpointer.
type claimsAll struct{ *fake.Provider }

func (p claimsAll) Capabilities() sandbox.Capabilities {
	return p.Provider.Capabilities().With(sandbox.CapCheckpoint, sandbox.CapPublicURL)
}

// TestCapabilitiesFollowImplementations: the registry claims a capability
// only where the optional interface behind it is implemented, and answers
// ErrNotSupported (after checking the handle) for an operation a provider
// does not implement.
func TestCapabilitiesFollowImplementations(t *testing.T) {
	p := claimsAll{fake.New()}
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()
	if ok, _ := reg.Supports(fake.Name, sandbox.CapCheckpoint); ok {
		t.Error("Supports(checkpoint) without a Checkpointer")
	}
	if ok, _ := reg.Supports(fake.Name, sandbox.CapPublicURL); !ok {
		t.Error("Supports(public_url) is false for a provider with PublicURL")
	}
	h, err := reg.Create(ctx, fake.Name, "box", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := reg.CapabilitiesOf(ctx, h)
	if err != nil || caps.Has(sandbox.CapCheckpoint) {
		t.Errorf("CapabilitiesOf = %v, %v: want no checkpoint", caps, err)
	}
	if _, err := reg.CreateCheckpoint(ctx, h, sandbox.CheckpointOptions{}); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Errorf("CreateCheckpoint = %v, want ErrNotSupported", err)
	}
	if err := reg.RestoreCheckpoint(ctx, h, "cp"); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Errorf("RestoreCheckpoint = %v, want ErrNotSupported", err)
	}
	if _, err := reg.CreateCheckpoint(ctx, nil, sandbox.CheckpointOptions{}); sandbox.Kind(err) != "invalid" {
		t.Errorf("CreateCheckpoint(nil) = %v, want invalid before not supported", err)
	}
	if u, err := reg.PublicURL(ctx, h); err != nil || u == "" {
		t.Errorf("PublicURL = %q, %v", u, err)
	}
	if !errors.Is(sandbox.ErrUnsupported, sandbox.ErrNotSupported) || sandbox.Kind(sandbox.ErrUnsupported) != "not_supported" {
		t.Error("ErrUnsupported is not ErrNotSupported")
	}
}
