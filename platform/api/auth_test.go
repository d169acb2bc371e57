package api_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/sqlite"
)

// countingStore counts the key lookups of the store it wraps.
type countingStore struct {
	store.Store
	lookups atomic.Int64
}

func (s *countingStore) KeyByID(ctx context.Context, id string) (store.Key, error) {
	s.lookups.Add(1)
	return s.Store.KeyByID(ctx, id)
}

// clientFrom is an HTTP client whose connections come from the loopback
// address ip (all of 127/8 is the loopback on Linux).
func clientFrom(t *testing.T, ip string) *http.Client {
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

// TestFailedAuthRateLimited: the failed authentications of one source
// address are bounded (Config.FailedAuthRate, FailedAuthBurst): past the
// burst, its requests are 429 rate_limited{failed_auth} with Retry-After,
// answered without a key lookup in the store, its good key too; a good key
// from another address is served; once the bucket has a token again the
// address is served. Each wrong key cost a store lookup, without bound.
func TestFailedAuthRateLimited(t *testing.T) {
	sq, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "platform.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sq.Close() })
	st := &countingStore{Store: sq}
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	pl := apitest.Start(t, apitest.Options{Store: st, Configure: func(c *api.Config) {
		c.Now, c.FailedAuthRate, c.FailedAuthBurst = clock, 1, 3
	}})
	good := pl.Account(t, "alice")
	// Shaped like a key, with the good key's id: each costs a lookup.
	wrong := good[:len(api.KeyPrefix)+17] + "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
	a, b := clientFrom(t, "127.0.0.1"), clientFrom(t, "127.0.0.2")
	get := func(c *http.Client, key string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", pl.URL+"/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	refused := func(what string, resp *http.Response) {
		t.Helper()
		if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("%s: %d (Retry-After %q), want 429 with Retry-After", what, resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	}
	if r := get(a, good); r.StatusCode != 200 {
		t.Fatalf("the good key: %d", r.StatusCode)
	}
	for i := range 3 {
		if r := get(a, wrong); r.StatusCode != http.StatusUnauthorized {
			t.Fatalf("wrong key %d of the burst: %d, want 401", i+1, r.StatusCode)
		}
	}
	before := st.lookups.Load()
	refused("a wrong key past the burst", get(a, wrong))
	refused("the good key from the address past its burst", get(a, good))
	if n := st.lookups.Load() - before; n != 0 {
		t.Fatalf("%d key lookups for the refused requests, want none", n)
	}
	// The body names the bound.
	req, _ := http.NewRequest("GET", pl.URL+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+wrong)
	resp, err := a.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ Error api.Error }
	err = json.NewDecoder(resp.Body).Decode(&body)
	resp.Body.Close()
	if err != nil || body.Error.Kind != "rate_limited" || body.Error.Reason != "failed_auth" || body.Error.RetryAfterMS <= 0 {
		t.Fatalf("the refusal's body: %+v, %v; want rate_limited{failed_auth} with retry_after_ms", body.Error, err)
	}
	// Another address is not affected.
	if r := get(b, good); r.StatusCode != 200 {
		t.Fatalf("the good key from another address: %d, want 200", r.StatusCode)
	}
	// A token back (1/s): the address is served again.
	mu.Lock()
	now = now.Add(1500 * time.Millisecond)
	mu.Unlock()
	if r := get(a, good); r.StatusCode != 200 {
		t.Fatalf("the good key once the address's bucket has a token: %d, want 200", r.StatusCode)
	}
}
