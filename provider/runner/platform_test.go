package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/managoat/managoat/provider/fake"
	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// rawDaemon is a hand-driven daemon: the test reads the platform's requests
// and writes whatever frames it wants.
type rawDaemon struct {
	t  testing.TB
	ws *websocket.Conn
}

func dialRaw(t testing.TB, pl *platform, name string) (*rawDaemon, *http.Response, error) {
	t.Helper()
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + wire.Path + "?" + url.Values{"name": {name}, "os": {"linux"}}.Encode()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		return nil, resp, err
	}
	ws.SetReadLimit(wire.ReadLimit)
	rd := &rawDaemon{t: t, ws: ws}
	t.Cleanup(func() { _ = ws.CloseNow() })
	return rd, resp, nil
}

func (rd *rawDaemon) next() *wire.Request {
	rd.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, b, err := rd.ws.Read(ctx)
	if err != nil {
		rd.t.Fatalf("raw daemon read: %v", err)
	}
	var r wire.Request
	if err := json.Unmarshal(b, &r); err != nil {
		rd.t.Fatalf("platform sent a bad request %s: %v", b, err)
	}
	return &r
}

func (rd *rawDaemon) send(s string) {
	rd.t.Helper()
	if err := rd.ws.Write(context.Background(), websocket.MessageText, []byte(s)); err != nil {
		rd.t.Fatalf("raw daemon write: %v", err)
	}
}

var sprintf = fmt.Sprintf

func rawName(t testing.TB, id string) (string, *sandbox.Handle) {
	n := namer(id)()
	return n, sandbox.BuildHandle(prov.Name, n)
}

// Invariant 3: ids start at 1 per connection, replies may be reordered,
// replies to unknown ids are dropped; junk JSON is ignored.
func TestIDsStartAtOneAndRepliesMayBeReordered(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	p := pl.srv.Provider()
	_, h := rawName(t, id)
	ctx := context.Background()
	type res struct {
		info sandbox.Info
		err  error
	}
	a, b := make(chan res, 1), make(chan res, 1)
	go func() { i, err := p.Get(ctx, h); a <- res{i, err} }()
	r1 := rd.next()
	go func() { i, err := p.Get(ctx, h); b <- res{i, err} }()
	r2 := rd.next()
	if r1.ID != 1 || r2.ID != 2 || r1.Op != wire.OpGet || r1.Name != h.Name {
		t.Fatalf("ids %d, %d (op %q name %q); want 1, 2", r1.ID, r2.ID, r1.Op, r1.Name)
	}
	rd.send(`{"hello":1}`)                                             // valid JSON, neither: ignored
	rd.send(`{"id":77,"ok":true,"result":{}}`)                         // a reply to no request: dropped
	rd.send(`{"id":0,"ok":true,"result":{}}`)                          // id 0: dropped
	rd.send(`{"stream":"stdout","session_id":"nobody","data":"eA=="}`) // no subscriber
	rd.send(`{"id":2,"ok":true,"result":{"status":"suspended","path":"/x"}}`)
	if got := <-b; got.err != nil || got.info.Status != sandbox.StatusSuspended {
		t.Fatalf("second call: %+v", got)
	}
	rd.send(`{"id":1,"ok":false,"error":"not_found","detail":"no sandbox"}`)
	if got := <-a; !errors.Is(got.err, sandbox.ErrNotFound) {
		t.Fatalf("first call: %+v", got)
	}
	// A reused id (a second reply for 1) is dropped too; the socket lives.
	rd.send(`{"id":1,"ok":true,"result":{}}`)
	go func() { i, err := p.Get(ctx, h); a <- res{i, err} }()
	r3 := rd.next()
	if r3.ID != 3 {
		t.Fatalf("third id %d", r3.ID)
	}
	rd.send(`{"id":3,"ok":true,"result":{"status":"weird"}}`)
	if got := <-a; got.err != nil || got.info.Status != sandbox.StatusUnknown {
		t.Fatalf("unknown status: %+v", got)
	}
	// A reply without ok is malformed: the caller gets a provider error.
	go func() { i, err := p.Get(ctx, h); a <- res{i, err} }()
	r4 := rd.next()
	rd.send(sprintf(`{"id":%d,"result":{}}`, r4.ID))
	var pe *sandbox.ProviderError
	if got := <-a; !errors.As(got.err, &pe) || pe.Reason != "malformed_reply" {
		t.Fatalf("malformed reply: %+v", got)
	}
	// A new connection numbers from 1 again.
	_ = rd.ws.Close(websocket.StatusNormalClosure, "")
	pl.offline(t)
	rd2, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	pl.online(t)
	go func() { i, err := p.Get(ctx, h); a <- res{i, err} }()
	if r := rd2.next(); r.ID != 1 {
		t.Fatalf("after reconnect id %d, want 1", r.ID)
	}
	_ = rd2.ws.CloseNow()
	if got := <-a; !isReason(got.err, prov.ReasonDisconnected) {
		t.Fatalf("pending call at socket loss: %v", got.err)
	}
}

