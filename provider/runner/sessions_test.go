package runner_test

import (
	"context"
	"testing"

	prov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/provider/runner/wire"
	"github.com/managoat/managoat/sandbox"
)

// TestListSessionsState: ListSessions gives each session the state its
// daemon says (the state extension), and reads Fountain's daemon's
// entries, which have no state, by their exit_code: finished when it is
// there (with that code), running when it is not. An entry with neither is
// never left without a state, so the platform never parks a sandbox for a
// session it could not see end.
func TestListSessionsState(t *testing.T) {
	pl := newPlatform(t, prov.ServerConfig{})
	rd, _, err := dialRaw(t, pl, "raw")
	if err != nil {
		t.Fatal(err)
	}
	id := pl.online(t)
	_, h := rawName(t, id)
	type res struct {
		ss  []sandbox.Session
		err error
	}
	got := make(chan res, 1)
	go func() {
		ss, err := pl.srv.Provider().ListSessions(context.Background(), h)
		got <- res{ss, err}
	}()
	r := rd.next()
	if r.Op != wire.OpListSessions || r.Name != h.Name {
		t.Fatalf("request %+v", r)
	}
	rd.send(sprintf(`{"id":%d,"ok":true,"result":{"sessions":[`+
		`{"id":"s-1","command":"sleep 3600","created_at":"2026-09-01T00:00:05Z","last_activity_at":"2026-09-01T00:00:05Z","tty":false},`+
		`{"id":"s-2","command":"false","created_at":"2026-09-01T00:00:04Z","last_activity_at":"2026-09-01T00:00:04Z","tty":false,"exit_code":1},`+
		`{"id":"s-3","command":"sleep 9","tty":false,"state":"running"},`+
		`{"id":"s-4","command":"true","tty":false,"state":"exited","exit_code":0},`+
		`{"id":"s-5","command":"yes","tty":false,"state":"lost"}]}}`, r.ID))
	g := <-got
	if g.err != nil || len(g.ss) != 5 {
		t.Fatalf("ListSessions: %+v, %v", g.ss, g.err)
	}
	want := []struct {
		state string
		code  int
	}{{sandbox.SessionRunning, 0}, {sandbox.SessionExited, 1}, {sandbox.SessionRunning, 0}, {sandbox.SessionExited, 0}, {sandbox.SessionLost, 0}}
	for i, w := range want {
		if s := g.ss[i]; s.State != w.state || s.ExitCode != w.code {
			t.Errorf("session %s: state %q code %d, want %q %d", s.ID, s.State, s.ExitCode, w.state, w.code)
		}
	}
	if s := g.ss[0]; s.Command != "sleep 3600" || s.CreatedAt.IsZero() || s.LastActivityAt.IsZero() {
		t.Errorf("session s-1: %+v", s)
	}
}
