package sqlite_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
	"github.com/managoat/managoat/platform/store/storetest"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func open(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, filepath.Join(t.TempDir(), "p.db")) })
}

// TestReopenLosesNothing: what one process wrote, the next one reads, and
// the migrations are not applied twice.
func TestReopenLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state", "platform.db")
	ctx := context.Background()
	s := open(t, path)
	a, err := s.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	want := store.Sandbox{AccountID: a.ID, Name: "x", Provider: "local", ProviderName: "px", InstanceID: "i-1", State: store.StateParked, URL: "https://x.example",
		Limits:    sandbox.Limits{MemoryBytes: 1 << 30, Pids: 64, CPUMillis: 500, WallClock: time.Minute, DiskBytes: 1 << 34},
		CreatedAt: now, LastActivity: now, ParkedAt: now, ParkedBy: store.ParkDestroy, Version: 1}
	if err := s.InsertSandbox(ctx, want); err != nil {
		t.Fatal(err)
	}
	id, _ := s.AddIntent(ctx, store.Intent{AccountID: a.ID, Name: "x", Op: store.OpDestroyOnce, Provider: "local", ProviderName: "px"})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	if got, err := s.GetSandbox(ctx, a.ID, "x"); err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after reopen:\n got %+v, %v\nwant %+v", got, err, want)
	}
	if in, err := s.OpenIntents(ctx); err != nil || len(in) != 1 || in[0].ID != id {
		t.Fatalf("intents after reopen: %+v, %v", in, err)
	}
}

func seed(b *testing.B, s *sqlite.Store, n int) store.Account {
	ctx := context.Background()
	a, err := s.CreateAccount(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	for i := range n {
		if err := s.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: fmt.Sprintf("sb-%05d", i), Provider: "local",
			ProviderName: fmt.Sprintf("p-%05d", i), State: store.StateRunning, CreatedAt: now, LastActivity: now}); err != nil {
			b.Fatal(err)
		}
	}
	return a
}

// BenchmarkList10k lists 10,000 records of one account (target: under
// 20 ms an op).
func BenchmarkList10k(b *testing.B) {
	s := open(b, filepath.Join(b.TempDir(), "p.db"))
	defer s.Close()
	a := seed(b, s, 10000)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		l, err := s.ListSandboxes(ctx, a.ID)
		if err != nil || len(l) != 10000 {
			b.Fatal(len(l), err)
		}
	}
}

// TestOneOwner: the first process to open a database owns its sandbox
// records (served from memory, written through); a second opener (serve
// admin beside serve) reads what the owner wrote from SQLite, may add
// accounts and keys, and is refused a sandbox write.
func TestOneOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "platform.db")
	ctx := context.Background()
	owner := open(t, path)
	defer owner.Close()
	other := open(t, path)
	defer other.Close()
	if !owner.Owner() || other.Owner() {
		t.Fatalf("owner %v, other %v", owner.Owner(), other.Owner())
	}
	a, err := other.CreateAccount(ctx, "alice")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	if err := owner.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: "x", Provider: "local", ProviderName: "px", State: store.StateRunning, CreatedAt: now, LastActivity: now}); err != nil {
		t.Fatal(err)
	}
	if l, err := other.ListSandboxes(ctx, a.ID); err != nil || len(l) != 1 || l[0].Version != 1 {
		t.Fatalf("the other's read: %+v, %v", l, err)
	}
	if err := other.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: "y", Provider: "local", ProviderName: "py", State: store.StateRunning, CreatedAt: now, LastActivity: now}); !errors.Is(err, sqlite.ErrNotOwner) {
		t.Fatalf("the other's write = %v, want ErrNotOwner", err)
	}
	owner.Close()
	again := open(t, path)
	defer again.Close()
	if !again.Owner() {
		t.Fatal("the lock was not released by Close")
	}
	if b, err := again.GetSandbox(ctx, a.ID, "x"); err != nil || !b.CreatedAt.Equal(now) {
		t.Fatalf("after the owner's restart: %+v, %v", b, err)
	}
}