func isReason(err error, reason string) bool {
	var u *sandbox.UnavailableError
	return errors.As(err, &u) && u.Reason == reason
}

// Invariants 5, 6, 7, 8: subscriptions exist before frames arrive; replay
// only to its requester; live to all; exit ends them; detach only when the
// last local listener goes.
func TestFanOutReplayLiveExitAndDetach(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	p := pl.srv.Provider()
	_, h := rawName(t, id)
	ctx := context.Background()

	spawned := make(chan *sandbox.Command, 1)
	go func() {
		c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh"}, sandbox.SpawnOptions{Stdin: true})
		if err != nil {
			t.Error(err)
		}
		spawned <- c
	}()
	sp := rd.next()
	if sp.Op != wire.OpSpawn || !sp.Stdin {
		t.Fatalf("spawn request %+v", sp)
	}
	// Reply, then early output replayed for the spawn, back to back: the
	// subscription must already exist when the replay arrives.
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-1"}}`, sp.ID))
	rd.send(sprintf(`{"stream":"stdout","session_id":"s-1","data":"ZWFybHk=","replay_for":%d}`, sp.ID))
	c1 := <-spawned
	if c1.SessionID != "s-1" {
		t.Fatalf("session id %q", c1.SessionID)
	}
	if ev := recv(t, c1, 5*time.Second); ev.Kind != sandbox.Stdout || string(ev.Data) != "early" {
		t.Fatalf("early output: %+v", ev)
	}

	attached := make(chan *sandbox.Command, 1)
	go func() {
		c, err := p.Attach(ctx, h, "s-1", sandbox.AttachOptions{})
		if err != nil {
			t.Error(err)
		}
		attached <- c
	}()
	at := rd.next()
	if at.Op != wire.OpAttach || at.SessionID != "s-1" {
		t.Fatalf("attach request %+v", at)
	}
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-1"}}`, at.ID))
	rd.send(sprintf(`{"stream":"stdout","session_id":"s-1","data":"ZWFybHk=","replay_for":%d}`, at.ID))
	rd.send(`{"stream":"stderr","session_id":"s-1","data":"bGl2ZQ=="}`)
	c2 := <-attached
	if ev := recv(t, c2, 5*time.Second); string(ev.Data) != "early" {
		t.Fatalf("attacher's replay: %+v", ev)
	}
	for _, c := range []*sandbox.Command{c1, c2} {
		if ev := recv(t, c, 5*time.Second); ev.Kind != sandbox.Stderr || string(ev.Data) != "live" {
			t.Fatalf("live frame: %+v", ev)
		}
	}
	// Stopping one of two listeners sends nothing; stopping the last sends
	// detach with id 0.
	_ = c2.Stop()
	_ = c1.Stop()
	det := rd.next()
	if det.Op != wire.OpDetach || det.ID != 0 || det.SessionID != "s-1" {
		t.Fatalf("want detach id 0 for s-1, got %+v", det)
	}
	rd.send(`{"id":0,"ok":true,"result":{}}`) // ignored

	// A live exit ends every subscription with exactly one exit.
	go func() {
		c, _ := p.Attach(ctx, h, "s-1", sandbox.AttachOptions{})
		attached <- c
	}()
	a1 := rd.next()
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-1"}}`, a1.ID))
	c3 := <-attached
	go func() {
		c, _ := p.Attach(ctx, h, "s-1", sandbox.AttachOptions{})
		attached <- c
	}()
	a2 := rd.next()
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-1"}}`, a2.ID))
	c4 := <-attached
	// A replayed exit for a2 ends only a2's subscription...
	rd.send(sprintf(`{"stream":"exit","session_id":"s-1","code":5,"replay_for":%d}`, a2.ID))
	if ev := recv(t, c4, 5*time.Second); ev.Kind != sandbox.Exit || ev.Code != 5 {
		t.Fatalf("replayed exit: %+v", ev)
	}
	// ...the live exit reaches the rest, once.
	rd.send(`{"stream":"exit","session_id":"s-1","code":5}`)
	rd.send(`{"stream":"exit","session_id":"s-1","code":6}`)
	if ev := recv(t, c3, 5*time.Second); ev.Kind != sandbox.Exit || ev.Code != 5 {
		t.Fatalf("live exit: %+v", ev)
	}
	for _, c := range []*sandbox.Command{c3, c4} {
		if _, ok := <-c.Events(); ok {
			t.Fatal("an event after the exit")
		}
	}
}

