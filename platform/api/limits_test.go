package api_test

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api"
	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/provider/fake"
	"github.com/managoat/managoat/sandbox"
)

// recording is provider/fake that keeps the options of every Create.
type recording struct {
	*fake.Provider
	mu    sync.Mutex
	seen  []sandbox.CreateOptions
	names []string
}

func (p *recording) Create(ctx context.Context, name string, o sandbox.CreateOptions) (*sandbox.Handle, error) {
	p.mu.Lock()
	p.seen = append(p.seen, o)
	p.names = append(p.names, name)
	p.mu.Unlock()
	return p.Provider.Create(ctx, name, o)
}

// everyLimit is a sandbox.Limits with each field set (by reflection, so a
// field added to the contract is covered without touching this test).
func everyLimit(t *testing.T) sandbox.Limits {
	t.Helper()
	var l sandbox.Limits
	v := reflect.ValueOf(&l).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		switch {
		case f.Type() == reflect.TypeFor[time.Duration]():
			f.SetInt(int64(7 * time.Second))
		case f.CanInt():
			f.SetInt(int64(16<<20 + i))
		default:
			t.Fatalf("sandbox.Limits.%s is a %s: teach this test its value", v.Type().Field(i).Name, f.Type())
		}
	}
	return l
}

// TestCreateCarriesEveryLimit: each limit of a create through the client
// and the API reaches the provider and the record as asked; none is
// dropped on the way (disk_bytes was: `managoat create --disk 1G` against
// a platform made a sandbox with no disk quota and said nothing).
func TestCreateCarriesEveryLimit(t *testing.T) {
	rp := &recording{Provider: fake.New()}
	t.Cleanup(func() { _ = rp.Close() })
	pl := apitest.Start(t, apitest.Options{Providers: map[string]sandbox.Provider{"fake": rp}, Env: map[string]string{"SANDBOX_PROVIDER": "fake"}})
	key := pl.Account(t, "alice")
	c := newPlatformClient(t, pl, key)
	want := everyLimit(t)
	if _, err := c.Create(t.Context(), "lim", sandbox.CreateOptions{Limits: want}); err != nil {
		t.Fatal(err)
	}
	rp.mu.Lock()
	seen := rp.seen
	rp.mu.Unlock()
	if len(seen) != 1 || seen[0].Limits != want {
		t.Fatalf("the provider was asked for %+v, want %+v", seen, want)
	}
	a := call(t, "GET", pl.URL+"/v1/sandboxes/lim", key, nil)
	var v api.Sandbox
	if a.status != 200 || json.Unmarshal(a.body, &v) != nil || v.Limits == nil || v.Limits.ToSandbox() != want {
		t.Fatalf("GET = %d %s, want the limits %+v", a.status, a.body, want)
	}
	// The JSON names them as the OpenAPI document does.
	a = call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "raw", "limits": {"disk_bytes": 1048576, "wall_clock_ms": 5}}`))
	if a.status != 201 {
		t.Fatalf("create with disk_bytes = %d %s", a.status, a.body)
	}
	rp.mu.Lock()
	got := rp.seen[len(rp.seen)-1].Limits
	rp.mu.Unlock()
	if got != (sandbox.Limits{DiskBytes: 1 << 20, WallClock: 5 * time.Millisecond}) {
		t.Fatalf("the provider was asked for %+v", got)
	}
}

// TestLimitsRoundTrip: the API's Limits carry every field of the
// contract's, and a wall clock under a millisecond stays a limit.
func TestLimitsRoundTrip(t *testing.T) {
	want := everyLimit(t)
	if got := api.FromLimits(want).ToSandbox(); got != want {
		t.Fatalf("round trip = %+v, want %+v", got, want)
	}
	if got := api.FromLimits(sandbox.Limits{WallClock: time.Microsecond}).ToSandbox().WallClock; got != time.Millisecond {
		t.Fatalf("a 1µs wall clock became %v, want 1ms (never none)", got)
	}
}
