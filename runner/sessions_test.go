package runner_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// listed is the one session list_sessions shows for sandbox sb.
func listed(t *testing.T, c *pconn, id int64) wire.Session {
	t.Helper()
	g := c.call(id, `{"id":%d,"op":"list_sessions","name":"sb"}`, id)
	var res struct {
		Sessions []wire.Session `json:"sessions"`
	}
	if !g.OK || json.Unmarshal(g.Result, &res) != nil || len(res.Sessions) != 1 {
		t.Fatalf("list_sessions: %+v %s", g, g.Result)
	}
	return res.Sessions[0]
}

// TestListSessionsSaysState: list_sessions says each session's state (the
// state extension), from the provider's own listing: a detached session
// that runs without a word (sleep) is running, with no exit_code, also
// once the daemon dropped it from memory; terminated, it is exited with
// its exit code.
func TestListSessionsSaysState(t *testing.T) {
	dir := t.TempDir()
	m, err := openTrusted("trusted", dir)
	if err != nil {
		t.Fatal(err)
	}
	p, err := local.New(local.Config{StateDir: dir, Mechanism: m})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Destroy(context.Background(), sandbox.BuildHandle(local.Name, "sb")) })
	rp := newRawPlatform(t)
	d := newDaemon(t, rp.ts.URL, p, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	c := rp.accept(t)
	if g := c.call(1, `{"id":1,"op":"create","name":"sb"}`); !g.OK {
		t.Fatalf("create: %+v", g)
	}
	g := c.call(2, `{"id":2,"op":"spawn","name":"sb","cmd":"sleep","args":["300"]}`)
	var res struct {
		SessionID string `json:"session_id"`
	}
	if !g.OK || json.Unmarshal(g.Result, &res) != nil || res.SessionID == "" {
		t.Fatalf("spawn: %+v", g)
	}
	sid := res.SessionID
	if s := listed(t, c, 3); s.ID != sid || s.State != wire.SessionRunning || s.ExitCode != nil {
		t.Fatalf("a running session listed as %+v", s)
	}
	c.call(0, `{"id":0,"op":"detach","session_id":%q}`, sid)
	deadline := time.Now().Add(10 * time.Second)
	for d.Held() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the detached session stayed in the daemon's memory")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := listed(t, c, 4); s.State != wire.SessionRunning || s.ExitCode != nil {
		t.Fatalf("a detached running session listed as %+v", s)
	}
	if g := c.call(5, `{"id":5,"op":"terminate_session","name":"sb","session_id":%q,"force":true}`, sid); !g.OK {
		t.Fatalf("terminate_session: %+v", g)
	}
	deadline = time.Now().Add(10 * time.Second)
	for {
		s := listed(t, c, 6)
		if s.State == wire.SessionExited {
			if s.ExitCode == nil || *s.ExitCode == 0 {
				t.Fatalf("a killed session listed as %+v", s)
			}
			break
		}
		if s.State != wire.SessionRunning || time.Now().After(deadline) {
			t.Fatalf("a terminated session listed as %+v", s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
