package client_test

import (
	"context"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/local"
	"github.com/managoat/managoat/sandbox"
)

// TestSessionStateThroughTheAPI: a session's state and an exited one's
// code reach the client as the provider reports them (the API's sessions
// had neither, so an API user could not tell a quiet session from an
// ended one).
func TestSessionStateThroughTheAPI(t *testing.T) {
	p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { destroyAll(p) })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}})
	c := newClient(t, pl.URL, pl.Account(t, "alice"), "local")
	ctx := context.Background()
	h, err := c.Create(ctx, "states", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spawn := func(script string) string {
		cmd, err := c.Spawn(ctx, h, sandbox.Cmd{Name: "sh", Args: []string{"-c", script}}, sandbox.SpawnOptions{Detachable: true})
		if err != nil || cmd.SessionID == "" {
			t.Fatalf("spawn %q: %v", script, err)
		}
		_ = cmd.Stop()
		return cmd.SessionID
	}
	quiet, ended := spawn("sleep 30"), spawn("exit 3")
	deadline := time.Now().Add(10 * time.Second)
	for {
		ss, err := c.ListSessions(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]sandbox.Session{}
		for _, s := range ss {
			got[s.ID] = s
		}
		q, e := got[quiet], got[ended]
		if q.State == sandbox.SessionRunning && e.State == sandbox.SessionExited {
			if e.ExitCode != 3 {
				t.Fatalf("the ended session's exit code %d, want 3", e.ExitCode)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions %+v, want %s running and %s exited", ss, quiet, ended)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
