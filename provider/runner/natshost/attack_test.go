package natshost_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/natshost"
	"github.com/managoat/managoat/sandbox"
)

// The users of the NATS server of TestBusAttacks: the replicas', and
// another application's that may use the same subjects (the worst case of
// a shared NATS: permissions that keep it off managoat's subjects are
// the operator's; the cluster key must hold without them).
const (
	replicaUser, replicaPass = "managoat", "replica-pw"
	otherUser, otherPass     = "mallory", "mallory-pw"
)

func startNATSWithUsers(t testing.TB) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: replicaUser, Password: replicaPass}, {Username: otherUser, Password: otherPass}}})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	return ns
}

func newReplicaAs(t testing.TB, ns *server.Server, name string) *replica {
	t.Helper()
	nc, err := nats.Connect(ns.ClientURL(), nats.UserInfo(replicaUser, replicaPass), nats.Name(name))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := natshost.New(ctx, natshost.Config{Conn: nc, Replica: name, TTL: 5 * time.Second, KeepAlive: 100 * time.Millisecond, Logger: quiet, ClusterKey: clusterKey})
	if err != nil {
		t.Fatal(err)
	}
	return wrapReplica(t, nc, h)
}

// sniffer keeps every message a NATS connection sees on ">" (bounded).
type sniffer struct {
	mu    sync.Mutex
	msgs  []*nats.Msg
	bytes int
}

func (s *sniffer) on(m *nats.Msg) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.bytes > 256<<20 {
		return
	}
	c := &nats.Msg{Subject: m.Subject, Reply: m.Reply, Header: nats.Header{}, Data: append([]byte(nil), m.Data...)}
	for k, v := range m.Header {
		c.Header[k] = append([]string(nil), v...)
	}
	s.msgs = append(s.msgs, c)
	s.bytes += len(m.Data)
}

func (s *sniffer) on_(subject string) []*nats.Msg {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*nats.Msg
	for _, m := range s.msgs {
		if m.Subject == subject {
			out = append(out, m)
		}
	}
	return out
}

