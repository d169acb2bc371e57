package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/managoat/managoat/internal/testenv"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/runner"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) {
	local.MaybeRunSupervisorWith(openTrusted)
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

var quiet = slog.New(slog.DiscardHandler)

func TestDialURL(t *testing.T) {
	q := url.Values{"name": {"a b"}}
	for in, want := range map[string]string{
		"http://h:8080":         "ws://h:8080/api/runners/ws?name=a+b",
		"https://h/":            "wss://h/api/runners/ws?name=a+b",
		"https://h/base//":      "wss://h/base/api/runners/ws?name=a+b",
		"http://127.0.0.1:9/x/": "ws://127.0.0.1:9/x/api/runners/ws?name=a+b",
	} {
		if got, err := runner.DialURL(in, q); err != nil || got != want {
			t.Errorf("DialURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	var perm *runner.PermanentError
	if _, err := runner.DialURL("ftp://h", q); !errors.As(err, &perm) {
		t.Errorf("ftp: %v", err)
	}
}

func TestBackoff(t *testing.T) {
	var got []string
	for n := 0; n <= 8; n++ {
		got = append(got, runner.Backoff(n, time.Second, 30*time.Second).String())
	}
	if s := strings.Join(got, " "); s != "1s 1s 2s 4s 8s 16s 30s 30s 30s" {
		t.Fatalf("backoff %s", s)
	}
}

func newDaemon(t *testing.T, u string, p sandbox.Provider, mod func(*runner.Config)) *runner.Daemon {
	t.Helper()
	cfg := runner.Config{URL: u, Token: "tok", Name: "laptop", Root: "/srv/sb", Provider: p, Logger: quiet,
		Version: "1.2.3", Hostname: "box", BackoffBase: 5 * time.Millisecond, BackoffMax: 40 * time.Millisecond, PingInterval: -1}
	if mod != nil {
		mod(&cfg)
	}
	d, err := runner.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Close)
	return d
}

func newFake(t *testing.T) *fake.Provider {
	f := fake.New()
	t.Cleanup(func() { _ = f.Close() })
	return f
}

// Invariant 1: the dial carries the identity and the key; 400/401/403/404
// stop the daemon for good with a clear message.
func TestPermanentRefusals(t *testing.T) {
	for status, want := range map[int]string{
		400: "rejected the runner (400): bad name",
		401: "refused the API key (401): bad name",
		403: "refused the API key (403): bad name",
		404: "self-hosted runners are disabled",
	} {
		var seen *http.Request
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen = r
			w.WriteHeader(status)
			fmt.Fprint(w, "  bad name \n")
		}))
		d := newDaemon(t, ts.URL, newFake(t), nil)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := d.Run(ctx)
		cancel()
		ts.Close()
		var perm *runner.PermanentError
		if !errors.As(err, &perm) || perm.Status != status || !strings.Contains(err.Error(), want) {
			t.Errorf("%d: %v", status, err)
			continue
		}
		q := seen.URL.Query()
		if seen.URL.Path != wire.Path || q.Get("name") != "laptop" || q.Get("hostname") != "box" || q.Get("version") != "1.2.3" ||
			q.Get("root") != "/srv/sb" || q.Get("os") == "" || q.Get("arch") == "" ||
			q.Get("caps") != "create_limits,create_disk_limit,capacity,attach_offset,network_policy,read_file,terminate_session,force_terminate_session,binary_stream" ||
			seen.Header.Get("Authorization") != "Bearer tok" {
			t.Errorf("dial request %s %v %v", seen.URL, q, seen.Header)
		}
	}
}

type retry struct {
	attempt int
	delay   time.Duration
	err     error
}

