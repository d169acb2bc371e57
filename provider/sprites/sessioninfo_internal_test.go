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
