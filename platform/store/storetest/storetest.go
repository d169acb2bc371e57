// Package storetest is the conformance kit of store.Store: the embedded
// SQLite store runs it, and so must any other (a Postgres store), so the
// platform may count on the same answers from each:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) store.Store { return openFresh(t) })
//	}
//
// open must return an empty store that the kit may close.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// Run runs every case, each on a fresh store from open.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	for _, c := range []struct {
		name string
		f    func(t *testing.T, s store.Store)
	}{
		{"Accounts", accounts},
		{"Keys", keys},
		{"SandboxRoundTrip", roundTrip},
		{"TextKeptExactly", oddText},
		{"SandboxesAreAccountScoped", scoped},
		{"ConcurrentInsertHasOneWinner", oneWinner},
		{"ProviderNameIsUnique", providerNameUnique},
		{"UpdateIsCompareAndSet", compareAndSet},
		{"TouchNeverGoesBack", touch},
		{"DeleteIsTolerant", deleteTolerant},
		{"DeleteIfMatchesTheSandbox", deleteIf},
		{"Intents", intents},
		{"OperationIDIsUsedOnce", operationOnce},
		{"IntentsOfASandbox", intentsOf},
		{"Runners", runners},
		{"PreviewLinks", previewLinks},
		{"PlacementWithinRoom", placement}, // placement.go
		{"DeleteAccount", deleteAccount},   // accounts_delete.go
	} {
		t.Run(c.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() { _ = s.Close() })
			c.f(t, s)
		})
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func mustAccount(t *testing.T, s store.Store, name string) store.Account {
	t.Helper()
	a, err := s.CreateAccount(ctx(t), name)
	if err != nil {
		t.Fatalf("CreateAccount(%q): %v", name, err)
	}
	return a
}

// now is a time every store keeps exactly (microseconds, UTC).
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }

func sb(a store.Account, name string) store.Sandbox {
	t := now()
	return store.Sandbox{AccountID: a.ID, Name: name, Provider: "local", ProviderName: "p-" + a.ID + "-" + name,
		State: store.StateCreating, CreatedAt: t, LastActivity: t}
}

func accounts(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	if a.ID == "" || a.CreatedAt.IsZero() {
		t.Fatalf("account %+v lacks an ID or a creation time", a)
	}
	if _, err := s.CreateAccount(c, "alice"); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("second alice = %v, want ErrAlreadyExists", err)
	}
	b := mustAccount(t, s, "bob")
	if a.ID == b.ID {
		t.Fatal("two accounts share an ID")
	}
	if got, err := s.AccountByName(c, "bob"); err != nil || got.ID != b.ID {
		t.Fatalf("AccountByName(bob) = %+v, %v", got, err)
	}
	if got, err := s.AccountByID(c, a.ID); err != nil || got.Name != "alice" {
		t.Fatalf("AccountByID = %+v, %v", got, err)
	}
	if _, err := s.AccountByName(c, "carol"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("AccountByName(carol) = %v, want ErrNotFound", err)
	}
	all, err := s.ListAccounts(c)
	if err != nil || len(all) != 2 || all[0].Name != "alice" || all[1].Name != "bob" {
		t.Fatalf("ListAccounts = %+v, %v", all, err)
	}
}

func keys(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	k := store.Key{ID: "k1", AccountID: a.ID, Hash: []byte{1, 2, 3, 0, 255}, Label: "laptop", CreatedAt: now()}
	if err := s.AddKey(c, k); err != nil {
		t.Fatal(err)
	}
	if err := s.AddKey(c, k); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("second AddKey = %v, want ErrAlreadyExists", err)
	}
	if err := s.AddKey(c, store.Key{ID: "k9", AccountID: "no-such-account", Hash: []byte{1}, CreatedAt: now()}); err == nil {
		t.Fatal("AddKey for an account that does not exist succeeded")
	}
	got, err := s.KeyByID(c, "k1")
	if err != nil || got.AccountID != a.ID || string(got.Hash) != string(k.Hash) || got.Label != "laptop" || !got.CreatedAt.Equal(k.CreatedAt) || !got.RevokedAt.IsZero() {
		t.Fatalf("KeyByID = %+v, %v", got, err)
	}
	if _, err := s.KeyByID(c, "nope"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("KeyByID(nope) = %v", err)
	}
	at := now()
	if err := s.RevokeKey(c, "k1", at); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.KeyByID(c, "k1"); !got.RevokedAt.Equal(at) {
		t.Fatalf("revoked at %v, want %v", got.RevokedAt, at)
	}
	if err := s.RevokeKey(c, "nope", at); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RevokeKey(nope) = %v", err)
	}
	ks, err := s.ListKeys(c, a.ID)
	if err != nil || len(ks) != 1 {
		t.Fatalf("ListKeys = %+v, %v", ks, err)
	}
}