// Invariant 9 (platform side): socket loss fails waiting calls with
// runner_disconnected and ends subscriptions with an error, never an exit.
func TestSocketLossFailsCallersAndSubscribers(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	p := pl.srv.Provider()
	_, h := rawName(t, id)
	ctx := context.Background()
	spawned := make(chan *sandbox.Command, 1)
	go func() {
		c, _ := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh"}, sandbox.SpawnOptions{})
		spawned <- c
	}()
	sp := rd.next()
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-9"}}`, sp.ID))
	c := <-spawned
	errc := make(chan error, 1)
	go func() { _, err := p.Get(ctx, h); errc <- err }()
	rd.next()
	_ = rd.ws.CloseNow()
	if err := <-errc; !isReason(err, prov.ReasonDisconnected) {
		t.Fatalf("waiting call: %v", err)
	}
	ev := recv(t, c, 5*time.Second)
	if ev.Kind != sandbox.Error || !isReason(ev.Err, prov.ReasonDisconnected) {
		t.Fatalf("subscriber: %+v", ev)
	}
	if _, ok := <-c.Events(); ok {
		t.Fatal("an event after the error")
	}
	pl.offline(t)
	if _, err := p.Get(ctx, h); !isReason(err, prov.ReasonOffline) {
		t.Fatalf("after the loss: %v", err)
	}
}

// Invariant 15 (offline): every op is Unavailable{runner_offline}; a stdin
// write is a write failure; stop is total.
func TestOfflineRunner(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	p := pl.srv.Provider()
	ctx := context.Background()
	n, _ := prov.For("0f0e0d0c-0b0a-4908-8706-050403020100")
	h := sandbox.BuildHandle(prov.Name, n)
	check := func(what string, err error) {
		t.Helper()
		if !isReason(err, prov.ReasonOffline) || !sandbox.Transient(err) {
			t.Errorf("%s: %v, want Unavailable{runner_offline}", what, err)
		}
	}
	_, err := p.Create(ctx, n, sandbox.CreateOptions{})
	check("create", err)
	_, err = p.Get(ctx, h)
	check("get", err)
	check("destroy", p.Destroy(ctx, h))
	check("suspend", p.Suspend(ctx, h))
	_, err = p.Resume(ctx, h)
	check("resume", err)
	check("write_file", p.WriteFile(ctx, h, "x", nil, sandbox.WriteFileOptions{}))
	_, err = p.Exec(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.ExecOptions{})
	check("exec", err)
	_, err = p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
	check("spawn", err)
	_, err = p.ListSessions(ctx, h)
	check("list_sessions", err)
	_, err = p.Attach(ctx, h, "s-1", sandbox.AttachOptions{})
	check("attach", err)
	if got := p.HostPath(h, "/home/sprite/x"); got != "/home/sprite/x" {
		t.Errorf("host_path offline: %q", got)
	}
	names, err := p.ListAllNames(ctx)
	if err != nil || len(names) != 0 {
		t.Errorf("list_all_names with nobody online: %v, %v", names, err)
	}
	if caps := p.Capabilities(); caps.String() != sandbox.NewCapabilities(sandbox.CapSuspend, sandbox.CapAttach).String() {
		t.Errorf("capabilities %v", caps)
	}
	if _, err := p.Mint(ctx); !isReason(err, "no_runner_online") {
		t.Errorf("mint: %v", err)
	}
}

