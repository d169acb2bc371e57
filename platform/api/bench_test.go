package api_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/store"
)

// BenchmarkList10k lists an account's 10,000 records (target: under
// 20 ms): store is the records alone (what the platform lists from),
// handler is GET /v1/sandboxes answered into memory (authentication, the
// records, the JSON), client is the same over loopback HTTP decoded by the
// Go client.
func BenchmarkList10k(b *testing.B) {
	pl := withFakeB(b)
	key := pl.Account(b, "bench")
	ctx := context.Background()
	a, _ := pl.Store.AccountByName(ctx, "bench")
	now := time.Now().UTC()
	for i := range 10000 {
		if err := pl.Store.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: fmt.Sprintf("sb-%05d", i), Provider: "fake",
			ProviderName: fmt.Sprintf("mgp-%020d", i), State: store.StateRunning, CreatedAt: now, LastActivity: now}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("store", func(b *testing.B) {
		for b.Loop() {
			if l, err := pl.Store.ListSandboxes(ctx, a.ID); err != nil || len(l) != 10000 {
				b.Fatal(len(l), err)
			}
		}
	})
	b.Run("handler", func(b *testing.B) {
		for b.Loop() {
			req := httptest.NewRequest("GET", "/v1/sandboxes", nil)
			req.Header.Set("Authorization", "Bearer "+key)
			w := httptest.NewRecorder()
			pl.API.ServeHTTP(w, req)
			if w.Code != http.StatusOK {
				b.Fatal(w.Code)
			}
		}
	})
	b.Run("client", func(b *testing.B) {
		c := newPlatformClient(b, pl, key)
		for b.Loop() {
			l, err := c.List(ctx)
			if err != nil || len(l) != 10000 {
				b.Fatal(len(l), err)
			}
		}
	})
}
