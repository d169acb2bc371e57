package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/provider/sprites"
	"github.com/managoat/managoat/provider/sprites/spritestest"
	"github.com/managoat/managoat/sandbox"
)

// spawn --detach prints the id of the session it started, read from the
// provider, never guessed from a listing: against a server that lists a
// session only once its process exists (after the upgrade), and with
// earlier sessions of the same command, each run prints its own session
// (issue 21, item 12).
func TestSpawnDetachPrintsItsOwnSession(t *testing.T) {
	srv := spritestest.NewServer(spritestest.Options{StartDelay: 50 * time.Millisecond})
	defer srv.Close()
	srv.AddSprite("cli-ids")
	env := []string{"MANAGOAT_HOME=" + t.TempDir(), "SPRITES_TOKEN=" + srv.Token, "SPRITES_API_URL=" + srv.URL}
	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := sandbox.BuildHandle(sprites.ProviderName, "cli-ids")
	seen := map[string]bool{}
	for _, n := range []string{"one", "two", "three"} {
		out, errOut, code := managoatEnv(t, env, "--provider", "sprites", "spawn", "--detach", "--env", "N="+n,
			"cli-ids", "sh", "-c", "echo $N; sleep 30")
		id := strings.TrimSpace(out)
		if code != 0 || id == "" {
			t.Fatalf("spawn --detach (%s): id %q, exit %d, stderr %s", n, id, code, errOut)
		}
		if seen[id] {
			t.Fatalf("spawn --detach (%s) printed %s again", n, id)
		}
		seen[id] = true
		a, err := p.Attach(ctx, h, id, sandbox.AttachOptions{})
		if err != nil {
			t.Fatalf("attach %s: %v", id, err)
		}
		select {
		case ev := <-a.Events():
			if ev.Kind != sandbox.Stdout || string(ev.Data) != n+"\n" {
				t.Fatalf("session %s printed by spawn (%s) replays %q: another session's", id, n, ev.Data)
			}
		case <-ctx.Done():
			t.Fatal("no replay")
		}
		_ = a.Stop()
		if err := p.TerminateSession(ctx, h, id, sandbox.TerminateOptions{Mode: sandbox.Force, Timeout: 5 * time.Second}); err != nil {
			t.Fatal(err)
		}
	}
}