func roundTrip(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	in := sb(a, "box")
	in.InstanceID, in.URL, in.State = "inst-1", "https://box.example", store.StateRunning
	in.Limits = sandbox.Limits{MemoryBytes: 1 << 30, Pids: 64, CPUMillis: 500, WallClock: 3 * time.Second, DiskBytes: 1 << 34}
	in.Image, in.Labels = "debian:12", map[string]string{"team": "ml", "env": "dev"}
	if err := s.InsertSandbox(c, in); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(c, a.ID, "box")
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != 1 {
		t.Errorf("Version = %d, want 1", got.Version)
	}
	in.Version = 1
	if fmt.Sprint(got) != fmt.Sprint(in) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, in)
	}
	got.State, got.ParkedAt, got.ParkedBy = store.StateParked, now(), store.ParkSuspend
	got.Limits.DiskBytes = 1 << 20
	// An update never changes the image or the labels.
	got.Image, got.Labels = "", nil
	up, err := s.UpdateSandbox(c, got)
	if err != nil {
		t.Fatal(err)
	}
	if up.Image != in.Image || fmt.Sprint(up.Labels) != fmt.Sprint(in.Labels) {
		t.Fatalf("after update: image %q labels %v, want %q %v", up.Image, up.Labels, in.Image, in.Labels)
	}
	if up.Version != 2 || up.State != store.StateParked || !up.ParkedAt.Equal(got.ParkedAt) || up.ParkedBy != store.ParkSuspend || up.Limits != got.Limits {
		t.Fatalf("after update %+v", up)
	}
	// What every reader sees: the record read back and listed.
	for _, read := range []func() (store.Sandbox, error){
		func() (store.Sandbox, error) { return s.GetSandbox(c, a.ID, "box") },
		func() (store.Sandbox, error) { l, err := s.ListSandboxes(c, a.ID); return one(l, err) },
		func() (store.Sandbox, error) { l, err := s.ListSandboxes(c, ""); return one(l, err) },
	} {
		if r, err := read(); err != nil || fmt.Sprint(r) != fmt.Sprint(up) {
			t.Fatalf("read back after the update:\n got %+v, %v\nwant %+v", r, err, up)
		}
	}
	if _, err := s.GetSandbox(c, a.ID, "other"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("GetSandbox(other) = %v", err)
	}
}

// oddText: text with the bytes a store may escape (tab, newline, carriage
// return, backslash, a backslash before a letter, quotes, control bytes,
// non-ASCII) reads back as written, from Get and from both listings.
func oddText(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	in := sb(a, "odd")
	in.InstanceID = `i\n-\t-\\-'"` + "\x01\x7f"
	in.URL = "https://x.example/a\tb\\c\nd\re\bf\fg\vh/é😀"
	in.State = store.StateRunning
	in.Image = "reg.example/o/r:t\tag\n"
	in.Labels = map[string]string{"k\t": "v\n\"'\t\x01é", "e": ""}
	if err := s.InsertSandbox(c, in); err != nil {
		t.Fatal(err)
	}
	in.Version = 1
	for _, read := range []func() (store.Sandbox, error){
		func() (store.Sandbox, error) { return s.GetSandbox(c, a.ID, "odd") },
		func() (store.Sandbox, error) { l, err := s.ListSandboxes(c, a.ID); return one(l, err) },
		func() (store.Sandbox, error) { l, err := s.ListSandboxes(c, ""); return one(l, err) },
	} {
		if r, err := read(); err != nil || !reflect.DeepEqual(r, in) {
			t.Fatalf("read back:\n got %q, %v\nwant %q", fmt.Sprintf("%+v", r), err, fmt.Sprintf("%+v", in))
		}
	}
}