// Invariant 1: 409, other statuses and abrupt drops retry with growing
// backoff; a clean close resets the counter, and so does a connection that
// was made (Fountain's daemon reset it on a clean close only, so a platform's
// restart after a run of refusals cost a daemon up to 30 s).
func TestRetryAndBackoffReset(t *testing.T) {
	var mu sync.Mutex
	n := 0
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		n++
		k := n
		mu.Unlock()
		switch k {
		case 1, 2, 5:
			w.WriteHeader(http.StatusConflict)
			return
		case 3:
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		switch k {
		case 6:
			_ = ws.Close(websocket.StatusNormalClosure, "bye")
		case 7:
			_ = ws.Close(wire.CloseDuplicate, "a runner named laptop is already connected")
		default:
			_ = ws.Close(wire.CloseDeleted, "runner deleted")
		}
	}))
	defer ts.Close()
	var rs []retry
	ctx, cancel := context.WithCancel(context.Background())
	d := newDaemon(t, ts.URL, newFake(t), func(c *runner.Config) {
		c.OnDisconnect = func(a int, dl time.Duration, err error) {
			rs = append(rs, retry{a, dl, err})
			if len(rs) == 7 {
				cancel()
			}
		}
	})
	if err := d.Run(ctx); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		attempt int
		delay   time.Duration
		clean   bool
		substr  string
	}{
		{1, 5 * time.Millisecond, false, "already connected"},
		{2, 10 * time.Millisecond, false, "already connected"},
		{3, 20 * time.Millisecond, false, "HTTP 502"},
		{1, 5 * time.Millisecond, false, "was deleted"},        // k=4: connected, so the count starts again
		{2, 10 * time.Millisecond, false, "already connected"}, // k=5
		{0, 5 * time.Millisecond, true, ""},                    // k=6: clean close resets
		{1, 5 * time.Millisecond, false, "already connected"},  // k=7: 4409 is retryable
	}
	for i, w := range want {
		r := rs[i]
		if r.attempt != w.attempt || r.delay != w.delay || (r.err == nil) != w.clean || (r.err != nil && !strings.Contains(r.err.Error(), w.substr)) {
			t.Errorf("retry %d: %+v, want %+v", i, r, w)
		}
	}
}

// MF keep-alive: a platform that never answers pings is dropped with an
// error (not a clean close).
func TestKeepAliveDropsSilentPlatform(t *testing.T) {
	hold := make(chan struct{})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		<-hold // never reads: pings go unanswered
		_ = ws.CloseNow()
	}))
	defer ts.Close()
	defer close(hold)
	d := newDaemon(t, ts.URL, newFake(t), func(c *runner.Config) {
		c.PingInterval, c.PingTimeout = 20*time.Millisecond, 50*time.Millisecond
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.Once(ctx)
	if err == nil || !strings.Contains(err.Error(), "ping") {
		t.Fatalf("Once = %v, want a keep-alive error", err)
	}
}

// rawPlatform accepts daemon connections and hands them to the test.
type rawPlatform struct {
	ts    *httptest.Server
	conns chan *websocket.Conn
}

func newRawPlatform(t *testing.T) *rawPlatform {
	rp := &rawPlatform{conns: make(chan *websocket.Conn, 4)}
	rp.ts = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		ws.SetReadLimit(wire.ReadLimit)
		rp.conns <- ws
	}))
	t.Cleanup(rp.ts.Close)
	return rp
}

type frame struct {
	ID        *int64          `json:"id"`
	OK        bool            `json:"ok"`
	Result    json.RawMessage `json:"result"`
	Error     string          `json:"error"`
	Detail    *string         `json:"detail"`
	Stream    string          `json:"stream"`
	SessionID string          `json:"session_id"`
	Data      []byte          `json:"data"`
	Code      *int            `json:"code"`
	ReplayFor int64           `json:"replay_for"`
}

type pconn struct {
	t  *testing.T
	ws *websocket.Conn
}

func (rp *rawPlatform) accept(t *testing.T) *pconn {
	t.Helper()
	select {
	case ws := <-rp.conns:
		t.Cleanup(func() { _ = ws.CloseNow() })
		return &pconn{t: t, ws: ws}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon did not connect")
	}
	return nil
}

func (c *pconn) send(s string, a ...any) {
	c.t.Helper()
	if err := c.ws.Write(context.Background(), websocket.MessageText, []byte(fmt.Sprintf(s, a...))); err != nil {
		c.t.Fatal(err)
	}
}