// Invariant 15 (names).
func TestNames(t *testing.T) {
	id := "0f0e0d0c-0b0a-4908-8706-050403020100"
	a, err := prov.For(id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := prov.For(id)
	if a == b || len(a) != 48 || !strings.HasPrefix(a, "runner-0f0e0d0c0b0a49088706050403020100-") {
		t.Fatalf("names %q %q", a, b)
	}
	for _, n := range []string{a, "runner-0F0E0D0C0B0A49088706050403020100-abcd1234", "runner-0f0e0d0c0b0a49088706050403020100-"} {
		if got, err := prov.Parse(n); err != nil || got != id {
			t.Errorf("Parse(%q) = %q, %v", n, got, err)
		}
	}
	for _, n := range []string{"fountain-abcd1234-deadbeef", "runner-short-x", "runner-" + strings.Repeat("z", 32) + "-abcd1234",
		"runner-0f0e0d0c0b0a49088706050403020100", "", "sprite-1"} {
		var inv *sandbox.InvalidError
		if _, err := prov.Parse(n); !errors.As(err, &inv) || inv.Reason != "not_a_runner_sandbox_name" {
			t.Errorf("Parse(%q) = %v", n, err)
		}
	}
	p := prov.NewServer(prov.ServerConfig{Logger: quiet}).Provider()
	var inv *sandbox.InvalidError
	if _, err := p.Create(context.Background(), "sprite-1", sandbox.CreateOptions{}); !errors.As(err, &inv) {
		t.Errorf("create of a non-runner name: %v", err)
	}
	if _, err := prov.For("nope"); err == nil {
		t.Error("For of a non-UUID")
	}
	a1, a2 := prov.StableID("acct", "laptop"), prov.StableID("acct", "laptop")
	if a1 != a2 || a1 == prov.StableID("other", "laptop") {
		t.Error("StableID")
	}
	if _, err := prov.Parse(prov.StableID("a", "b")); err == nil {
		t.Error("a bare id is not a name")
	}
	if n, _ := prov.For(prov.StableID("a", "b")); n == "" {
		t.Error("For(StableID)")
	}
}

// Invariant 2: refusals are HTTP statuses; nothing is registered.
func TestRefusalsAreHTTPStatuses(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{Auth: prov.AuthFunc(func(r *http.Request, key string) (string, error) {
		switch key {
		case token:
			return "acct", nil
		case "narrow":
			return "", prov.ErrForbidden
		}
		return "", prov.ErrUnauthorized
	})})
	get := func(key, path string, upgrade bool) int {
		req, _ := http.NewRequest("GET", pl.ts.URL+path, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		if upgrade {
			req.Header.Set("Upgrade", "websocket")
			req.Header.Set("Connection", "Upgrade")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if (resp.StatusCode == 401 || resp.StatusCode == 403) && !resp.Close {
			t.Errorf("%s key=%q: %d keeps the connection open", path, key, resp.StatusCode)
		}
		return resp.StatusCode
	}
	cases := []struct {
		key, path string
		upgrade   bool
		want      int
	}{
		{"", wire.Path + "?name=a", true, 401},
		{"wrong", wire.Path + "?name=a", true, 401},
		{"narrow", wire.Path + "?name=a", true, 403},
		{token, wire.Path + "?name=a", false, 400},
		{token, wire.Path + "?name=Not+Valid!", true, 400},
		{token, wire.Path + "?name=a&os=" + strings.Repeat("x", 41), true, 400},
	}
	for _, c := range cases {
		if got := get(c.key, c.path, c.upgrade); got != c.want {
			t.Errorf("%s key=%q upgrade=%v: %d, want %d", c.path, c.key, c.upgrade, got, c.want)
		}
	}
	if len(pl.host.Online()) != 0 {
		t.Fatal("a refused request registered a runner")
	}
	// A second connection of one name is 409.
	if _, _, err := dialRaw(t, pl, "dup"); err != nil {
		t.Fatal(err)
	}
	pl.online(t)
	_, resp, err := dialRaw(t, pl, "dup")
	if err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("duplicate: %v %v", resp, err)
	}
	// Disabled: 404, nothing registered.
	off := newPlatform(t, prov.ServerConfig{Disabled: true})
	_, resp, err = dialRaw(t, off, "a")
	if err == nil || resp == nil || resp.StatusCode != http.StatusNotFound || len(off.host.Online()) != 0 {
		t.Fatalf("disabled: %v %v", resp, err)
	}
}

// Invariant 2: close codes 1003 (binary or non-JSON), 4404 (deleted), 4409.
func TestCloseCodes(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	readErr := func(rd *rawDaemon) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			if _, _, err := rd.ws.Read(ctx); err != nil {
				return err
			}
		}
	}
	for _, frame := range []struct {
		typ websocket.MessageType
		b   string
	}{{websocket.MessageText, "nope"}, {websocket.MessageBinary, "\x00"}} {
		rd, _, err := dialRaw(t, pl, "junk")
		if err != nil {
			t.Fatal(err)
		}
		pl.online(t)
		_ = rd.ws.Write(context.Background(), frame.typ, []byte(frame.b))
		if code := websocket.CloseStatus(readErr(rd)); code != wire.CloseUnsupported {
			t.Fatalf("%q: close %d, want 1003", frame.b, code)
		}
		pl.offline(t)
	}
	rd, _, err := dialRaw(t, pl, "gone")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	if !pl.host.Delete(id) {
		t.Fatal("Delete found no connection")
	}
	if code := websocket.CloseStatus(readErr(rd)); code != wire.CloseDeleted {
		t.Fatalf("deleted: close %d, want 4404", code)
	}
	pl.offline(t)
	// A real second connection of one runner: the relay's own host
	// refuses it before the upgrade (409), and the first stays.
	rd, _, err = dialRaw(t, pl, "twin")
	if err != nil {
		t.Fatal(err)
	}
	id = pl.online(t)
	if _, resp, err := dialRaw(t, pl, "twin"); err == nil || resp == nil || resp.StatusCode != http.StatusConflict {
		t.Fatalf("a second connection of twin: %v %v, want 409", resp, err)
	}
	if c := pl.host.Whereis(id); c == nil {
		t.Fatal("the first connection of twin is gone after the second was refused")
	}
	served := func(pl *platform, rd *rawDaemon, id string) {
		t.Helper()
		_, h := rawName(t, id)
		res := make(chan error, 1)
		go func() { _, err := pl.srv.Provider().Get(context.Background(), h); res <- err }()
		r := rd.next()
		rd.send(sprintf(`{"id":%d,"ok":true,"result":{"status":"running","path":"/x"}}`, r.ID))
		if err := <-res; err != nil {
			t.Fatalf("a call to twin: %v", err)
		}
	}
	served(pl, rd, id)
	_ = rd.ws.CloseNow()
	pl.offline(t)

	// The 4409 path: a host where the newer registration of an id wins
	// and the older socket is let go (a cluster's claim moving to another
	// replica, natshost's lose), met by a real second connection.
	th := &takeoverHost{LocalHost: prov.NewLocalHost()}
	pl2 := newPlatform(t, prov.ServerConfig{Host: th})
	first, _, err := dialRaw(t, pl2, "twin")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "twin online", 10*time.Second, func() bool { return len(th.Online()) == 1 })
	second, _, err := dialRaw(t, pl2, "twin")
	if err != nil {
		t.Fatalf("the second connection of twin on a takeover host: %v", err)
	}
	if code := websocket.CloseStatus(readErr(first)); code != wire.CloseDuplicate {
		t.Fatalf("duplicate: the first socket's close %d, want 4409", code)
	}
	served(pl2, second, th.Online()[0].ID)
}