func one(l []store.Sandbox, err error) (store.Sandbox, error) {
	if err == nil && len(l) != 1 {
		err = fmt.Errorf("%d records listed, want 1", len(l))
	}
	if err != nil {
		return store.Sandbox{}, err
	}
	return l[0], nil
}

func scoped(t *testing.T, s store.Store) {
	c := ctx(t)
	a, b := mustAccount(t, s, "alice"), mustAccount(t, s, "bob")
	for _, n := range []string{"y", "x"} {
		if err := s.InsertSandbox(c, sb(a, n)); err != nil {
			t.Fatal(err)
		}
	}
	// The same name in another account is another sandbox.
	if err := s.InsertSandbox(c, sb(b, "x")); err != nil {
		t.Fatalf("bob's x: %v", err)
	}
	la, err := s.ListSandboxes(c, a.ID)
	if err != nil || len(la) != 2 || la[0].Name != "x" || la[1].Name != "y" || la[0].AccountID != a.ID {
		t.Fatalf("alice's list = %+v, %v", la, err)
	}
	lb, _ := s.ListSandboxes(c, b.ID)
	if len(lb) != 1 || lb[0].AccountID != b.ID {
		t.Fatalf("bob's list = %+v", lb)
	}
	all, _ := s.ListSandboxes(c, "")
	if len(all) != 3 {
		t.Fatalf("all = %d records, want 3", len(all))
	}
	if err := s.DeleteSandbox(c, b.ID, "y"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(c, a.ID, "y"); err != nil {
		t.Fatalf("bob's delete of y removed alice's: %v", err)
	}
}

func oneWinner(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	const n = 8
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			r := sb(a, "race")
			r.ProviderName = fmt.Sprintf("replica-%d", i)
			errs[i] = s.InsertSandbox(c, r)
		})
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		switch {
		case err == nil:
			wins++
		case !errors.Is(err, store.ErrAlreadyExists):
			t.Errorf("a losing insert = %v, want ErrAlreadyExists", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d inserts of one name won, want 1 (%v)", wins, errs)
	}
}

func providerNameUnique(t *testing.T, s store.Store) {
	c := ctx(t)
	a, b := mustAccount(t, s, "alice"), mustAccount(t, s, "bob")
	x := sb(a, "x")
	if err := s.InsertSandbox(c, x); err != nil {
		t.Fatal(err)
	}
	y := sb(b, "y")
	y.ProviderName = x.ProviderName
	if err := s.InsertSandbox(c, y); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("a second record of one provider sandbox = %v, want ErrAlreadyExists", err)
	}
	y.Provider = "sprites" // another provider's namespace
	if err := s.InsertSandbox(c, y); err != nil {
		t.Fatalf("the same name on another provider: %v", err)
	}
}

func compareAndSet(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	if err := s.InsertSandbox(c, sb(a, "x")); err != nil {
		t.Fatal(err)
	}
	r1, _ := s.GetSandbox(c, a.ID, "x")
	r2 := r1
	r1.State = store.StateRunning
	if _, err := s.UpdateSandbox(c, r1); err != nil {
		t.Fatal(err)
	}
	r2.State = store.StateSuspended
	if _, err := s.UpdateSandbox(c, r2); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("a stale update = %v, want ErrConflict", err)
	}
	if got, _ := s.GetSandbox(c, a.ID, "x"); got.State != store.StateRunning {
		t.Fatalf("a stale update overwrote: %s", got.State)
	}
	// Concurrent updates from one version: exactly one wins.
	base, _ := s.GetSandbox(c, a.ID, "x")
	var wg sync.WaitGroup
	errs := make([]error, 6)
	for i := range errs {
		wg.Go(func() {
			r := base
			r.URL = fmt.Sprint("https://", i)
			_, errs[i] = s.UpdateSandbox(c, r)
		})
	}
	wg.Wait()
	wins := 0
	for _, err := range errs {
		if err == nil {
			wins++
		} else if !errors.Is(err, store.ErrConflict) {
			t.Errorf("a losing update = %v", err)
		}
	}
	if wins != 1 {
		t.Fatalf("%d concurrent updates of one version won, want 1", wins)
	}
	if err := s.DeleteSandbox(c, a.ID, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpdateSandbox(c, base); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("update of a deleted record = %v, want ErrNotFound", err)
	}
	// A copy of a destroyed record does not write over the name's next
	// sandbox, whose record starts again at Version 1.
	again := sb(a, "x")
	again.ProviderName = base.ProviderName + "-next"
	if err := s.InsertSandbox(c, again); err != nil {
		t.Fatal(err)
	}
	stale := base
	stale.Version, stale.State = 1, store.StateSuspended
	if _, err := s.UpdateSandbox(c, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("an update of the name's earlier sandbox at the new record's Version = %v, want ErrConflict", err)
	}
	if got, _ := s.GetSandbox(c, a.ID, "x"); got.ProviderName != again.ProviderName || got.State != again.State {
		t.Fatalf("an earlier sandbox's update wrote over the name's next: %+v", got)
	}
}

