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

// relayed sends a call crafted by hand to replica a's subject, as another
// replica would relay it, and returns its answer.
func relayed(t *testing.T, nc *nats.Conn, hdr nats.Header, req string) *nats.Msg {
	t.Helper()
	ans, err := nc.RequestMsg(&nats.Msg{Subject: "managoat.runners.call.a", Header: hdr, Data: []byte(req)}, 5*time.Second)
	if err != nil {
		t.Fatalf("relayed call: %v", err)
	}
	return ans
}

// TestHolderChecksTheAccount: the replica holding a runner's socket
// serves a relayed call only for the runner's account. A call made with
// CallAs for another account through replica b, and a call crafted
// directly on NATS naming another account, are refused not_found by
// replica a and never reach the runner; the runner's own account is
// served both ways. A call that names no account (Call, an earlier
// replica) is served unless the holder has RequireAccount. A deletion
// naming another account leaves the runner connected.
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
	create := `{"id":1,"op":"create","name":"` + namer(t, id)() + `"}`
	ans := relayed(t, nc, nats.Header{"Managoat-Runner": {id}, "Managoat-Account": {"mallory"}}, create)
	if ans.Header.Get("Managoat-Code") != wire.CodeNotFound || len(ans.Data) != 0 {
		t.Fatalf("a crafted call for another account's runner: %+v %q", ans.Header, ans.Data)
	}
	ans = relayed(t, nc, nats.Header{"Managoat-Runner": {id}, "Managoat-Account": {"local", "mallory"}}, create)
	if ans.Header.Get("Managoat-Code") != wire.CodeNotFound {
		t.Fatalf("a crafted call naming two accounts: %+v %q", ans.Header, ans.Data)
	}
	exec := `{"id":1,"op":"exec","name":"` + h.Name + `","cmd":"emit","args":["out:mine"]}`
	for _, hdr := range []nats.Header{
		{"Managoat-Runner": {id}, "Managoat-Account": {"local"}},
		{"Managoat-Runner": {id}}, // no account named: served, as from an earlier replica
	} {
		ans = relayed(t, nc, hdr, exec)
		if fr, err := wire.Decode(ans.Data); err != nil || fr.Kind != wire.KindReply || !fr.Reply.OK {
			t.Fatalf("a crafted call with %v: %+v %q", hdr, ans.Header, ans.Data)
		}
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
	if names, _ := f.ListAllNames(ctx); len(names) != 1 || names[0] != h.Name {
		t.Fatalf("another account's calls reached the runner: %v", names)
	}

	// A holder with RequireAccount refuses a call naming no account.
	strict := newReplicaWith(t, ns, natshost.Config{Replica: "strict", TTL: 5 * time.Second, KeepAlive: 100 * time.Millisecond, Logger: quiet, RequireAccount: true})
	ids := map[string]string{}
	for _, name := range []string{"desk", "shelf"} {
		startDaemon(t, strict.ts.URL, name, newFake(t))
	}
	waitFor(t, "two more runners online", 10*time.Second, func() bool {
		for _, r := range b.host.Online() {
			ids[r.Name] = r.ID
		}
		return ids["desk"] != "" && ids["shelf"] != ""
	})
	desk, shelf := ids["desk"], ids["shelf"]
	ans, err = nc.RequestMsg(&nats.Msg{Subject: "managoat.runners.call.strict", Header: nats.Header{"Managoat-Runner": {desk}}, Data: []byte(`{"id":1,"op":"list"}`)}, 5*time.Second)
	if err != nil || ans.Header.Get("Managoat-Code") != wire.CodeNotFound {
		t.Fatalf("a call naming no account to a RequireAccount holder: %v %+v", err, ans)
	}
	if _, err := (accountView{b.host, "local"}).Call(ctx, desk, &wire.Request{Op: wire.OpList}, nil); err != nil {
		t.Fatalf("CallAs to a RequireAccount holder: %v", err)
	}

	// Deletions of desk naming another account, or (to this holder) no
	// account, are ignored. The deletion of shelf by its own account, on
	// the same subject after them, is the barrier: once shelf is gone,
	// the holder has handled the others.
	for _, d := range []string{`{"runner":"` + desk + `","account":"mallory"}`, `{"runner":"` + desk + `"}`} {
		if err := nc.Publish("managoat.runners.delete", []byte(d)); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if !b.host.DeleteRunner(shelf, "local") {
		t.Fatal("the runner's own account could not delete it")
	}
	waitFor(t, "the deleted runner's socket closed", 10*time.Second, func() bool { return strict.host.Whereis(shelf) == nil })
	if strict.host.Whereis(desk) == nil {
		t.Fatal("a deletion naming another account, or none, closed the runner")
	}
}