// takeoverHost lets the newest registration of an id win: the older
// connection is closed with 4409, as natshost does with a local socket
// whose claim another replica holds.
type takeoverHost struct{ *prov.LocalHost }

func (h *takeoverHost) Register(id string, c *prov.Conn) error {
	for {
		err := h.LocalHost.Register(id, c)
		if !errors.Is(err, prov.ErrAlreadyRegistered) {
			return err
		}
		if old := h.LocalHost.Whereis(id); old != nil {
			h.LocalHost.Unregister(id, old)
			old.Close(wire.CloseDuplicate, "runner connected elsewhere")
		}
	}
}

// Invariant 14: heartbeat and presence; an idle socket is closed.
type recordingHost struct {
	*prov.LocalHost
	mu     sync.Mutex
	events []string
}

func (h *recordingHost) rec(s string) {
	h.mu.Lock()
	h.events = append(h.events, s)
	h.mu.Unlock()
}

func (h *recordingHost) snapshot() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.events...)
}

func (h *recordingHost) Register(id string, c *prov.Conn) error {
	h.rec("register")
	return h.LocalHost.Register(id, c)
}

func (h *recordingHost) Unregister(id string, c *prov.Conn) {
	h.rec("unregister")
	h.LocalHost.Unregister(id, c)
}

func (h *recordingHost) Heartbeat(id string) {
	h.rec("heartbeat")
	h.LocalHost.Heartbeat(id)
}

func (h *recordingHost) Presence(i prov.Info, online bool) {
	if online {
		h.rec("online:" + i.Name)
	} else {
		h.rec("offline:" + i.Name)
		if h.Whereis(i.ID) != nil {
			h.rec("still-registered")
		}
	}
}

