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
