package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

// dialRunner connects a raw runner socket named name with key to the
// platform's relay: the HTTP status of a refusal and its error code, or
// 101 with the socket closed at cleanup.
func dialRunner(t *testing.T, pl *apitest.Platform, name, key string) (int, string) {
	t.Helper()
	u := strings.Replace(pl.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		if resp == nil {
			t.Fatal(err)
		}
		var body struct {
			Error, Message string
		}
		b := make([]byte, 4096)
		n, _ := resp.Body.Read(b)
		_ = json.Unmarshal(b[:n], &body)
		return resp.StatusCode, body.Error + ": " + body.Message
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	// Read, so a close from the relay is answered.
	go func() {
		for {
			if _, _, err := ws.Read(context.Background()); err != nil {
				_ = ws.CloseNow()
				return
			}
		}
	}()
	return http.StatusSwitchingProtocols, ""
}

// runnerDaemon runs a real runner daemon, stopped at cleanup.
func runnerDaemon(t *testing.T, url, key, name string, p sandbox.Provider, backoff time.Duration) {
	t.Helper()
	d, err := runner.New(runner.Config{URL: url, Token: key, Name: name, Root: "/nowhere", Provider: p, Logger: slog.New(slog.DiscardHandler),
		BackoffBase: backoff, BackoffMax: backoff, PingInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		d.Close()
	})
}

func onlineIDs(pl *apitest.Platform) []string {
	var ids []string
	for _, i := range pl.Relay.Host().Online() {
		ids = append(ids, i.ID)
	}
	return ids
}

// TestClientKeyCannotTakeAnEnrolledRunner is issue 30's fourth attack
// through the real API: alice's enrolled runner "laptop" serves a
// sandbox; a client key of alice's (two of them) tries to connect as
// "laptop" while it is online, then DELETEs the runner (its socket closed,
// 4404) and races its reconnection. Every try is 403; the real runner
// comes back under its own id, not derived from (account, name), and its
// sandbox answers through the API. On the old code the key connected as
// "laptop" (409 while the runner was online, then 101 after the delete:
// the impostor held the id, and the runner's sandbox with it).
func TestClientKeyCannotTakeAnEnrolledRunner(t *testing.T) {
	file := filepath.Join(t.TempDir(), "runners.json")
	pl := apitest.Start(t, apitest.Options{RunnerAuth: func(a *api.RunnerAuth) { a.Fallback = runnerprov.RunnerFile{Path: file} }})
	key := pl.Account(t, "alice")
	key2 := pl.Account(t, "alice")
	cred, err := runnerprov.Enroll(file, "laptop", "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	// The real runner reconnects 300 ms after losing its socket: the
	// impostor's window.
	runnerDaemon(t, pl.URL, cred, "laptop", f, 300*time.Millisecond)
	waitOnline(t, pl, 1)
	id := onlineIDs(pl)[0]
	acct, _ := pl.Store.AccountByName(context.Background(), "alice")
	if id == runnerprov.StableID(acct.ID, "laptop") || id == runnerprov.StableID("alice", "laptop") {
		t.Fatalf("the runner's id %s is derived from its account and name", id)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name":"box","provider":"runner"}`)); a.status != 201 {
		t.Fatalf("create on the runner: %d %s", a.status, a.body)
	}
	exec := func() answer {
		return call(t, "POST", pl.URL+"/v1/sandboxes/box/exec", key, strings.NewReader(`{"cmd":"emit","args":["out:hi"]}`))
	}
	if a := exec(); a.status != 200 {
		t.Fatalf("exec on the runner's sandbox: %d %s", a.status, a.body)
	}

	for _, k := range []string{key, key2} {
		if st, msg := dialRunner(t, pl, "laptop", k); st != http.StatusForbidden {
			t.Fatalf("a client key connecting as the online runner: %d %s, want 403", st, msg)
		}
	}
	if ids := onlineIDs(pl); len(ids) != 1 || ids[0] != id {
		t.Fatalf("online after the refused impostor: %v, want the real runner %s", ids, id)
	}
	if a := exec(); a.status != 200 {
		t.Fatalf("exec after the refused impostor: %d %s", a.status, a.body)
	}

	// Delete it, and race its reconnection.
	if a := call(t, "DELETE", pl.URL+runnerprov.ListPath+"/"+id, key, nil); a.status != http.StatusNoContent {
		t.Fatalf("DELETE the runner: %d %s", a.status, a.body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(onlineIDs(pl)) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the deleted runner stayed online")
		}
		time.Sleep(time.Millisecond)
	}
	for _, k := range []string{key, key2} {
		st, msg := dialRunner(t, pl, "laptop", k)
		if st != http.StatusForbidden || !strings.Contains(msg, "enrolled") {
			t.Fatalf("a client key connecting as the deleted runner: %d %s, want 403 naming the enrolment", st, msg)
		}
	}
	waitOnline(t, pl, 1)
	if ids := onlineIDs(pl); len(ids) != 1 || ids[0] != id {
		t.Fatalf("online after the delete: %v, want the real runner back as %s", ids, id)
	}
	if a := exec(); a.status != 200 {
		t.Fatalf("exec on the runner's sandbox after its reconnection: %d %s", a.status, a.body)
	}
	rec, err := pl.Store.RunnerByName(context.Background(), acct.ID, "laptop")
	if err != nil || rec.ID != id || !rec.Enrolled || rec.KeyID != "" {
		t.Fatalf("the runner's record after the attack: %+v, %v", rec, err)
	}
}

// TestKeyClaimedRunnerName: a name first connected with an API key is that
// key's: another key of the account is 403 while the first is valid, and
// takes it over (same id) once it is revoked; an enrolment takes a key's
// name over; a second account's same name is another runner (another id).
func TestKeyClaimedRunnerName(t *testing.T) {
	file := filepath.Join(t.TempDir(), "runners.json")
	pl := apitest.Start(t, apitest.Options{RunnerAuth: func(a *api.RunnerAuth) { a.Fallback = runnerprov.RunnerFile{Path: file} }})
	ctx := context.Background()
	k1, k2 := pl.Account(t, "alice"), pl.Account(t, "alice")
	bob := pl.Account(t, "bob")
	if st, msg := dialRunner(t, pl, "box1", k1); st != 101 {
		t.Fatalf("first connection of box1 with k1: %d %s", st, msg)
	}
	waitOnline(t, pl, 1)
	id := onlineIDs(pl)[0]
	if st, msg := dialRunner(t, pl, "box1", k2); st != http.StatusForbidden {
		t.Fatalf("k2 connecting as k1's box1: %d %s, want 403", st, msg)
	}
	if st, msg := dialRunner(t, pl, "box1", bob); st != 101 {
		t.Fatalf("bob's own box1: %d %s", st, msg)
	}
	waitOnline(t, pl, 2)
	for _, i := range pl.Relay.Host().Online() {
		if i.Account == onlineAccount(t, pl, "bob") && i.ID == id {
			t.Fatalf("bob's box1 has alice's id %s", id)
		}
	}
	acct, _ := pl.Store.AccountByName(ctx, "alice")
	if err := pl.Store.RevokeKey(ctx, api.KeyID(k1), time.Now()); err != nil {
		t.Fatal(err)
	}
	closeAll(t, pl, id)
	if st, msg := dialRunner(t, pl, "box1", k2); st != 101 {
		t.Fatalf("k2 after k1's revocation: %d %s", st, msg)
	}
	rec, err := pl.Store.RunnerByName(ctx, acct.ID, "box1")
	if err != nil || rec.ID != id || rec.KeyID != api.KeyID(k2) {
		t.Fatalf("box1's record after the takeover: %+v, %v; want id %s held by k2", rec, err, id)
	}
	closeAll(t, pl, id)
	cred, err := runnerprov.Enroll(file, "box1", "alice", false)
	if err != nil {
		t.Fatal(err)
	}
	if st, msg := dialRunner(t, pl, "box1", cred); st != 101 {
		t.Fatalf("the enrolment of box1: %d %s", st, msg)
	}
	closeAll(t, pl, id)
	if st, msg := dialRunner(t, pl, "box1", k2); st != http.StatusForbidden {
		t.Fatalf("k2 after box1's enrolment: %d %s, want 403", st, msg)
	}
	if rec, _ := pl.Store.RunnerByName(ctx, acct.ID, "box1"); rec.ID != id || !rec.Enrolled {
		t.Fatalf("box1's record after its enrolment: %+v", rec)
	}
}

func onlineAccount(t *testing.T, pl *apitest.Platform, name string) string {
	t.Helper()
	a, err := pl.Store.AccountByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return a.ID
}

// closeAll closes runner id's socket and waits until it is offline.
func closeAll(t *testing.T, pl *apitest.Platform, id string) {
	t.Helper()
	if c := pl.Relay.Host().Whereis(id); c != nil {
		c.Close(wire.CloseDeleted, "test")
	}
	deadline := time.Now().Add(5 * time.Second)
	for pl.Relay.Host().Whereis(id) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the runner stayed online")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestRunnerQuota: an account holds at most MaxRunners runner names; one
// more is 403 resource_exhausted saying so, a name it holds still
// connects, another account is not affected, and a name freed by an
// operator makes room. Fails with no bound: the third name connects.
func TestRunnerQuota(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{RunnerAuth: func(a *api.RunnerAuth) { a.MaxRunners = 2 }})
	k, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	for _, n := range []string{"r1", "r2"} {
		if st, msg := dialRunner(t, pl, n, k); st != 101 {
			t.Fatalf("%s: %d %s", n, st, msg)
		}
	}
	st, msg := dialRunner(t, pl, "r3", k)
	if st != http.StatusForbidden || !strings.HasPrefix(msg, "resource_exhausted: ") || !strings.Contains(msg, "2 runner names") {
		t.Fatalf("a third runner name: %d %q, want 403 resource_exhausted naming the bound", st, msg)
	}
	if st, msg := dialRunner(t, pl, "r3", bob); st != 101 {
		t.Fatalf("bob's first runner: %d %s", st, msg)
	}
	waitOnline(t, pl, 3)
	for _, i := range pl.Relay.Host().Online() {
		if i.Name == "r1" {
			closeAll(t, pl, i.ID)
		}
	}
	if st, msg := dialRunner(t, pl, "r1", k); st != 101 {
		t.Fatalf("a name alice holds, again: %d %s", st, msg)
	}
	acct := onlineAccount(t, pl, "alice")
	if err := pl.Store.DeleteRunner(context.Background(), acct, "r2"); err != nil {
		t.Fatal(err)
	}
	if st, msg := dialRunner(t, pl, "r4", k); st != 101 {
		t.Fatalf("a new name after an operator freed one: %d %s", st, msg)
	}
	if rs, _ := pl.Store.ListRunners(context.Background(), acct); len(rs) != 2 {
		t.Fatalf("alice's records: %+v, want 2", rs)
	}
}