func TestHeartbeatPresenceAndIdleClose(t *testing.T) {
	rh := &recordingHost{LocalHost: prov.NewLocalHost()}
	pl := newPlatform(t, prov.ServerConfig{Host: rh, HeartbeatInterval: 20 * time.Millisecond, IdleTimeout: 300 * time.Millisecond})
	pl.host = rh.LocalHost
	// A daemon that answers pings stays connected past the idle timeout.
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	dm := startDaemon(t, pl.ts.URL, f, nil)
	pl.online(t)
	waitFor(t, "heartbeats", 5*time.Second, func() bool {
		n := 0
		for _, e := range rh.snapshot() {
			if e == "heartbeat" {
				n++
			}
		}
		return n >= 20 // 400 ms at least: past the idle timeout
	})
	if len(pl.host.Online()) != 1 {
		t.Fatal("a daemon answering pings was dropped")
	}
	_ = dm.stop()
	pl.offline(t)
	ev := rh.snapshot()
	want := []string{"register", "online:test-runner"}
	if ev[0] != want[0] || ev[1] != want[1] || ev[len(ev)-1] != "offline:test-runner" || ev[len(ev)-2] != "unregister" {
		t.Fatalf("presence order: %v", ev)
	}
	// A raw client that never reads never answers a ping: idle close.
	rd, _, err := dialRaw(t, pl, "sleepy")
	if err != nil {
		t.Fatal(err)
	}
	_ = rd
	pl.online(t)
	pl.offline(t)
}

// A frame over the 64 MiB read limit closes the socket (1009); the waiting
// caller gets runner_disconnected; nothing panics or hangs.
func TestHugeFrameClosesSocket(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "huge")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	p := pl.srv.Provider()
	_, h := rawName(t, id)
	errc := make(chan error, 1)
	// A deadline far past the provider's default: a 64 MiB frame takes a
	// while on a loaded machine under the race detector, and the call must
	// end by the socket's close, not by its deadline.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	go func() { _, err := p.Get(ctx, h); errc <- err }()
	r := rd.next()
	big := make([]byte, wire.ReadLimit+1)
	copy(big, sprintf(`{"id":%d,"ok":true,"result":{"pad":"`, r.ID))
	for i := len(sprintf(`{"id":%d,"ok":true,"result":{"pad":"`, r.ID)); i < len(big)-3; i++ {
		big[i] = 'a'
	}
	copy(big[len(big)-3:], `"}}`)
	_ = rd.ws.Write(context.Background(), websocket.MessageText, big)
	if err := <-errc; !isReason(err, prov.ReasonDisconnected) {
		t.Fatalf("caller after a huge frame: %v", err)
	}
	pl.offline(t)
}