func (c *pconn) next() frame {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, b, err := c.ws.Read(ctx)
	if err != nil {
		c.t.Fatalf("platform read: %v", err)
	}
	var f frame
	if err := json.Unmarshal(b, &f); err != nil {
		c.t.Fatalf("daemon sent %s: %v", b, err)
	}
	return f
}

// reply reads frames until the reply with id.
func (c *pconn) reply(id int64) frame {
	c.t.Helper()
	for {
		f := c.next()
		if f.ID != nil && *f.ID == id {
			return f
		}
		if f.ID != nil {
			c.t.Fatalf("reply %d while waiting for %d", *f.ID, id)
		}
	}
}

func (c *pconn) call(id int64, s string, a ...any) frame {
	c.t.Helper()
	c.send(s, a...)
	return c.reply(id)
}

func serveRaw(t *testing.T, p sandbox.Provider) (*rawPlatform, *pconn, func()) {
	rp := newRawPlatform(t)
	d := newDaemon(t, rp.ts.URL, p, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return rp, rp.accept(t), stop
}

// Invariant 4: every op's result or error; unknown op → not_supported with
// the op as detail; bad frames never hang the caller.
func TestOps(t *testing.T) {
	_, c, _ := serveRaw(t, newFake(t))
	ok := func(f frame) frame {
		t.Helper()
		if !f.OK {
			t.Fatalf("want ok, got error %q %v", f.Error, *f.Detail)
		}
		return f
	}
	fail := func(f frame, code string) {
		t.Helper()
		if f.OK || f.Error != code || f.Detail == nil {
			t.Fatalf("want error %q with a detail key, got %+v", code, f)
		}
	}
	ok(c.call(1, `{"id":1,"op":"create","name":"sb"}`))
	ok(c.call(2, `{"id":2,"op":"create","name":"sb"}`))
	if f := ok(c.call(3, `{"id":3,"op":"get","name":"sb"}`)); !strings.Contains(string(f.Result), `"status":"running"`) {
		t.Fatalf("get %s", f.Result)
	}
	ok(c.call(4, `{"id":4,"op":"create","name":"a"}`))
	if f := ok(c.call(5, `{"id":5,"op":"list"}`)); string(f.Result) != `{"names":["a","sb"]}` {
		t.Fatalf("list %s", f.Result)
	}
	fail(c.call(6, `{"id":6,"op":"get","name":"none"}`), "not_found")
	ok(c.call(7, `{"id":7,"op":"destroy","name":"none"}`))
	fail(c.call(8, `{"id":8,"op":"create","name":"../escape"}`), "invalid")
	f := c.call(9, `{"id":9,"op":"frobnicate","name":"sb"}`)
	fail(f, "not_supported")
	if *f.Detail != "frobnicate" {
		t.Fatalf("unknown op detail %q", *f.Detail)
	}
	f = c.call(10, `{"id":10,"op":"write_file","name":"sb","path":"/x","data":"not base64!","mode":null}`)
	fail(f, "invalid")
	if !strings.Contains(*f.Detail, "data is not base64") {
		t.Fatalf("detail %q", *f.Detail)
	}
	ok(c.call(11, `{"id":11,"op":"write_file","name":"sb","path":"/x","data":"QT0xCg==","mode":384}`))
	fail(c.call(12, `{"id":12,"op":"stdin","name":"sb","session_id":"s-404","data":"eA=="}`), "not_found")
	ok(c.call(13, `{"id":13,"op":"detach","session_id":"s-404"}`))
	ok(c.call(0, `{"id":0,"op":"detach","session_id":"s-404"}`))
	f = c.call(14, `{"id":14,"op":"exec","name":"sb","cmd":"emit","args":["out:hi","err:no","exit:3"],"env":[["K","v"],["bad"]],"dir":null,"timeout_ms":null}`)
	if !f.OK || !strings.Contains(string(f.Result), `"output":"aGk="`) || !strings.Contains(string(f.Result), `"code":3`) {
		t.Fatalf("exec %s", f.Result)
	}
	f = c.call(15, `{"id":15,"op":"exec","name":"sb","cmd":"emit","args":["out:hi","err:no"],"stderr_to_stdout":true}`)
	if !strings.Contains(string(f.Result), `"output":"aGlubw=="`) {
		t.Fatalf("merged exec %s", f.Result)
	}
	fail(c.call(16, `{"id":16,"op":"exec","name":"none","cmd":"emit"}`), "not_found")
	ok(c.call(17, `{"id":17,"op":"suspend","name":"sb"}`))
	if f := ok(c.call(18, `{"id":18,"op":"get","name":"sb"}`)); !strings.Contains(string(f.Result), `"status":"suspended"`) {
		t.Fatalf("get after suspend %s", f.Result)
	}
	ok(c.call(19, `{"id":19,"op":"resume","name":"sb"}`))
	fail(c.call(20, `{"id":20,"op":"list_sessions","name":"none"}`), "not_found")
	if f := ok(c.call(21, `{"id":21,"op":"list_sessions","name":"sb"}`)); string(f.Result) != `{"sessions":[]}` {
		t.Fatalf("empty sessions %s", f.Result)
	}
	ok(c.call(22, `{"id":22,"op":"network_policy","name":"sb","allow":[]}`))
	// A malformed frame with an id gets an invalid reply, not silence; one
	// without is skipped; a binary frame is skipped; the socket lives.
	fail(c.call(23, `{"id":23,"op":5}`), "invalid")
	c.send(`not json`)
	_ = c.ws.Write(context.Background(), websocket.MessageBinary, []byte{0})
	ok(c.call(24, `{"id":24,"op":"destroy","name":"sb"}`))
	fail(c.call(25, `{"id":25,"op":"get","name":"sb"}`), "not_found")
}

// Invariants 5, 7, 10, 11: spawn replies before any frame; early output is
// replayed to the spawner; live frames are untagged; attach replays the
// whole journal tagged with its id; one exit; stdin after exit is
// command_exited; a failing command is data.
func TestSpawnAttachReplayOrder(t *testing.T) {
	_, c, _ := serveRaw(t, newFake(t))
	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":7,"op":"spawn","name":"sb","cmd":"emit","args":["out:ready","stay"],"stdin":true,"tty":false,"detachable":false}`)
	first := c.next()
	if first.ID == nil || *first.ID != 7 || !first.OK {
		t.Fatalf("first frame after spawn is not its reply: %+v", first)
	}
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(first.Result, &res)
	sid := res.SessionID
	f := c.next()
	// Output produced before the reply is replayed (tagged 7); after it, live.
	if f.Stream != "stdout" || string(f.Data) != "ready" || (f.ReplayFor != 7 && f.ReplayFor != 0) || f.SessionID != sid {
		t.Fatalf("early output must reach the spawner: %+v", f)
	}
	c.send(`{"id":8,"op":"stdin","name":"sb","session_id":%q,"data":"cGluZw=="}`, sid)
	var live []frame
	for len(live) == 0 {
		g := c.next()
		if g.ID == nil {
			live = append(live, g)
		} else if !g.OK {
			t.Fatalf("stdin: %+v", g)
		}
	}
	if live[0].ReplayFor != 0 || string(live[0].Data) != "echo:ping" {
		t.Fatalf("live frame %+v", live[0])
	}
	// Attach: reply, then the whole journal tagged 9.
	c.send(`{"id":9,"op":"attach","name":"sb","session_id":%q}`, sid)
	g := c.next()
	if g.ID != nil && *g.ID == 8 && g.OK {
		g = c.next() // the stdin's reply may come after its echo
	}
	if g.ID == nil || *g.ID != 9 || !strings.Contains(string(g.Result), sid) {
		t.Fatalf("attach reply: %+v", g)
	}
	var replay []string
	for len(replay) < 2 {
		g := c.next()
		if g.ReplayFor != 9 {
			t.Fatalf("untagged frame inside the replay: %+v", g)
		}
		replay = append(replay, string(g.Data))
	}
	if strings.Join(replay, "") != "readyecho:ping" {
		t.Fatalf("replay %q", replay)
	}
	c.send(`{"id":10,"op":"stdin_close","name":"sb","session_id":%q}`, sid)
	exits := 0
	for exits == 0 {
		g := c.next()
		if g.Stream == "exit" {
			if *g.Code != 0 || g.ReplayFor != 0 {
				t.Fatalf("exit %+v", g)
			}
			exits++
		}
	}
	if g := c.call(11, `{"id":11,"op":"stdin","name":"sb","session_id":%q,"data":"eA=="}`, sid); g.OK || g.Error != "command_exited" {
		t.Fatalf("stdin after exit: %+v", g)
	}
	if g := c.call(12, `{"id":12,"op":"stdin_close","name":"sb","session_id":%q}`, sid); !g.OK {
		t.Fatalf("stdin_close after exit: %+v", g)
	}
	g = c.call(13, `{"id":13,"op":"list_sessions","name":"sb"}`)
	if !strings.Contains(string(g.Result), `"id":"`+sid+`"`) || !strings.Contains(string(g.Result), `"exit_code":0`) || !strings.Contains(string(g.Result), `"tty":false`) {
		t.Fatalf("list_sessions %s", g.Result)
	}
	// Attaching to a finished session replays through its one exit.
	c.send(`{"id":14,"op":"attach","name":"sb","session_id":%q}`, sid)
	c.reply(14)
	var kinds []string
	for {
		g := c.next()
		if g.ReplayFor != 14 {
			t.Fatalf("frame %+v", g)
		}
		kinds = append(kinds, g.Stream)
		if g.Stream == "exit" {
			break
		}
	}
	if strings.Join(kinds, ",") != "stdout,stdout,exit" {
		t.Fatalf("finished replay %v", kinds)
	}
	if g := c.call(15, `{"id":15,"op":"attach","name":"sb","session_id":"s-none"}`); g.Error != "not_found" {
		t.Fatalf("attach unknown: %+v", g)
	}
}

// D2: an attach to a session that is already attached and producing output
// neither loses nor duplicates a byte: both listeners' views are the whole
// output, once.
func TestAttachDuringOutputNoDuplicates(t *testing.T) {
	_, c, _ := serveRaw(t, newFake(t))
	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["out:r","stay"],"stdin":true}`)
	r := c.reply(2)
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(r.Result, &res)
	sid := res.SessionID
	const n = 200
	for i := 0; i < n; i++ {
		c.send(`{"id":%d,"op":"stdin","name":"sb","session_id":%q,"data":%q}`, 100+i, sid, wire.EncodeData([]byte(fmt.Sprintf("%d,", i))))
		if i == n/2 {
			c.send(`{"id":3,"op":"attach","name":"sb","session_id":%q}`, sid)
		}
	}
	c.send(`{"id":4,"op":"stdin_close","name":"sb","session_id":%q}`, sid)
	var spawner, attacher strings.Builder
	attached := false
	// The attach may be served before the session ends (its replay, then
	// live frames) or after (its replay holds the whole session, exit
	// included): read until both views have their exit.
	spawnerDone, attacherDone := false, false
	for !spawnerDone || !attacherDone {
		f := c.next()
		if f.ID != nil {
			if *f.ID == 3 {
				if f.Error != "" {
					t.Fatalf("attach: %+v", f)
				}
				attached = true
			}
			continue
		}
		switch {
		case f.ReplayFor == 2:
			spawner.Write(f.Data)
		case f.ReplayFor == 3:
			attacher.Write(f.Data)
			if f.Stream == "exit" {
				attacherDone = true
			}
		case f.ReplayFor == 0 && f.Stream == "stdout":
			spawner.Write(f.Data)
			if attached {
				attacher.Write(f.Data)
			}
		case f.ReplayFor == 0 && f.Stream == "exit":
			spawnerDone = true
			if attached {
				attacherDone = true
			}
		}
	}
	var want strings.Builder
	want.WriteString("r")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&want, "echo:%d,", i)
	}
	if spawner.String() != want.String() || attacher.String() != want.String() {
		t.Fatalf("spawner %d bytes, attacher %d bytes, want %d each\nspawner  %q\nattacher %q", spawner.Len(), attacher.Len(), want.Len(), spawner.String(), attacher.String())
	}
}

// Invariant 9 and D1: sessions outlive the socket; after a reconnect,
// list_sessions and attach deliver replay and live output on the new socket.
func TestReattachAfterReconnectRebindsOutput(t *testing.T) {
	rp, c, _ := serveRaw(t, newFake(t))
	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["out:ready","stay"],"stdin":true}`)
	r := c.reply(2)
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(r.Result, &res)
	sid := res.SessionID
	if f := c.next(); string(f.Data) != "ready" {
		t.Fatalf("%+v", f)
	}
	_ = c.ws.CloseNow() // an abrupt drop: the daemon reconnects
	c2 := rp.accept(t)
	g := c2.call(1, `{"id":1,"op":"list_sessions","name":"sb"}`)
	if !strings.Contains(string(g.Result), sid) {
		t.Fatalf("list_sessions after reconnect: %s", g.Result)
	}
	c2.send(`{"id":2,"op":"attach","name":"sb","session_id":%q,"stdin":true}`, sid)
	c2.reply(2)
	// The daemon dropped the detached session and takes it back from the
	// provider: its earlier output arrives on the new socket, tagged for
	// this attach or (while the provider is still replaying) live.
	if f := c2.next(); (f.ReplayFor != 2 && f.ReplayFor != 0) || string(f.Data) != "ready" {
		t.Fatalf("replay on the new socket: %+v", f)
	}
	c2.send(`{"id":3,"op":"stdin","name":"sb","session_id":%q,"data":"YWdhaW4="}`, sid)
	for {
		f := c2.next()
		if f.ID != nil {
			continue
		}
		if f.ReplayFor != 0 || string(f.Data) != "echo:again" {
			t.Fatalf("live on the new socket: %+v", f)
		}
		break
	}
}

