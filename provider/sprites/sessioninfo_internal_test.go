package sprites

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

// A socket that never announces its session: a detachable Spawn fails
// Unavailable{no_session_info} at the bound instead of returning a session
// nobody can find again; a non-detachable one returns without an id.
func TestSpawnWithoutSessionInfoTimesOut(t *testing.T) {
	defer func(d time.Duration) { infoTimeout = d }(infoTimeout)
	infoTimeout = 200 * time.Millisecond
	srv := spritestest.NewServer(spritestest.Options{})
	defer srv.Close()
	p, err := New(Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := p.Create(ctx, "silent", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	srv.Inject(spritestest.Fault{Path: "/v1/sprites/silent/exec", Times: 1, Silent: true})
	_, err = p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{Detachable: true})
	var u *sandbox.UnavailableError
	if !errors.As(err, &u) || u.Reason != ReasonNoSessionInfo {
		t.Fatalf("detachable Spawn on a silent socket = %v, want Unavailable{%s}", err, ReasonNoSessionInfo)
	}
	srv.Inject(spritestest.Fault{Path: "/v1/sprites/silent/exec", Times: 1, Silent: true})
	c, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "true"}, sandbox.SpawnOptions{})
	if err != nil || c.SessionID != "" {
		t.Fatalf("non-detachable Spawn on a silent socket = %v, %v", c, err)
	}
	_ = c.Stop()
}

// A Spawn whose caller gives up before the session is announced still
// learns the id and terminates the process it started.
func TestSpawnCancelledBeforeSessionInfo(t *testing.T) {
	srv := spritestest.NewServer(spritestest.Options{StartDelay: 300 * time.Millisecond, MaxRunAfterDisconnect: time.Minute})
	defer srv.Close()
	p, err := New(Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := p.Create(ctx, "cancel", sandbox.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer scancel()
	if _, err := p.Spawn(sctx, h, sandbox.Cmd{Name: "sleep", Args: []string{"30"}}, sandbox.SpawnOptions{Detachable: true}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Spawn cut by its context = %v", err)
	}
	// The process starts after the delay whatever Spawn did; the session
	// is listed from then on (a detachable one, even once it ended).
	var ss []sandbox.Session
	for deadline := time.Now().Add(5 * time.Second); len(ss) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no session listed")
		}
		if ss, err = p.ListSessions(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range ss {
		if srv.SessionRunning("cancel", s.ID) {
			t.Fatalf("session %s runs on after its Spawn was given up", s.ID)
		}
	}
}
