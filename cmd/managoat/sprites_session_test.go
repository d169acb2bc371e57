package main

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strings"
	"syscall"
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

// spritesRunning lists the ids of the sprite's sessions whose process
// the fake still runs.
func spritesRunning(t *testing.T, ctx context.Context, srv *spritestest.Server, p *sprites.Provider, name string) []string {
	t.Helper()
	ss, err := p.ListSessions(ctx, sandbox.BuildHandle(sprites.ProviderName, name))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, s := range ss {
		if srv.SessionRunning(name, s.ID) {
			ids = append(ids, s.ID+" ("+s.Command+")")
		}
	}
	return ids
}

// exec's --timeout and Ctrl-C terminate the session exec started, which
// they can only do with the id the provider read: Sprites keeps a non-TTY
// process 10 s after its socket goes (here a minute), so a session that is
// only detached from runs on (issue 21, item 12).
func TestExecEndTerminatesItsSpritesSession(t *testing.T) {
	srv := spritestest.NewServer(spritestest.Options{StartDelay: 50 * time.Millisecond, MaxRunAfterDisconnect: time.Minute})
	defer srv.Close()
	srv.AddSprite("cli-timeout")
	srv.AddSprite("cli-int")
	env := []string{"MANAGOAT_HOME=" + t.TempDir(), "SPRITES_TOKEN=" + srv.Token, "SPRITES_API_URL=" + srv.URL}
	p, err := sprites.New(sprites.Config{Token: srv.Token, BaseURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("Timeout", func(t *testing.T) {
		out, errOut, code := managoatEnv(t, env, "--provider", "sprites", "exec", "--timeout", "2s", "cli-timeout",
			"--", "sh", "-c", "echo ready; sleep 30")
		if out != "ready\n" || code == 0 || !strings.Contains(errOut, "exec_timeout") {
			t.Fatalf("exec --timeout 2s: stdout %q, exit %d, stderr %s", out, code, errOut)
		}
		if ids := spritesRunning(t, ctx, srv, p, "cli-timeout"); len(ids) > 0 {
			t.Fatalf("sessions run on after exec's timeout: %v", ids)
		}
	})

	t.Run("Interrupt", func(t *testing.T) {
		cmd := exec.Command(binary, "--provider", "sprites", "exec", "cli-int", "--", "sh", "-c", "echo ready; sleep 30")
		cmd.Env = append(append(os.Environ(), "MANAGOAT_CONFIG=/nonexistent/managoat-test-config"), env...)
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		var errOut strings.Builder
		cmd.Stderr = &errOut
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		lines := make(chan string, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			if sc.Scan() {
				lines <- sc.Text()
			}
			close(lines)
			for sc.Scan() {
			}
			exited <- cmd.Wait()
		}()
		defer func() {
			_ = cmd.Process.Kill()
			<-exited
		}()
		select {
		case l := <-lines:
			if l != "ready" {
				t.Fatalf("exec printed %q first; stderr %s", l, errOut.String())
			}
		case <-ctx.Done():
			t.Fatal("exec printed nothing")
		}
		if ids := spritesRunning(t, ctx, srv, p, "cli-int"); len(ids) != 1 {
			t.Fatalf("running sessions before the interrupt: %v, want exec's one", ids)
		}
		if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-exited:
			exited <- err // for the deferred wait
			if code := cmd.ProcessState.ExitCode(); code != exitDetached {
				t.Fatalf("exec interrupted: exit %d (%v), stderr %s", code, err, errOut.String())
			}
		case <-ctx.Done():
			t.Fatal("exec did not end after SIGINT")
		}
		if ids := spritesRunning(t, ctx, srv, p, "cli-int"); len(ids) > 0 {
			t.Fatalf("sessions run on after exec was interrupted: %v; stderr %s", ids, errOut.String())
		}
	})
}
