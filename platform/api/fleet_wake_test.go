package api_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/api/apitest"
	"github.com/managoat/managoat/platform/store"
)

// TestFleetWakeNeedsRoom: a sandbox parked by destroy (not counted on
// its runner while parked) that wakes on a runner filled meanwhile is
// refused with placement's 403 resource_exhausted naming the runner and
// the memory that did not fit, stays parked, and wakes once there is room.
func TestFleetWakeNeedsRoom(t *testing.T) {
	pl := apitest.Start(t, apitest.Options{})
	key := pl.Account(t, "alice")
	fleetRunner(t, pl.URL, key, "r1", 4*gibi, nil)
	waitCapacity(t, pl, 1)
	create := func(name string, mem int64) answer {
		return call(t, "POST", pl.URL+"/v1/sandboxes", key, strings.NewReader(`{"name": "`+name+`", "provider": "runner", "limits": {"memory_bytes": `+fmt.Sprint(mem)+`}}`))
	}
	if a := create("a", 2*gibi); a.status != 201 {
		t.Fatalf("create a = %d %s", a.status, a.body)
	}
	ctx := context.Background()
	acct := mustAcct(t, pl, "alice")
	rec, err := pl.Store.GetSandbox(ctx, acct, "a")
	if err != nil {
		t.Fatal(err)
	}
	// Parked as the idle park does on a runner without suspend.
	rec.State, rec.ParkedBy, rec.ParkedAt = store.StateParked, store.ParkDestroy, time.Now().UTC()
	if _, err := pl.Store.UpdateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The replica's table of what r1 holds is refreshed from the store's
	// counters within fleetUsageTTL: poll, bounded.
	for deadline := time.Now().Add(10 * time.Second); ; {
		a := create("b", 3*gibi)
		if a.status == 201 {
			break
		}
		if a.status != 403 || time.Now().After(deadline) {
			t.Fatalf("create b (a parked by destroy is not counted) = %d %s", a.status, a.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	a := call(t, "POST", pl.URL+"/v1/sandboxes/a/exec", key, strings.NewReader(`{"cmd": "true"}`))
	if a.status != 403 || a.err == nil || a.err.Reason != "resource_exhausted" || !strings.Contains(a.err.Message, "r1") || !strings.Contains(a.err.Message, "memory") {
		t.Fatalf("exec on a (waking onto a full runner) = %d %s, want 403 resource_exhausted naming r1's memory", a.status, a.body)
	}
	if rec, err := pl.Store.GetSandbox(ctx, acct, "a"); err != nil || rec.State != store.StateParked {
		t.Fatalf("a after a refused wake: %+v %v, want parked", rec, err)
	}
	if a := call(t, "DELETE", pl.URL+"/v1/sandboxes/b", key, nil); a.status/100 != 2 {
		t.Fatalf("delete b = %d %s", a.status, a.body)
	}
	if a := call(t, "POST", pl.URL+"/v1/sandboxes/a/exec", key, strings.NewReader(`{"cmd": "true"}`)); a.status != 200 {
		t.Fatalf("exec on a with room again = %d %s", a.status, a.body)
	}
}
