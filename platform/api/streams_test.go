package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// openStream dials the sandbox's stream with key and spawns a command
// that runs for a minute; it answers the open stream, or the refusal's
// status, Retry-After and body.
func openStream(t *testing.T, pl *apitest.Platform, key, name string) (*websocket.Conn, *http.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/"+name+"/stream",
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		return nil, resp, err
	}
	t.Cleanup(func() { _ = ws.CloseNow() })
	start, _ := json.Marshal(api.StreamStart{Op: "spawn", Cmd: "emit", Args: []string{"sleep:1m"}})
	if err := ws.Write(ctx, websocket.MessageText, start); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(ctx)
	var m api.StreamMsg
	if err != nil || json.Unmarshal(b, &m) != nil || m.Type != api.MsgStarted {
		t.Fatalf("stream of %s: %s, %v; want started", name, b, err)
	}
	return ws, resp, nil
}

// TestStreamsPerAccountBounded: an account's open streams are bounded
// (Config.StreamMaxPerAccount): the one past the bound is refused 429
// rate_limited{streams} with Retry-After before the upgrade, while another
// account is served; once one closes, a new one is accepted. There was no
// bound: one key could hold any number of WebSockets (each a command and
// its goroutines on the platform).
func TestStreamsPerAccountBounded(t *testing.T) {
	fp := fake.New()
	t.Cleanup(func() { _ = fp.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": fp},
		Env:       map[string]string{"SANDBOX_PROVIDER": "fake", "SANDBOX_RUNNERS_ENABLED": "false"},
		Configure: func(c *api.Config) { c.StreamMaxPerAccount = 3 }})
	alice, bob := pl.Account(t, "alice"), pl.Account(t, "bob")
	for _, k := range []string{alice, bob} {
		for _, n := range []string{"one", "two"} {
			if a := call(t, "POST", pl.URL+"/v1/sandboxes", k, strings.NewReader(`{"name": "`+n+`"}`)); a.status != 201 {
				t.Fatalf("create: %d %s", a.status, a.body)
			}
		}
	}
	// The bound is the account's, across its sandboxes.
	var open []*websocket.Conn
	for _, n := range []string{"one", "two", "one"} {
		ws, resp, err := openStream(t, pl, alice, n)
		if err != nil {
			t.Fatalf("alice's stream %d: %v (%v)", len(open)+1, err, resp)
		}
		open = append(open, ws)
	}
	refused := func() {
		t.Helper()
		_, resp, err := websocket.Dial(t.Context(), strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/two/stream",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + alice}}})
		if err == nil || resp == nil {
			t.Fatalf("alice's stream past the bound: %v, want 429", err)
		}
		var body struct{ Error api.Error }
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" ||
			body.Error.Kind != "rate_limited" || body.Error.Reason != "streams" || !strings.Contains(body.Error.Message, "3 streams") {
			t.Fatalf("alice's stream past the bound: %d, Retry-After %q, %+v; want 429 rate_limited{streams} naming the bound",
				resp.StatusCode, resp.Header.Get("Retry-After"), body.Error)
		}
	}
	refused()
	// Another account is served meanwhile.
	if _, resp, err := openStream(t, pl, bob, "one"); err != nil {
		t.Fatalf("bob's stream while alice is at her bound: %v (%v)", err, resp)
	}
	// A closed stream frees its place (the server sees the close when it
	// next reads or writes: poll, with a deadline).
	if err := open[0].Close(websocket.StatusNormalClosure, ""); err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("close: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		ws, _, err := websocket.Dial(t.Context(), strings.Replace(pl.URL, "http", "ws", 1)+"/v1/sandboxes/two/stream",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + alice}}})
		if err == nil {
			_ = ws.CloseNow()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no stream accepted after one of alice's closed: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
