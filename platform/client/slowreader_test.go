package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"strconv"
	"testing"
	"time"

	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/local"
	runnerprov "github.com/managoat/managoat/provider/runner"
	"github.com/managoat/managoat/sandbox"
)

// seqOutput is what `seq 1 n` prints.
func seqOutput(n int) []byte {
	var b bytes.Buffer
	for i := 1; i <= n; i++ {
		b.WriteString(strconv.Itoa(i))
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// readSlowly spawns `seq 1 n` through p, reads nothing for stall (a busy
// reader), then reads every event; it returns the sha256 of the stdout,
// its length, and the terminal event.
func readSlowly(t *testing.T, p sandbox.Provider, h *sandbox.Handle, n int, stall time.Duration) ([32]byte, int, sandbox.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd, err := p.Spawn(ctx, h, sandbox.Cmd{Name: "seq", Args: []string{"1", strconv.Itoa(n)}}, sandbox.SpawnOptions{Detachable: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cmd.Stop()
	time.Sleep(stall) // the reader is slow: nothing is read meanwhile
	sum := sha256.New()
	got := 0
	for {
		select {
		case ev, ok := <-cmd.Events():
			if !ok {
				return [32]byte(sum.Sum(nil)), got, sandbox.Event{Kind: sandbox.Error, Err: sandbox.ClosedBeforeExit()}
			}
			switch {
			case ev.Kind == sandbox.Stdout:
				sum.Write(ev.Data)
				got += len(ev.Data)
			case ev.Terminal():
				return [32]byte(sum.Sum(nil)), got, ev
			}
		case <-ctx.Done():
			t.Fatalf("no end after %d bytes", got)
		}
	}
}

// TestSlowReaderThroughThePlatform (issue 31, 1): a Go client's reader
// that falls behind (nothing read for 1.5 s while the command writes
// 75 MiB, more than a stream queues) gets every byte in order and the
// exit, through the API on provider/local (the jail) and on a runner
// (a daemon over provider/local): the client's socket slows the
// platform, which slows the session's reading of its journal, or, on a
// runner, resumes from the daemon's replay at the offset it reached.
// Before the fix the client dropped its reader at 64 MiB
// (unavailable slow_reader).
func TestSlowReaderThroughThePlatform(t *testing.T) {
	const n = 10_000_000 // 78,888,897 bytes
	want := seqOutput(n)
	wantSum := sha256.Sum256(want)
	check := func(what string, sum [32]byte, got int, end sandbox.Event) {
		t.Helper()
		if end.Kind != sandbox.Exit || end.Code != 0 || got != len(want) || sum != wantSum {
			t.Errorf("%s: end %v (%v), %d bytes (want %d), sha256 match %v", what, end.Kind, end.Err, got, len(want), sum == wantSum)
		}
	}
	t.Run("Local", func(t *testing.T) {
		testenv.RequireRoot(t)
		p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "jail"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { destroyAll(p) })
		pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"local": p}})
		c := newClient(t, pl.URL, pl.Account(t, "alice"), "local")
		h, err := c.Create(context.Background(), "slow", sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sum, got, end := readSlowly(t, c, h, n, 1500*time.Millisecond)
		check("through the API on local", sum, got, end)
	})
	t.Run("Runner", func(t *testing.T) {
		p, err := local.New(local.Config{StateDir: t.TempDir(), MechanismName: "trusted"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { destroyAll(p) })
		pl := apitest.Start(t, apitest.Options{})
		key := pl.Account(t, "alice")
		startRunner(t, pl.URL, key, "alice-box", p)
		waitRunners(t, pl, 1)
		c := newClient(t, pl.URL, key, "runner")
		name, err := runnerprov.For(pl.Relay.Host().Online()[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		h, err := c.Create(context.Background(), name, sandbox.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// More than the client's and the platform's queues hold together.
		const n = 25_000_000 // 213,888,898 bytes
		want := seqOutput(n)
		sum, got, end := readSlowly(t, c, h, n, 3*time.Second)
		if s := sha256.Sum256(want); end.Kind != sandbox.Exit || end.Code != 0 || got != len(want) || sum != s {
			t.Errorf("through the API on a runner: end %v (%v), %d bytes (want %d), sha256 match %v", end.Kind, end.Err, got, len(want), sum == s)
		}
	})
}
