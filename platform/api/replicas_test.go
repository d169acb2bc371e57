package api_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// slowFake takes 200 ms to create, so concurrent creates overlap.
type slowFake struct{ *fake.Provider }

func (s slowFake) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	time.Sleep(200 * time.Millisecond)
	return s.Provider.Create(ctx, name, o)
}

// TestReplicasCreateOneName: two API servers on one store (two replicas)
// receive eight concurrent creates of one name: one record, one sandbox
// on the provider, and every create answers with it (201 once, 200 for
// the adopters).
func TestReplicasCreateOneName(t *testing.T) {
	f := slowFake{fake.New()}
	t.Cleanup(func() { _ = f.Close() })
	one := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": f}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	two := apitest.Start(t, apitest.Options{Store: one.Store, Providers: map[string]sandbox.Provider{"fake": f}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	key := one.Account(t, "alice")
	var wg sync.WaitGroup
	codes := make([]int, 8)
	for i := range codes {
		url := one.URL
		if i%2 == 1 {
			url = two.URL
		}
		wg.Go(func() {
			req, _ := http.NewRequest("POST", url+"/v1/sandboxes", strings.NewReader(`{"name": "shared"}`))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	created := 0
	for _, c := range codes {
		switch c {
		case 201:
			created++
		case 200:
		default:
			t.Errorf("a create answered %d (all: %v)", c, codes)
		}
	}
	if created != 1 {
		t.Fatalf("%d creates made it, want 1 (%v)", created, codes)
	}
	names, _ := f.ListAllNames(context.Background())
	if len(names) != 1 {
		t.Fatalf("the provider holds %v, want one sandbox", names)
	}
	recs, _ := one.Store.ListSandboxes(context.Background(), "")
	if len(recs) != 1 || recs[0].State != "running" || recs[0].ProviderName != names[0] {
		t.Fatalf("records %+v", recs)
	}
}