// D6: a detached session leaves the daemon's memory; stdin and attach take
// it back from the provider, and no byte is lost meanwhile.
func TestDetachedSessionLeavesMemory(t *testing.T) {
	rp := newRawPlatform(t)
	d := newDaemon(t, rp.ts.URL, newFake(t), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	c := rp.accept(t)
	c.call(1, `{"id":1,"op":"create","name":"sb"}`)
	c.send(`{"id":2,"op":"spawn","name":"sb","cmd":"emit","args":["out:ready","stay"],"stdin":true}`)
	r := c.reply(2)
	var res struct {
		SessionID string `json:"session_id"`
	}
	_ = json.Unmarshal(r.Result, &res)
	sid := res.SessionID
	if f := c.next(); string(f.Data) != "ready" {
		t.Fatalf("%+v", f)
	}
	if d.Held() != 1 {
		t.Fatalf("held %d", d.Held())
	}
	c.call(0, `{"id":0,"op":"detach","session_id":%q}`, sid)
	deadline := time.Now().Add(5 * time.Second)
	for d.Held() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a detached session stayed in memory")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if g := c.call(3, `{"id":3,"op":"stdin","name":"sb","session_id":%q,"data":"b2s="}`, sid); !g.OK {
		t.Fatalf("stdin to a dropped session: %+v", g)
	}
	c.send(`{"id":4,"op":"attach","name":"sb","session_id":%q}`, sid)
	c.reply(4)
	var got strings.Builder
	for got.String() != "readyecho:ok" {
		f := c.next()
		if f.ID != nil || (f.ReplayFor != 4 && f.ReplayFor != 0) {
			t.Fatalf("%+v", f)
		}
		got.Write(f.Data)
		if got.Len() > len("readyecho:ok") {
			t.Fatalf("got %q", got.String())
		}
	}
	if d.Held() != 1 {
		t.Fatalf("held %d after attach", d.Held())
	}
}

func TestDefaultName(t *testing.T) {
	for in, want := range map[string]string{
		"MacBook-Pro.local":           "macbook-pro",
		"Jane's Laptop":               "jane-s-laptop",
		".hidden":                     "hidden",
		"__":                          "runner",
		"":                            "runner",
		"a b  c":                      "a-b-c",
		"x" + strings.Repeat("y", 80): "x" + strings.Repeat("y", 62),
	} {
		if got := runner.DefaultName(in); got != want {
			t.Errorf("DefaultName(%q) = %q, want %q", in, got, want)
		}
	}
}
