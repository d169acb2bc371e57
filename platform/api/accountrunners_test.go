package api_test

import (
	"context"
	"errors"
	"testing"

	"github.com/managoat/managoat/platform/api"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// holder is a runner host that says runner r1 is alice's and records the
// account each call is made for; refuse makes it refuse every call as the
// holding replica refuses another account's (runner.ErrNotAccounts).
type holder struct {
	refuse   bool
	accounts []string
}

func (h *holder) Call(context.Context, string, *wire.Request, *runnerprov.Subscription) (*wire.Reply, error) {
	h.accounts = append(h.accounts, "(none)")
	return &wire.Reply{OK: true}, nil
}

func (h *holder) CallAs(_ context.Context, account, _ string, _ *wire.Request, _ *runnerprov.Subscription) (*wire.Reply, error) {
	h.accounts = append(h.accounts, account)
	if h.refuse {
		return nil, runnerprov.ErrNotAccounts
	}
	return &wire.Reply{OK: true}, nil
}

func (h *holder) Unsubscribe(*runnerprov.Subscription) {}

func (h *holder) Runners(context.Context) ([]runnerprov.Info, error) {
	return []runnerprov.Info{{ID: "r1", Account: "alice"}}, nil
}

func (h *holder) RunnerAccount(_ context.Context, id string) (string, bool) {
	return "alice", id == "r1"
}

// TestAccountRunnersNameTheAccount: a call through an account's view of the
// runners names the account, so the replica holding the runner's socket
// checks it itself (natshost TestHolderChecksTheAccount); its refusal reads
// as an offline runner, never as not_found, which the reaper would take for
// a sandbox that is gone.
func TestAccountRunnersNameTheAccount(t *testing.T) {
	h := &holder{}
	ctx := context.Background()
	if _, err := api.AccountRunners(h, "alice").Call(ctx, "r1", &wire.Request{Op: wire.OpList}, nil); err != nil {
		t.Fatal(err)
	}
	if len(h.accounts) != 1 || h.accounts[0] != "alice" {
		t.Fatalf("the holder saw calls for %q, want one for alice", h.accounts)
	}
	if _, err := api.AccountRunners(h, "bob").Call(ctx, "r1", &wire.Request{Op: wire.OpList}, nil); !offline(err) || len(h.accounts) != 1 {
		t.Fatalf("bob's call to alice's runner = %v (holder saw %q), want offline before any call", err, h.accounts)
	}
	h.refuse = true
	_, err := api.AccountRunners(h, "alice").Call(ctx, "r1", &wire.Request{Op: wire.OpList}, nil)
	if errors.Is(err, sandbox.ErrNotFound) || !offline(err) {
		t.Fatalf("the holder's refusal = %v, want Unavailable{%s}, never not_found", err, runnerprov.ReasonOffline)
	}
}

func offline(err error) bool {
	var u *sandbox.UnavailableError
	return errors.As(err, &u) && u.Reason == runnerprov.ReasonOffline
}
