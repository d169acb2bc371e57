package natshost_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// accountView is a Host seen from one account through CallAs.
type accountView struct {
	*natshost.Host
	account string
}

func (v accountView) Call(ctx context.Context, id string, req *wire.Request, sub *prov.Subscription) (*wire.Reply, error) {
	return v.CallAs(ctx, v.account, id, req, sub)
}

// TestHolderChecksTheAccount: the replica holding a runner's socket
// serves a relayed call only for the runner's account, even from a
// replica (a call sealed with the cluster key). A call made with CallAs
// for another account through replica b, and a sealed call crafted on
// NATS naming another account, two accounts or none, are refused
// not_found by replica a and never reach the runner; the runner's own
// account is served both ways. A deletion naming another account, or
// none, leaves the runner connected.
func TestHolderChecksTheAccount(t *testing.T) {
	ns := startNATS(t)
	a, b := newReplica(t, ns, "a"), newReplica(t, ns, "b")
	f := newFake(t)
	startDaemon(t, a.ts.URL, "laptop", f)
	id := onlineID(t, b.host)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	mine := prov.NewProvider(accountView{b.host, "local"}, prov.ProviderOptions{})
	h, err := mine.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatalf("the runner's own account through b: %v", err)
	}

	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	relayed := func(hdr nats.Header, req string) *nats.Msg {
		t.Helper()
		ans, err := sealedCall(t, nc, b.host, "managoat.runners.call.a", hdr, []byte(req))
		if err != nil {
			t.Fatalf("relayed call: %v", err)
		}
		return ans
	}
	create := `{"id":1,"op":"create","name":"` + namer(t, id)() + `"}`
	for _, hdr := range []nats.Header{
		{"Managoat-Runner": {id}, "Managoat-Account": {"mallory"}},
		{"Managoat-Runner": {id}, "Managoat-Account": {"local", "mallory"}},
		{"Managoat-Runner": {id}, "Managoat-Account": {""}},
		{"Managoat-Runner": {id}}, // no account named: refused (an earlier replica's call, or a forgetful caller)
	} {
		if ans := relayed(hdr, create); ans.Header.Get("Managoat-Code") != wire.CodeNotFound || len(ans.Data) != 0 {
			t.Fatalf("a crafted call with %v: %+v %q", hdr, ans.Header, ans.Data)
		}
	}
	exec := `{"id":1,"op":"exec","name":"` + h.Name + `","cmd":"emit","args":["out:mine"]}`
	ans := relayed(nats.Header{"Managoat-Runner": {id}, "Managoat-Account": {"local"}}, exec)
	if fr, err := wire.Decode(ans.Data); err != nil || fr.Kind != wire.KindReply || !fr.Reply.OK {
		t.Fatalf("a crafted call for the runner's account: %+v %q", ans.Header, ans.Data)
	}

	mallory := prov.NewProvider(accountView{b.host, "mallory"}, prov.ProviderOptions{})
	if _, err := mallory.Create(ctx, namer(t, id)(), sandbox.CreateOptions{}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("another account's create through b: %v, want not_found", err)
	}
	if _, err := (accountView{b.host, "mallory"}).Call(ctx, id, &wire.Request{Op: wire.OpList}, nil); !errors.Is(err, prov.ErrNotAccounts) {
		t.Fatalf("another account's call through b: %v, want the holder's refusal as ErrNotAccounts", err)
	}
	if _, err := (accountView{a.host, "mallory"}).Call(ctx, id, &wire.Request{Op: wire.OpList}, nil); !errors.Is(err, prov.ErrNotAccounts) {
		t.Fatalf("another account's call on the holder itself: %v", err)
	}
	if _, err := (accountView{b.host, ""}).Call(ctx, id, &wire.Request{Op: wire.OpList}, nil); !errors.Is(err, prov.ErrNotAccounts) {
		t.Fatalf("a call for no account: %v", err)
	}
	// Call (no account: the caller checked) names the runner's account
	// as its presence records it, and is served.
	if _, err := b.host.Call(ctx, id, &wire.Request{Op: wire.OpList}, nil); err != nil {
		t.Fatalf("Call through b: %v", err)
	}
	if names, _ := f.ListAllNames(ctx); len(names) != 1 || names[0] != h.Name {
		t.Fatalf("another account's calls reached the runner: %v", names)
	}

	// Deletions of laptop naming another account, or no account, sealed
	// as a replica's, are ignored. The deletion of shelf by its own
	// account, on the same subject after them, is the barrier: once shelf
	// is gone, a has handled the others.
	startDaemon(t, a.ts.URL, "shelf", newFake(t))
	var shelf string
	waitFor(t, "shelf online", 10*time.Second, func() bool {
		for _, r := range b.host.Online() {
			if r.Name == "shelf" {
				shelf = r.ID
			}
		}
		return shelf != ""
	})
	for _, d := range []string{`{"runner":"` + id + `","account":"mallory"}`, `{"runner":"` + id + `"}`, `{"runner":"` + id + `","account":""}`} {
		if err := nc.Publish("managoat.runners.delete", natshost.Seal(b.host, "request", "managoat.runners.delete", "", nil, []byte(d))); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if !b.host.DeleteRunner(shelf, "local") {
		t.Fatal("the runner's own account could not delete it")
	}
	waitFor(t, "the deleted runner's socket closed", 10*time.Second, func() bool { return a.host.Whereis(shelf) == nil })
	if a.host.Whereis(id) == nil {
		t.Fatal("a deletion naming another account, or none, closed the runner")
	}
}
