package storetest

import (
	"errors"
	"testing"

	"github.com/managoat/managoat/platform/store"
)

// deleteAccount: an account holding a sandbox record, or an open intent,
// is not deleted (ErrInUse) and keeps its keys; without them it goes with
// its keys, runner records and runner schedules, its name is free again,
// and another account is untouched; an unknown ID is ErrNotFound.
func deleteAccount(t *testing.T, s store.Store) {
	c := ctx(t)
	a := mustAccount(t, s, "alice")
	b := mustAccount(t, s, "bob")
	for _, k := range []store.Key{{ID: "ka", AccountID: a.ID, Hash: []byte{1}, CreatedAt: now()}, {ID: "kb", AccountID: b.ID, Hash: []byte{2}, CreatedAt: now()}} {
		if err := s.AddKey(c, k); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.AddRunner(c, store.Runner{AccountID: a.ID, Name: "laptop", ID: "11111111-2222-3333-4444-555555555555", CreatedAt: now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRunnerSchedule(c, store.RunnerSchedule{AccountID: a.ID, RunnerID: "11111111-2222-3333-4444-555555555555", Name: "laptop",
		State: store.ScheduleCordoned, UpdatedAt: now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetRunnerSchedule(c, store.RunnerSchedule{AccountID: b.ID, RunnerID: "66666666-2222-3333-4444-555555555555", Name: "desk",
		State: store.ScheduleDraining, UpdatedAt: now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.InsertSandbox(c, sb(a, "x")); err != nil {
		t.Fatal(err)
	}
	if err := s.AddPreviewLink(c, store.PreviewLink{ID: "pl_a", AccountID: a.ID, Sandbox: "x", Port: 80, CreatedAt: now(), ExpiresAt: now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAccount(c, a.ID); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("DeleteAccount of an account with a sandbox = %v, want ErrInUse", err)
	}
	if _, err := s.PreviewLinkByID(c, "pl_a"); err != nil {
		t.Fatalf("a refused DeleteAccount lost the account's preview link: %v", err)
	}
	if _, err := s.KeyByID(c, "ka"); err != nil {
		t.Fatalf("a refused DeleteAccount lost the account's key: %v", err)
	}
	if err := s.DeleteSandbox(c, a.ID, "x"); err != nil {
		t.Fatal(err)
	}
	id, err := s.AddIntent(c, store.Intent{AccountID: a.ID, Name: "x", Op: store.OpDestroyOnce, Provider: "local", ProviderName: "px"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAccount(c, a.ID); !errors.Is(err, store.ErrInUse) {
		t.Fatalf("DeleteAccount of an account with an open intent = %v, want ErrInUse", err)
	}
	if err := s.SetIntent(c, id, store.IntentConfirmed, ""); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAccount(c, a.ID); err != nil {
		t.Fatalf("DeleteAccount = %v", err)
	}
	if _, err := s.AccountByID(c, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the deleted account: %v, want ErrNotFound", err)
	}
	if _, err := s.KeyByID(c, "ka"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the deleted account's key: %v, want ErrNotFound", err)
	}
	if _, err := s.PreviewLinkByID(c, "pl_a"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the deleted account's preview link: %v, want ErrNotFound", err)
	}
	if rs, err := s.ListRunners(c, a.ID); err != nil || len(rs) != 0 {
		t.Fatalf("the deleted account's runners: %v %v", rs, err)
	}
	if sc, err := s.RunnerSchedules(c, a.ID); err != nil || len(sc) != 0 {
		t.Fatalf("the deleted account's runner schedules: %+v %v, want none", sc, err)
	}
	if sc, err := s.RunnerSchedules(c, b.ID); err != nil || len(sc) != 1 {
		t.Fatalf("another account's runner schedules: %+v %v, want its one", sc, err)
	}
	if _, err := s.KeyByID(c, "kb"); err != nil {
		t.Fatalf("another account's key: %v", err)
	}
	if err := s.DeleteAccount(c, a.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteAccount again = %v, want ErrNotFound", err)
	}
	if _, err := s.CreateAccount(c, "alice"); err != nil {
		t.Fatalf("the name of a deleted account: %v", err)
	}
}