// leaks reports where any of secrets (or the base64 of a secret, at any
// alignment) shows in what s saw: subjects, reply subjects, headers, data.
func (s *sniffer) leaks(secrets ...string) []string {
	var needles [][]byte
	for _, sec := range secrets {
		needles = append(needles, []byte(sec))
		for shift := range 3 {
			enc := base64.StdEncoding.EncodeToString(append(bytes.Repeat([]byte{0}, shift), sec...))
			needles = append(needles, []byte(enc[4:len(enc)-4]))
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, m := range s.msgs {
		var hdr strings.Builder
		for k, v := range m.Header {
			hdr.WriteString(k + ":" + strings.Join(v, ",") + "\n")
		}
		for _, n := range needles {
			for _, where := range [][]byte{[]byte(m.Subject), []byte(m.Reply), []byte(hdr.String()), m.Data} {
				if bytes.Contains(where, n) {
					out = append(out, m.Subject)
				}
			}
		}
	}
	return out
}

// TestBusAttacks is issue 39's items 1–4, tried by a NATS client without
// the cluster key: one of another user of the same NATS server, and one
// with the replicas' own password. With two replicas and a runner (its
// socket on a, called through b) it
//
//  1. publishes calls to the holder's call subject with forged headers
//     (a write_file and a create, naming the runner's id and account),
//     and replays every call a replica sent, verbatim: none runs, none is
//     answered;
//  2. subscribes to ">" while commands, a spawn's output, and a file
//     written and read back carry a secret across the replicas: the
//     secret (nor its base64), and the runner's id, never show on any
//     subject, header or payload it sees;
//  3. rewrites the runner's presence entry to name its own replica (and
//     answers on that replica's subjects), puts another runner's sealed
//     entry under the victim's key, and (as a replayed claim of another
//     replica, sealed) names replica b: calls still reach the real
//     runner, the attacker receives none, and replica a keeps the socket
//     (no 4409) and writes its claim back;
//  4. publishes the runner's deletion, repeatedly, and replays a genuine
//     deletion of another runner after it reconnected: no socket closes.
func TestBusAttacks(t *testing.T) {
	for _, who := range []struct{ name, user, pass string }{
		{"another user", otherUser, otherPass},
		{"the replicas' password", replicaUser, replicaPass},
	} {
		t.Run(who.name, func(t *testing.T) { busAttacks(t, who.user, who.pass) })
	}
}

func busAttacks(t *testing.T, user, pass string) {
	ns := startNATSWithUsers(t)
	a, b := newReplicaAs(t, ns, "a"), newReplicaAs(t, ns, "b")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// The attacker is listening from the start.
	ev, err := nats.Connect(ns.ClientURL(), nats.UserInfo(user, pass), nats.NoEcho()) // it sees what others send
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	var sn sniffer
	sniff, err := ev.Subscribe(">", sn.on)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sniff.Unsubscribe() }()
	if err := ev.Flush(); err != nil {
		t.Fatal(err)
	}

	f := newFake(t)
	startDaemon(t, a.ts.URL, "laptop", f)
	startDaemon(t, a.ts.URL, "shelf", newFake(t))
	ids := map[string]string{}
	waitFor(t, "both runners on a", 10*time.Second, func() bool {
		for _, r := range b.host.Online() {
			ids[r.Name] = r.ID
		}
		return ids["laptop"] != "" && ids["shelf"] != "" && a.host.Whereis(ids["laptop"]) != nil && a.host.Whereis(ids["shelf"]) != nil
	})
	id, shelf := ids["laptop"], ids["shelf"]
	victim := a.host.Whereis(id)

	// The account's own traffic, through b: the secret crosses the bus
	// in requests (arguments, file data) and answers (output, reads).
	const secret = "the-workload-secret-8f3a2c91d7"
	p := prov.NewProvider(accountView{b.host, "local"}, prov.ProviderOptions{})
	h, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res, err := p.Exec(ctx, h, fakeCmd("out:"+secret), sandbox.ExecOptions{}); err != nil || string(res.Output) != secret {
		t.Fatalf("exec through b: %q %v", res.Output, err)
	}
	cmd, err := p.Spawn(ctx, h, fakeCmd("out:"+secret, "exit:0"), sandbox.SpawnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for e := range cmd.Events() {
		out.Write(e.Data)
	}
	if out.String() != secret {
		t.Fatalf("spawn's output through b: %q", out.String())
	}
	file := bytes.Repeat([]byte(secret+"\n"), 8<<10) // parted: larger than a NATS message
	if err := p.WriteFile(ctx, h, "/secret", file, sandbox.WriteFileOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := p.ReadFile(ctx, h, "/secret"); err != nil || !bytes.Equal(got, file) {
		t.Fatalf("read back through b: %d bytes, %v", len(got), err)
	}
	// A sandbox made and destroyed: its create is recorded for a replay.
	h2, err := p.Create(ctx, namer(t, id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Destroy(ctx, h2); err != nil {
		t.Fatal(err)
	}
	// shelf deleted by its account: the deletion is recorded for a replay.
	oldShelf := a.host.Whereis(shelf)
	if !b.host.DeleteRunner(shelf, "local") {
		t.Fatal("the account could not delete shelf")
	}
	waitFor(t, "shelf connected again", 10*time.Second, func() bool {
		c := a.host.Whereis(shelf)
		return c != nil && c != oldShelf
	})
	shelfConn := a.host.Whereis(shelf)
	if err := ev.Flush(); err != nil {
		t.Fatal(err)
	}
	if len(sn.on_("managoat.runners.call.a")) == 0 || len(sn.on_("managoat.runners.delete")) == 0 {
		t.Fatal("the attacker saw no call or deletion: it does not see the bus")
	}
	// 2. Nothing of the workload read (before the attacker publishes
	// anything of its own: its forged entries name the runner's id).
	if where := sn.leaks(secret, id, shelf); len(where) != 0 {
		t.Errorf("the secret or a runner id showed on the bus, on %d messages: %.300v", len(where), where)
	}

	// 1. Forged calls, then every call a replica sent, replayed.
	replies := nats.NewInbox()
	rs, err := ev.SubscribeSync(replies)
	if err != nil {
		t.Fatal(err)
	}
	base := natshost.Dropped(a.host)
	forged := []string{
		`{"id":1,"op":"write_file","name":"` + h.Name + `","path":"/pwned","data":"cHduZWQ="}`,
		`{"id":1,"op":"create","name":"` + namer(t, id)() + `"}`,
	}
	for _, body := range forged {
		for _, hdr := range []nats.Header{
			{"Managoat-Runner": {id}, "Managoat-Account": {"local"}},
			{"Managoat-Runner": {id}},
		} {
			if err := ev.PublishMsg(&nats.Msg{Subject: "managoat.runners.call.a", Reply: replies, Header: hdr, Data: []byte(body)}); err != nil {
				t.Fatal(err)
			}
		}
	}
	whole := 4
	for _, m := range sn.on_("managoat.runners.call.a") {
		if m.Header.Get("Managoat-Part") == "" {
			whole++
		}
		if err := ev.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := ev.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to drop the forged and replayed calls", 10*time.Second, func() bool { return natshost.Dropped(a.host) >= base+whole })
	if m, err := rs.NextMsg(200 * time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a forged or replayed call was answered: %.300q", m.Data)
	}
	if _, err := p.ReadFile(ctx, h, "/pwned"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("the forged write_file ran: %v", err)
	}
	if names, _ := f.ListAllNames(ctx); len(names) != 1 || names[0] != h.Name {
		t.Errorf("a forged or replayed create ran: sandboxes %v, want only %s", names, h.Name)
	}

	// 3. Forged presence.
	var reached atomic.Int32
	evil, err := ev.Subscribe("managoat.runners.*.evil", func(m *nats.Msg) {
		reached.Add(1)
		if m.Reply != "" {
			_ = m.Respond([]byte(`{"id":1,"ok":true,"result":{"exit_code":0,"output":"Zm9yZ2Vk"}}`))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(ev)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "managoat_runners")
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	victimKey, shelfKey := natshost.PresenceKey(b.host, id), natshost.PresenceKey(b.host, shelf)
	shelfVal, err := kv.Get(ctx, shelfKey)
	if err != nil {
		t.Fatal(err)
	}
	forgedEntry := []byte(`{"replica":"evil","info":{"id":"` + id + `","account":"local","name":"laptop"},"stamp":"` + time.Now().UTC().Format(time.RFC3339Nano) + `"}`)
	baseB := natshost.Dropped(b.host)
	for _, k := range keys {
		if _, err := kv.Put(ctx, k, forgedEntry); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "r_"+base64.RawURLEncoding.EncodeToString([]byte(id)), forgedEntry); err != nil { // the earlier key
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, victimKey, shelfVal.Value()); err != nil { // a replica's entry, under another key
		t.Fatal(err)
	}
	waitFor(t, "b to ignore the forged entries", 10*time.Second, func() bool { return natshost.Dropped(b.host) >= baseB+len(keys)+2 })
	if res, err := p.Exec(ctx, h, fakeCmd("out:real"), sandbox.ExecOptions{}); err != nil || string(res.Output) != "real" {
		t.Fatalf("exec after the forged presence: %q %v", res.Output, err)
	}
	waitFor(t, "a to write its claim back", 10*time.Second, func() bool { return natshost.Holder(ctx, b.host, id) == "a" })
	// A sealed claim naming b, which does not hold the runner (an old
	// entry of b's, replayed).
	if err := natshost.PutPresence(ctx, b.host, "b", victim.Info()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to write its claim back over b's", 10*time.Second, func() bool { return natshost.Holder(ctx, b.host, id) == "a" })
	_ = evil.Unsubscribe()
	if n := reached.Load(); n != 0 {
		t.Errorf("%d messages reached the forged replica", n)
	}
	if res, err := p.Exec(ctx, h, fakeCmd("out:real"), sandbox.ExecOptions{}); err != nil || string(res.Output) != "real" {
		t.Errorf("exec after the replayed claim: %q %v", res.Output, err)
	}

	// 4. Deletions: forged, and a genuine one replayed.
	base = natshost.Dropped(a.host)
	for range 5 {
		for _, d := range []string{`{"runner":"` + id + `","account":"local"}`, `{"runner":"` + shelf + `","account":"local"}`} {
			if err := ev.Publish("managoat.runners.delete", []byte(d)); err != nil {
				t.Fatal(err)
			}
		}
	}
	dels := sn.on_("managoat.runners.delete")
	for _, m := range dels {
		if err := ev.PublishMsg(m); err != nil {
			t.Fatal(err)
		}
	}
	if err := ev.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to drop the forged and replayed deletions", 10*time.Second, func() bool { return natshost.Dropped(a.host) >= base+10+len(dels) })
	if a.host.Whereis(id) != victim || a.host.Whereis(shelf) != shelfConn {
		t.Fatal("a runner's socket was closed or replaced by the attacks")
	}
	select {
	case <-victim.Done():
		t.Fatal("the victim's socket closed")
	case <-shelfConn.Done():
		t.Fatal("shelf's socket closed on a replayed deletion")
	default:
	}

	// 2. Nothing read, all along.
	if err := ev.Flush(); err != nil {
		t.Fatal(err)
	}
	if where := sn.leaks(secret); len(where) != 0 {
		t.Fatalf("the secret showed on the bus, on %v", where)
	}
}
