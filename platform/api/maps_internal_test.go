package api

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
)

// TestPerRecordStateIsBounded: a serve that has seen many sandboxes come
// and go keeps no state for them: the per-record locks go with their last
// holder, and the activity marks (which only thin the writes to once a
// second) go once older than that. Both grew by one entry per sandbox
// ever used, for the life of the process.
func TestPerRecordStateIsBounded(t *testing.T) {
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "p.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	pol, err := policy.FromEnv(func(string) (string, bool) { return "", false }, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	var clock sync.Mutex
	s, err := New(Config{Store: st, Policy: pol, Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	acct, err := st.CreateAccount(context.Background(), "acct")
	if err != nil {
		t.Fatal(err)
	}
	const n = 5000
	for i := range n {
		name := fmt.Sprintf("sb-%d", i)
		unlock := s.lock("acct", name)
		other := make(chan func())
		go func() { other <- s.lock("acct", name) }() // waits for the first
		unlock()
		(<-other)()
		if err := st.InsertSandbox(context.Background(), store.Sandbox{AccountID: acct.ID, Name: name, Provider: "fake", ProviderName: name, State: store.StateRunning}); err != nil {
			t.Fatal(err)
		}
		s.activity(acct.ID, name)
		clock.Lock()
		now = now.Add(10 * time.Millisecond)
		clock.Unlock()
	}
	s.mu.Lock()
	locks, touched := len(s.locks), len(s.touched)
	s.mu.Unlock()
	if locks != 0 {
		t.Errorf("%d per-record locks are kept after their holders are gone, want 0", locks)
	}
	// 5,000 marks 10 ms apart: those of the last second, and those since
	// the last sweep, at most a few hundred.
	if touched == 0 {
		t.Error("no activity mark kept: none was written")
	}
	if touched > 1024 {
		t.Errorf("%d activity marks are kept, want at most 1024 (those newer than a second and the unswept)", touched)
	}
}