func touch(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	r := sb(a, "x")
	if err := s.InsertSandbox(c, r); err != nil {
		t.Fatal(err)
	}
	later := r.LastActivity.Add(time.Minute)
	if err := s.TouchSandbox(c, a.ID, "x", later); err != nil {
		t.Fatal(err)
	}
	if err := s.TouchSandbox(c, a.ID, "x", r.LastActivity); err != nil {
		t.Fatal(err)
	}
	got, _ := s.GetSandbox(c, a.ID, "x")
	if !got.LastActivity.Equal(later) {
		t.Fatalf("LastActivity = %v, want %v (never back)", got.LastActivity, later)
	}
	if got.Version != 1 {
		t.Fatalf("a touch bumped the version to %d", got.Version)
	}
	if err := s.TouchSandbox(c, a.ID, "nope", later); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("TouchSandbox(nope) = %v", err)
	}
}

// deleteIf: a conditional delete removes the name's record only while it
// is the sandbox it was read as, never the name's next sandbox (whose
// record starts again at Version 1) nor one updated since.
func deleteIf(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	if err := s.DeleteSandboxIf(c, sb(a, "never")); err != nil {
		t.Fatalf("conditional delete of an absent record = %v, want nil", err)
	}
	old := sb(a, "x")
	if err := s.InsertSandbox(c, old); err != nil {
		t.Fatal(err)
	}
	old.Version = 1
	if err := s.DeleteSandbox(c, a.ID, "x"); err != nil {
		t.Fatal(err)
	}
	next := sb(a, "x")
	next.ProviderName = old.ProviderName + "-next"
	if err := s.InsertSandbox(c, next); err != nil {
		t.Fatal(err)
	}
	// A stale copy of the destroyed sandbox at the new record's Version.
	if err := s.DeleteSandboxIf(c, old); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("conditional delete of the name's earlier sandbox = %v, want ErrConflict", err)
	}
	stale := old
	stale.Version = 0 // any version: the provider name still differs
	if err := s.DeleteSandboxIf(c, stale); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("conditional delete (any version) of the name's earlier sandbox = %v, want ErrConflict", err)
	}
	got, err := s.GetSandbox(c, a.ID, "x")
	if err != nil || got.ProviderName != next.ProviderName {
		t.Fatalf("the name's next sandbox after a stale delete: %+v, %v", got, err)
	}
	// Updated since it was read: its Version moved.
	read := got
	up := got
	up.State = store.StateSuspended
	if _, err := s.UpdateSandbox(c, up); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandboxIf(c, read); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("conditional delete at a Version since moved = %v, want ErrConflict", err)
	}
	if _, err := s.GetSandbox(c, a.ID, "x"); err != nil {
		t.Fatalf("a record updated since it was read was deleted: %v", err)
	}
	// The sandbox itself, at any version, then at its own: removed.
	read.Version = 0
	if err := s.DeleteSandboxIf(c, read); err != nil {
		t.Fatalf("conditional delete of the name's own sandbox = %v", err)
	}
	if _, err := s.GetSandbox(c, a.ID, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after a conditional delete: %v", err)
	}
	if err := s.InsertSandbox(c, sb(a, "y")); err != nil {
		t.Fatal(err)
	}
	y, _ := s.GetSandbox(c, a.ID, "y")
	if err := s.DeleteSandboxIf(c, y); err != nil {
		t.Fatalf("conditional delete at the record's Version = %v", err)
	}
	if _, err := s.GetSandbox(c, a.ID, "y"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after a conditional delete at its Version: %v", err)
	}
	// The name is free again.
	if err := s.InsertSandbox(c, sb(a, "y")); err != nil {
		t.Fatalf("insert after a conditional delete: %v", err)
	}
}

