package flock

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestLock(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	unlock, err := Lock(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	if !Held(dir) {
		t.Fatal("a held lock reads free")
	}
	if _, ok := TryLock(dir); ok {
		t.Fatal("TryLock took a held lock")
	}
	// The lock moves with a rename of what it locks.
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if !Held(moved) {
		t.Fatal("the lock did not move with its directory")
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := Lock(short, moved); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a held lock = %v, want the context's end", err)
	}
	unlock()
	if Held(moved) {
		t.Fatal("an unlocked lock reads held")
	}
	again, ok := TryLock(moved)
	if !ok {
		t.Fatal("TryLock failed on a free lock")
	}
	again()
	if _, err := Lock(ctx, filepath.Join(moved, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Lock on a missing path = %v", err)
	}
}

// Shared holders coexist and keep an exclusive one out until the last
// one leaves.
func TestLockShared(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	a, err := LockShared(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := LockShared(ctx, dir)
	if err != nil {
		t.Fatal("a second shared lock was refused:", err)
	}
	short, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel()
	if _, err := Lock(short, dir); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock under shared holders = %v, want the context's end", err)
	}
	a()
	if _, ok := TryLock(dir); ok {
		t.Fatal("TryLock took the lock while a shared holder remains")
	}
	b()
	unlock, ok := TryLock(dir)
	if !ok {
		t.Fatal("the lock is not free after the shared holders left")
	}
	short2, cancel2 := context.WithTimeout(ctx, 30*time.Millisecond)
	defer cancel2()
	if _, err := LockShared(short2, dir); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("LockShared under an exclusive holder = %v, want the context's end", err)
	}
	unlock()
}
