package api

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/policy"
	"github.com/managoat/managoat/platform/store/sqlite"
)

// TestSourceOf: the failed authentications' bound counts the peer's IP,
// an IPv6 one by its /64, an IPv4 one mapped into IPv6 as IPv4, and
// never a header the caller sets.
func TestSourceOf(t *testing.T) {
	for _, c := range []struct{ remote, want string }{
		{"192.0.2.7:4000", "192.0.2.7"},
		{"[::ffff:192.0.2.7]:4000", "192.0.2.7"},
		{"[2001:db8:1:2:aaaa::1]:4000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:2:bbbb::9]:5000", "2001:db8:1:2::/64"},
		{"[2001:db8:1:3::1]:4000", "2001:db8:1:3::/64"},
	} {
		r := &http.Request{RemoteAddr: c.remote, Header: http.Header{"X-Forwarded-For": {"203.0.113.1"}}}
		if got := sourceOf(r); got != c.want {
			t.Errorf("sourceOf(%s) = %q, want %q", c.remote, got, c.want)
		}
	}
}

// TestFailedAuthStateIsBounded: the failed authentications' buckets of
// addresses that stopped failing (their bucket full again) are swept: a
// serve that has seen wrong keys from many addresses keeps no state for
// them all.
func TestFailedAuthStateIsBounded(t *testing.T) {
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
	const n = 20000
	for i := range n {
		s.authFailed(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
		clock.Lock()
		now = now.Add(time.Millisecond) // 1,000 addresses a second; a bucket is full again after 0.1 s
		clock.Unlock()
	}
	s.mu.Lock()
	kept := len(s.failed)
	s.mu.Unlock()
	if kept > 2*minFailedSweep {
		t.Errorf("%d addresses' buckets kept after %d addresses failed once each, want at most %d", kept, n, 2*minFailedSweep)
	}
}