func deleteTolerant(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	if err := s.DeleteSandbox(c, a.ID, "never"); err != nil {
		t.Fatalf("delete of an absent record = %v", err)
	}
	if err := s.InsertSandbox(c, sb(a, "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteSandbox(c, a.ID, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetSandbox(c, a.ID, "x"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
	if err := s.InsertSandbox(c, sb(a, "x")); err != nil {
		t.Fatalf("the name is free again: %v", err)
	}
}

func intents(t *testing.T, s store.Store) {
	c := ctx(t)
	id1, err := s.AddIntent(c, store.Intent{AccountID: "a", Name: "x", Op: store.OpCreateNew, Provider: "sprites", ProviderName: "px"})
	if err != nil {
		t.Fatal(err)
	}
	id2, _ := s.AddIntent(c, store.Intent{AccountID: "a", Name: "y", Op: store.OpDestroyOnce, Provider: "sprites", ProviderName: "py", InstanceID: "i"})
	id3, _ := s.AddIntent(c, store.Intent{AccountID: "a", Name: "y", Op: store.OpTerminateSession, Provider: "sprites", ProviderName: "py", Arg: "s1"})
	if id1 == id2 || id2 == id3 {
		t.Fatal("intent ids repeat")
	}
	if err := s.SetIntent(c, id1, store.IntentConfirmed, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.SetIntent(c, id2, store.IntentUncertain, "timeout"); err != nil {
		t.Fatal(err)
	}
	open, err := s.OpenIntents(c)
	if err != nil || len(open) != 2 || open[0].ID != id2 || open[1].ID != id3 {
		t.Fatalf("OpenIntents = %+v, %v", open, err)
	}
	if open[0].State != store.IntentUncertain || open[0].Detail != "timeout" || open[0].InstanceID != "i" || open[1].Arg != "s1" || open[1].State != store.IntentPending {
		t.Fatalf("intents read back: %+v", open)
	}
	if err := s.SetIntent(c, 999999, store.IntentResolved, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("SetIntent(unknown) = %v", err)
	}
	// Settled intents go once older than the bound; open ones never.
	id4, _ := s.AddIntent(c, store.Intent{AccountID: "a", Name: "z", Op: store.OpDestroyOnce, Provider: "sprites", ProviderName: "pz"})
	if err := s.SetIntent(c, id4, store.IntentResolved, "absent"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneIntents(c, time.Now().Add(-time.Hour)); err != nil || n != 0 {
		t.Fatalf("PruneIntents(an hour ago) = %d, %v; want 0 (every intent is newer)", n, err)
	}
	if n, err := s.PruneIntents(c, time.Now().Add(time.Second)); err != nil || n != 2 {
		t.Fatalf("PruneIntents(now) = %d, %v; want 2 (the confirmed and the resolved)", n, err)
	}
	if open, err := s.OpenIntents(c); err != nil || len(open) != 2 || open[0].ID != id2 || open[1].ID != id3 {
		t.Fatalf("OpenIntents after a prune = %+v, %v; want the uncertain and the pending kept", open, err)
	}
	if err := s.SetIntent(c, id1, store.IntentResolved, ""); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("SetIntent of a pruned intent = %v, want ErrNotFound", err)
	}
}

// operationOnce: a create_checkpoint_once intent's operation id is the
// sandbox's once, whatever state the first is in, while another sandbox
// (or another op) may use it; its settled intent is not pruned while the
// sandbox has a record, and is once the record is gone.
func operationOnce(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	rec := sb(a, "box")
	if err := s.InsertSandbox(c, rec); err != nil {
		t.Fatal(err)
	}
	in := store.Intent{AccountID: a.ID, Name: "box", Op: store.OpCheckpointOnce, Provider: rec.Provider, ProviderName: rec.ProviderName, Arg: "op-1"}
	id, err := s.AddIntent(c, in)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddIntent(c, in); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("second intent of operation op-1 = %v, want ErrAlreadyExists", err)
	}
	if err := s.SetIntent(c, id, store.IntentConfirmed, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AddIntent(c, in); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("intent of operation op-1 after the first settled = %v, want ErrAlreadyExists", err)
	}
	other := in
	other.ProviderName = "another-sandbox"
	if _, err := s.AddIntent(c, other); err != nil {
		t.Fatalf("op-1 on another sandbox: %v", err)
	}
	term := in
	term.Op, term.Arg = store.OpTerminateSession, "s1"
	for range 2 {
		if _, err := s.AddIntent(c, term); err != nil {
			t.Fatalf("a terminate_session intent again (not once): %v", err)
		}
	}
	if n, err := s.PruneIntents(c, time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	} else if n != 0 {
		t.Fatalf("pruned %d; the settled checkpoint intent of a recorded sandbox must stay, the rest are open", n)
	}
	if _, err := s.AddIntent(c, in); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("op-1 after a prune = %v, want ErrAlreadyExists", err)
	}
	if err := s.DeleteSandbox(c, a.ID, "box"); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PruneIntents(c, time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("prune after the record went = %d, %v; want the settled checkpoint intent (1)", n, err)
	}
}

// intentsOf lists a sandbox name's intents, every state, oldest first, and
// no other name's or account's.
func intentsOf(t *testing.T, s store.Store) {
	c := ctx(t)
	a, b := mustAccount(t, s, "alice"), mustAccount(t, s, "bob")
	add := func(acct store.Account, name, arg string) int64 {
		id, err := s.AddIntent(c, store.Intent{AccountID: acct.ID, Name: name, Op: store.OpTerminateSession, Provider: "local", ProviderName: "p-" + name, Arg: arg})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	first := add(a, "box", "s1")
	second := add(a, "box", "s2")
	add(a, "other", "s1")
	add(b, "box", "s1")
	if err := s.SetIntent(c, first, store.IntentResolved, "session absent"); err != nil {
		t.Fatal(err)
	}
	got, err := s.IntentsOf(c, a.ID, "box")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != first || got[1].ID != second || got[0].State != store.IntentResolved || got[1].State != store.IntentPending ||
		got[1].Arg != "s2" || got[1].AccountID != a.ID || got[1].ProviderName != "p-box" {
		t.Fatalf("IntentsOf(alice, box) = %+v; want intents %d (resolved) and %d (pending)", got, first, second)
	}
	if got, err := s.IntentsOf(c, a.ID, "none"); err != nil || len(got) != 0 {
		t.Fatalf("IntentsOf a name without intents = %v, %v", got, err)
	}
}

// runners: a name is claimed once per account (the one arbiter), its id
// is unique across accounts, an update is compare-and-set, a delete frees
// the name.
func runners(t *testing.T, s store.Store) {
	c := ctx(t)
	a, b := mustAccount(t, s, "alice"), mustAccount(t, s, "bob")
	r := store.Runner{AccountID: a.ID, Name: "laptop", ID: "0b0e2f5c-1b1e-4a8e-9d55-6b7c1d2e3f40", KeyID: "k1", CreatedAt: now()}
	if _, err := s.RunnerByName(c, a.ID, "laptop"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RunnerByName before any = %v, want ErrNotFound", err)
	}
	if err := s.AddRunner(c, r); err != nil {
		t.Fatal(err)
	}
	again := r
	again.ID = "1b0e2f5c-1b1e-4a8e-9d55-6b7c1d2e3f40"
	if err := s.AddRunner(c, again); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("second AddRunner of alice/laptop = %v, want ErrAlreadyExists", err)
	}
	sameID := store.Runner{AccountID: b.ID, Name: "laptop", ID: r.ID, CreatedAt: now()}
	if err := s.AddRunner(c, sameID); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("AddRunner of a taken id = %v, want ErrAlreadyExists", err)
	}
	bobs := store.Runner{AccountID: b.ID, Name: "laptop", ID: "2b0e2f5c-1b1e-4a8e-9d55-6b7c1d2e3f40", Enrolled: true, CreatedAt: now()}
	if err := s.AddRunner(c, bobs); err != nil {
		t.Fatalf("bob's laptop: %v", err)
	}
	got, err := s.RunnerByName(c, a.ID, "laptop")
	if err != nil || got != r {
		t.Fatalf("RunnerByName = %+v, %v; want %+v", got, err, r)
	}
	next := r
	next.Enrolled, next.KeyID = true, ""
	stale := r
	stale.KeyID = "k0"
	if err := s.UpdateRunner(c, stale, next); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("UpdateRunner from a stale record = %v, want ErrConflict", err)
	}
	if err := s.UpdateRunner(c, r, next); err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateRunner(c, r, next); !errors.Is(err, store.ErrConflict) {
		t.Fatalf("UpdateRunner a second time from the same prev = %v, want ErrConflict", err)
	}
	if got, _ := s.RunnerByName(c, a.ID, "laptop"); got != next {
		t.Fatalf("after the update %+v, want %+v", got, next)
	}
	if err := s.UpdateRunner(c, store.Runner{AccountID: a.ID, Name: "none"}, next); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("UpdateRunner of a name without a record = %v, want ErrNotFound", err)
	}
	if err := s.AddRunner(c, store.Runner{AccountID: a.ID, Name: "desktop", ID: "3b0e2f5c-1b1e-4a8e-9d55-6b7c1d2e3f40", CreatedAt: now()}); err != nil {
		t.Fatal(err)
	}
	list, err := s.ListRunners(c, a.ID)
	if err != nil || len(list) != 2 || list[0].Name != "desktop" || list[1].Name != "laptop" {
		t.Fatalf("ListRunners(alice) = %+v, %v; want desktop, laptop", list, err)
	}
	if err := s.DeleteRunner(c, a.ID, "laptop"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteRunner(c, a.ID, "laptop"); err != nil {
		t.Fatalf("second DeleteRunner = %v, want nil", err)
	}
	if _, err := s.RunnerByName(c, a.ID, "laptop"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("RunnerByName after the delete = %v", err)
	}
	if got, err := s.RunnerByName(c, b.ID, "laptop"); err != nil || got != bobs {
		t.Fatalf("bob's record after alice's delete = %+v, %v", got, err)
	}
	if err := s.AddRunner(c, again); err != nil {
		t.Fatalf("AddRunner after the delete (the name is free): %v", err)
	}
}