// GET /api/runners lists the online runners; DELETE /api/runners/<id>
// closes the runner's socket with 4404 (the daemon re-registers).
func TestListAndDeleteEndpoints(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	do := func(method, path, key string) (*http.Response, []byte) {
		req, _ := http.NewRequest(method, pl.ts.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		return resp, []byte(b.String())
	}
	resp, body := do("GET", prov.ListPath, token)
	var list struct {
		Data []prov.Info `json:"data"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(body, &list) != nil || len(list.Data) != 1 || list.Data[0].ID != id || list.Data[0].Name != "test-runner" {
		t.Fatalf("list: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do("GET", prov.ListPath, "wrong"); resp.StatusCode != 401 {
		t.Fatalf("list without a key: %d", resp.StatusCode)
	}
	if resp, _ := do("DELETE", prov.ListPath+"/nope", token); resp.StatusCode != 404 {
		t.Fatalf("delete unknown: %d", resp.StatusCode)
	}
	first := pl.host.Whereis(id)
	if resp, _ := do("DELETE", prov.ListPath+"/"+id, token); resp.StatusCode != 204 {
		t.Fatalf("delete: %d", resp.StatusCode)
	}
	<-first.Done()
	waitFor(t, "re-registration", 10*time.Second, func() bool {
		c := pl.host.Whereis(id)
		return c != nil && c != first
	})
}

// Invariant 11: stdin totality. not_found and command_exited are
// ErrCommandExited; a transport failure is WriteFailed; close_stdin
// tolerates a gone session; Stop is total.
func TestStdinMapping(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	p := pl.srv.Provider()
	_, h := rawName(t, id)
	ctx := context.Background()
	spawned := make(chan *sandbox.Command, 1)
	go func() {
		c, _ := p.Spawn(ctx, h, sandbox.Cmd{Name: "sh"}, sandbox.SpawnOptions{Stdin: true})
		spawned <- c
	}()
	sp := rd.next()
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"session_id":"s-5"}}`, sp.ID))
	c := <-spawned
	answer := func(reply string, call func() error) error {
		t.Helper()
		errc := make(chan error, 1)
		go func() { errc <- call() }()
		r := rd.next()
		if r.SessionID != "s-5" || r.Name != h.Name {
			t.Fatalf("request %+v", r)
		}
		rd.send(sprintf(reply, r.ID))
		return <-errc
	}
	write := func() error { return c.WriteStdin(ctx, []byte("x")) }
	closeIn := func() error { return c.CloseStdin(ctx) }
	if err := answer(`{"id":%d,"ok":false,"error":"not_found","detail":""}`, write); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Errorf("not_found: %v", err)
	}
	if err := answer(`{"id":%d,"ok":false,"error":"command_exited","detail":""}`, write); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Errorf("command_exited: %v", err)
	}
	var inv *sandbox.InvalidError
	if err := answer(`{"id":%d,"ok":false,"error":"invalid","detail":"bad"}`, write); !errors.As(err, &inv) {
		t.Errorf("invalid: %v", err)
	}
	if err := answer(`{"id":%d,"ok":false,"error":"not_found","detail":""}`, closeIn); err != nil {
		t.Errorf("close_stdin not_found: %v", err)
	}
	if err := answer(`{"id":%d,"ok":false,"error":"command_exited","detail":""}`, closeIn); err != nil {
		t.Errorf("close_stdin command_exited: %v", err)
	}
	// No answer within the caller's deadline: WriteFailed{runner_timeout}.
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	var wf *sandbox.WriteFailedError
	if err := c.WriteStdin(tctx, []byte("x")); !errors.As(err, &wf) || !isReason(err, prov.ReasonTimeout) {
		t.Errorf("timeout: %v", err)
	}
	rd.next() // the unanswered stdin
	_ = c.Stop()
	_ = c.Stop()
	if r := rd.next(); r.Op != wire.OpDetach || r.ID != 0 {
		t.Fatalf("stop: %+v", r)
	}
	if err := c.WriteStdin(ctx, []byte("x")); !errors.Is(err, sandbox.ErrCommandExited) {
		t.Errorf("after stop: %v", err)
	}
}

// TestProxyClosesOnNonJSON: text that is not JSON on the proxy socket ends
// it with 1003, as a binary frame does; JSON that is no request is
// answered invalid and the socket stays.
func TestProxyClosesOnNonJSON(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + prov.ProxyPath
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	if err := ws.Write(ctx, websocket.MessageText, []byte(`{"id":7}`)); err != nil {
		t.Fatal(err)
	}
	_, b, err := ws.Read(ctx)
	if err != nil || !strings.Contains(string(b), `"id":7`) || !strings.Contains(string(b), "invalid") {
		t.Fatalf("a request without op: %s %v", b, err)
	}
	if err := ws.Write(ctx, websocket.MessageText, []byte("GET / HTTP/1.1")); err != nil {
		t.Fatal(err)
	}
	_, _, err = ws.Read(ctx)
	if websocket.CloseStatus(err) != websocket.StatusUnsupportedData {
		t.Fatalf("after non-JSON text: %v, want close 1003", err)
	}
}

