package runner_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
	"github.com/managoat/managoat/sandbox/sandboxtest"
)

// unreadable is provider/fake with only the Provider interface: no
// FileReader, like the provider behind Fountain's daemon, so the daemon
// does not report read_file.
type unreadable struct{ sandbox.Provider }

// TestReadFileOnlyWhenAdvertised: against a daemon that does not report
// read_file, the platform's provider does not claim sandbox.FileReader
// (Advertised), a ReadFile is not_supported without a frame sent, and
// the conformance suite passes (its WriteFile case failed with "ReadFile
// = \"\", operation not supported" when the provider always claimed it).
func TestReadFileOnlyWhenAdvertised(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, unreadable{f}, nil)
	id := pl.online(t)
	rp := pl.srv.Provider()
	for _, r := range pl.host.Online() {
		if r.HasCap(wire.CapReadFile) {
			t.Fatalf("runner %s reports %s with a provider that cannot read files: %v", r.ID, wire.CapReadFile, r.Caps)
		}
	}
	ctx := context.Background()
	ap := rp.Advertised(ctx)
	if _, ok := ap.(sandbox.FileReader); ok {
		t.Fatal("Advertised claims FileReader for a runner without read_file")
	}
	if _, ok := ap.(sandbox.SessionTerminator); !ok {
		t.Fatal("Advertised lost the provider's other interfaces")
	}
	h, err := rp.Create(ctx, namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rp.ReadFile(ctx, h, "/etc/hostname"); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("ReadFile on a runner without read_file = %v, want not supported", err)
	}
	sandboxtest.Run(t, ap, fakeFixtures, sandboxtest.WithNames(namer(id)), sandboxtest.WithTimeout(5*time.Second))
}

// TestReadFileAdvertised: a daemon whose provider reads files reports
// read_file, and Advertised claims FileReader.
func TestReadFileAdvertised(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	pl.online(t)
	if _, ok := pl.srv.Provider().Advertised(context.Background()).(sandbox.FileReader); !ok {
		t.Fatal("Advertised does not claim FileReader for a runner reporting read_file")
	}
}