func previewLinks(t *testing.T, s store.Store) {
	c := ctx(t)
	a, b := mustAccount(t, s, "alice"), mustAccount(t, s, "bob")
	t0 := now()
	l1 := store.PreviewLink{ID: "pl_1", AccountID: a.ID, Sandbox: "web", ProviderName: "p-1", Port: 8080, CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
	l2 := l1
	l2.ID, l2.Port, l2.CreatedAt = "pl_2", 9000, t0.Add(time.Second)
	old := l1
	old.ID, old.ProviderName = "pl_0", "p-0" // of an earlier sandbox of the name
	for _, l := range []store.PreviewLink{l1, l2, old} {
		if err := s.AddPreviewLink(c, l); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddPreviewLink(c, l1); !errors.Is(err, store.ErrAlreadyExists) {
		t.Fatalf("a taken id = %v", err)
	}
	if got, err := s.PreviewLinkByID(c, "pl_1"); err != nil || got != l1 {
		t.Fatalf("PreviewLinkByID = %+v %v, want %+v", got, err, l1)
	}
	if _, err := s.PreviewLinkByID(c, "pl_none"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("PreviewLinkByID(none) = %v", err)
	}
	if l, err := s.ListPreviewLinks(c, a.ID, "web", "p-1"); err != nil || len(l) != 2 || l[0] != l1 || l[1] != l2 {
		t.Fatalf("ListPreviewLinks = %+v %v", l, err)
	}
	if err := s.RevokePreviewLink(c, b.ID, "web", "pl_1", t0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("another account's revoke = %v", err)
	}
	at := t0.Add(time.Minute)
	for range 2 { // a second revoke keeps the first time
		if err := s.RevokePreviewLink(c, a.ID, "web", "pl_1", at); err != nil {
			t.Fatal(err)
		}
		got, err := s.PreviewLinkByID(c, "pl_1")
		if err != nil || !got.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("after the revoke: %+v %v", got, err)
		}
		at = at.Add(time.Hour)
	}
	if got, _ := s.PreviewLinkByID(c, "pl_2"); !got.RevokedAt.IsZero() {
		t.Fatalf("the other link was revoked: %+v", got)
	}
}
