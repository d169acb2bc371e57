package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/managoat/managoat/internal/pgtest"
	"github.com/managoat/managoat/internal/testenv"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/platform/store/postgres"
	"github.com/managoat/managoat/platform/store/storetest"
	"github.com/managoat/managoat/sandbox"
)

func TestMain(m *testing.M) {
	testenv.Enclose()
	goleak.VerifyTestMain(m)
}

// freshDB makes an empty database on srv and returns its DSN.
func freshDB(t *testing.T, srv *pgtest.Server) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	db := fmt.Sprintf("t%d", dbSeq.Add(1))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+db); err != nil {
		t.Fatal(err)
	}
	return srv.DSN(db)
}

var dbSeq atomic.Int64

func open(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := postgres.Open(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestPostgres runs every case on one throwaway cluster (starting one
// takes seconds), each on a database of its own.
func TestPostgres(t *testing.T) {
	srv := pgtest.Start(t)
	t.Run("Conformance", func(t *testing.T) { conformance(t, srv) })
	t.Run("Replicas", func(t *testing.T) { replicas(t, srv) })
	t.Run("Lease", func(t *testing.T) { lease(t, srv) })
	t.Run("Holder", func(t *testing.T) { holder(t, srv) })
	t.Run("Outage", func(t *testing.T) { outage(t, srv) }) // last: it stops the server
}

// conformance: the Postgres store passes the kit the SQLite one does.
func conformance(t *testing.T, srv *pgtest.Server) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, freshDB(t, srv)) })
}

// replicas: replicas that start together migrate once, and two of
// them creating one name concurrently see one winner, the other
// ErrAlreadyExists; a restart finds every record.
func replicas(t *testing.T, srv *pgtest.Server) {
	dsn := freshDB(t, srv)
	const n = 4
	stores := make([]*postgres.Store, n)
	var wg sync.WaitGroup
	for i := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st, err := postgres.Open(ctx, dsn)
			if err != nil {
				t.Error(err)
				return
			}
			stores[i] = st
		}()
	}
	wg.Wait()
	if t.Failed() {
		for _, st := range stores {
			if st != nil {
				st.Close()
			}
		}
		t.FailNow()
	}
	ctx := context.Background()
	acct, err := stores[0].CreateAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var won atomic.Int64
	for i, st := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := st.InsertSandbox(ctx, store.Sandbox{AccountID: acct.ID, Name: "box", Provider: "local",
				ProviderName: fmt.Sprintf("box-%d", i), State: store.StateCreating, CreatedAt: time.Now(), LastActivity: time.Now()})
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, store.ErrAlreadyExists):
				t.Errorf("replica %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if won.Load() != 1 {
		t.Fatalf("%d replicas won the name, want 1", won.Load())
	}
	for _, st := range stores {
		st.Close()
	}
	again := open(t, dsn)
	defer again.Close()
	if _, err := again.GetSandbox(ctx, acct.ID, "box"); err != nil {
		t.Fatalf("after a restart: %v", err)
	}
}

// lease: one replica holds a lease at a time; when the holder's
// connection dies (the replica died), another takes the lease.
func lease(t *testing.T, srv *pgtest.Server) {
	dsn := freshDB(t, srv)
	a, b := open(t, dsn), open(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	la, ok, err := a.TryLease(ctx, "reaper")
	if err != nil || !ok {
		t.Fatalf("first TryLease: %v %v", ok, err)
	}
	if _, ok, err := b.TryLease(ctx, "reaper"); err != nil || ok {
		t.Fatalf("a second replica took a held lease: %v %v", ok, err)
	}
	lb, ok, err := b.TryLease(ctx, "parker")
	if err != nil || !ok {
		t.Fatalf("another lease: %v %v", ok, err)
	}
	lb.Release()
	if !la.Held(ctx) {
		t.Fatal("the holder lost its lease")
	}
	// The holder dies: its backend is terminated, as a crash would.
	killAdvisoryHolders(t, srv)
	deadline := time.Now().Add(10 * time.Second)
	for {
		lb, ok, err := b.TryLease(ctx, "reaper")
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			lb.Release()
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no replica took the lease of a dead holder")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if la.Held(ctx) {
		t.Fatal("the dead holder still says it holds the lease")
	}
	la.Release()
}

// holder: of two replicas' holders of one lease, one holds it; when the
// holder's replica dies (its store closed), the other takes it at its
// next try.
func holder(t *testing.T, srv *pgtest.Server) {
	dsn := freshDB(t, srv)
	a, b := open(t, dsn), open(t, dsn)
	defer b.Close()
	ctx := context.Background()
	ha, hb := a.Holder("lifecycle"), b.Holder("lifecycle")
	defer hb.Close()
	if !ha.Held(ctx) {
		t.Fatal("the first replica did not take a free lease")
	}
	for range 3 {
		if hb.Held(ctx) {
			t.Fatal("two replicas hold one lease")
		}
		if !ha.Held(ctx) {
			t.Fatal("the holder lost its lease")
		}
	}
	// Replica a dies: the server ends its connections.
	killAdvisoryHolders(t, srv)
	defer a.Close()
	defer ha.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !hb.Held(ctx) {
		if time.Now().After(deadline) {
			t.Fatal("the surviving replica never took the lease")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killAdvisoryHolders ends every connection holding an advisory lock, as
// the death of the replicas holding them would.
func killAdvisoryHolders(t *testing.T, srv *pgtest.Server) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted`); err != nil {
		t.Fatal(err)
	}
}

// outage: while the database is down every call is
// Unavailable{database_unavailable} (the API's 503), never a hang or
// another kind; when it is back the same store works again.
func outage(t *testing.T, srv *pgtest.Server) {
	st := open(t, freshDB(t, srv))
	defer st.Close()
	ctx := context.Background()
	acct, err := st.CreateAccount(ctx, "acme")
	if err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = st.GetSandbox(cctx, acct.ID, "box")
	cancel()
	var u *sandbox.UnavailableError
	if !errors.As(err, &u) || u.Reason != postgres.ReasonDatabaseUnavailable {
		t.Fatalf("with the database down: %v, want unavailable/database_unavailable", err)
	}
	if _, err := st.ListSandboxes(ctx, ""); !errors.As(err, &u) {
		t.Fatalf("a listing with the database down: %v", err)
	}
	srv.Restart(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := st.GetSandbox(ctx, acct.ID, "box")
		if errors.Is(err, store.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the database came back: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
