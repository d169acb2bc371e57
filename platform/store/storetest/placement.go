package storetest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/store"
)

// placement: InsertSandboxWithin counts the records of a runner (a
// provider-name prefix) and refuses the one that would pass a bound, also
// when many inserts race (exactly the room's worth win); records of
// another prefix, and those parked by destroy, are not counted.
func placement(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	mk := func(name, pname string, mem int64) store.Sandbox {
		r := sb(a, name)
		r.Provider, r.ProviderName, r.Limits.MemoryBytes = "runner", pname, mem
		return r
	}
	room := store.Room{Provider: "runner", Prefix: "runner-aa-", MemoryBytes: 1000, Sandboxes: 4}
	// Another runner's records and one parked by destroy do not count.
	if err := s.InsertSandbox(c, mk("other", "runner-ab-1", 900)); err != nil {
		t.Fatal(err)
	}
	gone := mk("gone", "runner-aa-0", 900)
	gone.State, gone.ParkedBy, gone.ParkedAt = store.StateParked, store.ParkDestroy, now()
	if err := s.InsertSandbox(c, gone); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, full := 0, 0
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.InsertSandboxWithin(c, mk(fmt.Sprintf("s%d", i), fmt.Sprintf("runner-aa-%d", i+1), 300), room)
			mu.Lock()
			defer mu.Unlock()
			var nr *store.NoRoomError
			switch {
			case err == nil:
				won++
			case errors.As(err, &nr) && errors.Is(err, store.ErrNoRoom) && nr.Resource == "memory" && nr.Capacity == 1000:
				full++
			default:
				t.Errorf("InsertSandboxWithin: %v", err)
			}
		}()
	}
	wg.Wait()
	if won != 3 || full != 7 {
		t.Fatalf("10 racing inserts of 300 in a room of 1000: %d won, %d refused; want 3 and 7", won, full)
	}
	u, err := s.UsageOf(c, "runner", "runner-aa-")
	if err != nil || u != (store.Usage{MemoryBytes: 900, Sandboxes: 3}) {
		t.Fatalf("UsageOf = %+v, %v; want 900 bytes in 3 sandboxes", u, err)
	}
	// The sandbox bound: the fourth fits by count, a fifth does not.
	small := store.Room{Provider: "runner", Prefix: "runner-aa-", Sandboxes: 4}
	if err := s.InsertSandboxWithin(c, mk("t1", "runner-aa-t1", 0), small); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandboxWithin(c, mk("t2", "runner-aa-t2", 0), small); !errors.Is(err, store.ErrNoRoom) {
		t.Fatalf("a fifth sandbox in a room of 4 = %v, want ErrNoRoom", err)
	}
	if _, err := s.GetSandbox(c, a.ID, "t2"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused insert left a record: %v", err)
	}
	// A name taken is ErrAlreadyExists, as for InsertSandbox.
	if err := s.InsertSandboxWithin(c, mk("t1", "runner-aa-t9", 0), store.Room{Provider: "runner", Prefix: "runner-aa-"}); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("InsertSandboxWithin of a taken name = %v, want ErrAlreadyExists", err)
	}

	// The counter follows every write of a record: a park by destroy
	// takes it out, its wake puts it back, a limit's change moves it, a
	// delete (either kind) takes it out; Usages reads several at once.
	want := func(prefix string, u store.Usage, when string) {
		t.Helper()
		if got, err := s.UsageOf(c, "runner", prefix); err != nil || got != u {
			t.Fatalf("%s: UsageOf(%s) = %+v, %v; want %+v", when, prefix, got, err, u)
		}
	}
	want("runner-aa-", store.Usage{MemoryBytes: 900, Sandboxes: 4}, "with t1")
	var won0 store.Sandbox // one of the three winners
	for i := range 10 {
		if rec, err := s.GetSandbox(c, a.ID, fmt.Sprintf("s%d", i)); err == nil {
			won0 = rec
			break
		}
	}
	parked := won0
	parked.State, parked.ParkedBy, parked.ParkedAt = store.StateParked, store.ParkDestroy, now()
	parked, err = s.UpdateSandbox(c, parked)
	if err != nil {
		t.Fatal(err)
	}
	want("runner-aa-", store.Usage{MemoryBytes: 600, Sandboxes: 3}, "one parked by destroy")
	woken := parked
	woken.State, woken.ParkedBy, woken.ParkedAt = store.StateRunning, "", time.Time{}
	woken.Limits.MemoryBytes, woken.Limits.CPUMillis, woken.Limits.DiskBytes = 350, 250, 1<<20
	woken, err = s.UpdateSandbox(c, woken)
	if err != nil {
		t.Fatal(err)
	}
	want("runner-aa-", store.Usage{MemoryBytes: 950, CPUMillis: 250, DiskBytes: 1 << 20, Sandboxes: 4}, "woken with other limits")
	us, err := s.Usages(c, "runner", []string{"runner-aa-", "runner-ab-", "runner-zz-"})
	if err != nil || len(us) != 2 || us["runner-ab-"] != (store.Usage{MemoryBytes: 900, Sandboxes: 1}) || us["runner-aa-"].MemoryBytes != 950 {
		t.Fatalf("Usages = %+v, %v; want runner-aa- and runner-ab- only", us, err)
	}
	if err := s.DeleteSandboxIf(c, woken); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(c, a.ID, "t1"); err != nil {
		t.Fatal(err)
	}
	want("runner-aa-", store.Usage{MemoryBytes: 600, Sandboxes: 2}, "two deleted")
	if err := s.DeleteSandbox(c, a.ID, "other"); err != nil {
		t.Fatal(err)
	}
	want("runner-ab-", store.Usage{}, "its one record deleted")
	if n, err := s.CountSandboxes(c, a.ID); err != nil || n != 3 {
		t.Fatalf("CountSandboxes = %d, %v; want 3 (gone and two of s0-s9)", n, err)
	}
	if err := s.InsertSandboxWithin(c, mk("u1", "runner-ab-u1", 0), room); err == nil {
		t.Fatal("InsertSandboxWithin of a record outside the room's prefix: no error")
	}

	// Schedules: kept by runner id, overwritten, listed per account.
	b := mustAccount(t, s, "bob")
	for _, sch := range []store.RunnerSchedule{
		{AccountID: a.ID, RunnerID: "r1", Name: "gpu", State: store.ScheduleCordoned, UpdatedAt: now()},
		{AccountID: a.ID, RunnerID: "r1", Name: "gpu", State: store.ScheduleDraining, Labels: map[string]string{"zone": "eu"}, UpdatedAt: now()},
		{AccountID: b.ID, RunnerID: "r2", Name: "cpu", UpdatedAt: now()},
	} {
		if err := s.SetRunnerSchedule(c, sch); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.RunnerSchedules(c, a.ID)
	if err != nil || len(got) != 1 || got[0].State != store.ScheduleDraining || got[0].Labels["zone"] != "eu" || got[0].Name != "gpu" {
		t.Fatalf("RunnerSchedules = %+v, %v; want r1 draining with zone=eu", got, err)
	}
}