// TestCapabilitiesBelongToTheRunner: a runner without force termination
// online beside one with it takes nothing from the other's sandboxes: a
// forced termination there goes through (the registry gated it on the
// intersection over every runner, so it failed for all), and the other's
// sandbox says it cannot.
func TestCapabilitiesBelongToTheRunner(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	full := pl.online(t)
	if _, _, err := dialRaw(t, pl, "old"); err != nil { // reports no caps
		t.Fatal(err)
	}
	var old string
	waitFor(t, "the second runner", 5*time.Second, func() bool {
		for _, i := range pl.host.Online() {
			if i.ID != full {
				old = i.ID
			}
		}
		return old != ""
	})
	p := pl.srv.Provider()
	if p.Capabilities().Has(sandbox.CapForceTerminateSession) {
		t.Fatal("force termination advertised for every sandbox while one runner lacks it")
	}
	reg := sandbox.NewRegistry(p)
	ctx := context.Background()
	h, err := reg.Create(ctx, prov.Name, namer(full)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	caps, err := reg.CapabilitiesOf(ctx, h)
	if err != nil || !caps.Has(sandbox.CapForceTerminateSession) {
		t.Fatalf("capabilities of a sandbox on the full runner: %v %v", caps, err)
	}
	c, err := reg.Spawn(ctx, h, fakeCmd("out:up", "stay"), sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, c, 5*time.Second); string(ev.Data) != "up" {
		t.Fatalf("%+v", ev)
	}
	if err := reg.TerminateSession(ctx, h, c.SessionID, sandbox.TerminateOptions{Mode: sandbox.Force}); err != nil {
		t.Fatalf("forced termination on the runner that offers it: %v", err)
	}
	for ev := recv(t, c, 5*time.Second); !ev.Terminal(); ev = recv(t, c, 5*time.Second) {
	}
	oldH := sandbox.BuildHandle(prov.Name, namer(old)())
	caps, err = reg.CapabilitiesOf(ctx, oldH)
	if err != nil || caps.Has(sandbox.CapForceTerminateSession) || caps.Has(sandbox.CapTerminateSession) {
		t.Fatalf("capabilities of a sandbox on the old runner: %v %v", caps, err)
	}
	if err := reg.TerminateSession(ctx, oldH, "s1", sandbox.TerminateOptions{Mode: sandbox.Force}); !errors.Is(err, sandbox.ErrNotSupported) {
		t.Fatalf("forced termination on the old runner: %v, want not supported", err)
	}
}

// TestListPartsSurviveABadRunner: a runner that answers a list badly is
// one failed part; the other runner's sandboxes are listed whole, and
// ListAllNames, which is whole or nothing, says ErrTruncated naming it.
func TestListPartsSurviveABadRunner(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	good := pl.online(t)
	rd, _, err := dialRaw(t, pl, "bad")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two runners", 5*time.Second, func() bool { return len(pl.host.Online()) == 2 })
	p := pl.srv.Provider()
	ctx := context.Background()
	h, err := p.Create(ctx, namer(good)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	go func() { // the bad runner answers its list with junk
		req := rd.next()
		rd.send(sprintf(`{"id":%d,"ok":true,"result":{"names":"not a list"}}`, req.ID))
	}()
	parts, err := p.ListParts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var gotGood, gotBad bool
	for _, part := range parts {
		switch part.Source {
		case "bad":
			gotBad = part.Err != nil
		default:
			gotGood = part.Err == nil && len(part.Names) == 1 && part.Names[0] == h.Name
		}
	}
	if !gotGood || !gotBad {
		t.Fatalf("parts %+v", parts)
	}
	go func() {
		req := rd.next()
		rd.send(sprintf(`{"id":%d,"ok":true,"result":{"names":"not a list"}}`, req.ID))
	}()
	if _, err := p.ListAllNames(ctx); !errors.Is(err, sandbox.ErrTruncated) || !strings.Contains(err.Error(), "bad") {
		t.Fatalf("ListAllNames with a bad runner: %v, want truncated naming it", err)
	}
}

// TestProxyIdleSocketsClose: a proxy client that holds its socket and does
// nothing is closed (1001) after ProxyIdleTimeout; one with a session's
// output coming is not idle.
func TestProxyIdleSocketsClose(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{ProxyIdleTimeout: 200 * time.Millisecond})
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	startDaemon(t, pl.ts.URL, f, nil)
	id := pl.online(t)
	u := strings.Replace(pl.ts.URL, "http", "ws", 1) + prov.ProxyPath
	dial := func() *websocket.Conn {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ws, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + token}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = ws.CloseNow() })
		return ws
	}
	idle := dial()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, _, err := idle.Read(ctx); websocket.CloseStatus(err) != websocket.StatusGoingAway {
		t.Fatalf("an idle proxy socket: %v, want close 1001", err)
	}
	// A client with a running session keeps its socket.
	// (Made in-process, so the client's first request is the spawn: no
	// idle gap before its subscription.)
	h, err := pl.srv.Provider().Create(context.Background(), namer(id)(), sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cl := prov.NewClient(pl.ts.URL, token)
	defer cl.Close()
	p := prov.NewProvider(cl, prov.ProviderOptions{})
	c, err := p.Spawn(context.Background(), h, fakeCmd("out:up", "stay"), sandbox.SpawnOptions{Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if ev := recv(t, c, 5*time.Second); string(ev.Data) != "up" {
		t.Fatalf("%+v", ev)
	}
	time.Sleep(600 * time.Millisecond) // three idle periods with a subscription
	if err := c.WriteStdin(context.Background(), []byte("still\n")); err != nil {
		t.Fatalf("the subscribed client's socket was closed: %v", err)
	}
	if ev := recv(t, c, 5*time.Second); ev.Kind == sandbox.Error {
		t.Fatalf("the session ended: %v", ev.Err)
	}
	c.Stop()
}
