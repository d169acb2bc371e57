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
)

// TestCallAs: the Server serves CallAs only for the runner's own account
// (StaticToken's runners are "local"'s): another account, or none, gets
// ErrNotAccounts (not_found) and the runner is never reached; a runner
// not online is runner_offline.
func TestCallAs(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	name := namer(id)()
	for _, acct := range []string{"mallory", ""} {
		_, err := pl.srv.CallAs(ctx, acct, id, &wire.Request{Op: wire.OpCreate, Name: name}, nil)
		if !errors.Is(err, prov.ErrNotAccounts) || !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("CallAs for %q: %v, want not_found", acct, err)
		}
	}
	if names, _ := f.ListAllNames(ctx); len(names) != 0 {
		t.Fatalf("another account's call reached the runner: %v", names)
	}
	r, err := pl.srv.CallAs(ctx, "local", id, &wire.Request{Op: wire.OpCreate, Name: name}, nil)
	if err != nil || !r.OK {
		t.Fatalf("CallAs for the runner's account: %+v %v", r, err)
	}
	if names, _ := f.ListAllNames(ctx); len(names) != 1 {
		t.Fatalf("the runner has %v", names)
	}
	if _, err := pl.srv.CallAs(ctx, "local", "no-such-runner", &wire.Request{Op: wire.OpList}, nil); !isReason(err, prov.ReasonOffline) {
		t.Fatalf("CallAs to a runner not online: %v", err)
	}
}
