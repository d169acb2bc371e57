package postgres

import (
	"context"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/managoat/managoat/internal/pgtest"
	"github.com/managoat/managoat/platform/store"
)

// TestLeaseConnectionKeepalives: a lease's connection (over TCP) has the
// server probe its peer after 10 s of silence, 3 probes 5 s apart, so the
// lease of a replica whose machine died is freed in about 25 s rather than
// after the kernel's two hours; a DSN's own setting is kept.
func TestLeaseConnectionKeepalives(t *testing.T) {
	srv := pgtest.Start(t, pgtest.TCP())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, c := range []struct {
		dsn  string
		want map[string]string
	}{
		{srv.TCPDSN("postgres"), map[string]string{"tcp_keepalives_idle": "10", "tcp_keepalives_interval": "5", "tcp_keepalives_count": "3"}},
		{srv.TCPDSN("postgres") + " tcp_keepalives_idle=30", map[string]string{"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "5"}},
	} {
		st, err := Open(ctx, c.dsn)
		if err != nil {
			t.Fatal(err)
		}
		l, ok, err := st.TryLease(ctx, "lifecycle")
		if err != nil || !ok {
			st.Close()
			t.Fatalf("TryLease: %v %v", ok, err)
		}
		for name, want := range c.want {
			var got string
			if err := l.conn.QueryRow(ctx, `SELECT setting FROM pg_settings WHERE name = $1`, name).Scan(&got); err != nil {
				t.Error(err)
			} else if got != want {
				t.Errorf("%s: the lease's connection has %s = %s, want %s", c.dsn, name, got, want)
			}
		}
		st.Close()
	}
}

// silencer forwards TCP connections to a server until silenced: then it
// holds every connection open and passes nothing either way, as a network
// that drops a machine's packets would.
type silencer struct {
	ln     net.Listener
	to     string
	mu     sync.Mutex
	conns  []net.Conn
	silent chan struct{}
	wg     sync.WaitGroup
}

func newSilencer(t *testing.T, to string) *silencer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silencer{ln: ln, to: to, silent: make(chan struct{})}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			s.mu.Lock()
			s.conns = append(s.conns, c, u)
			s.mu.Unlock()
			s.wg.Go(func() { s.pipe(u, c) })
			s.wg.Go(func() { s.pipe(c, u) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *silencer) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		select {
		case <-s.silent:
			continue // dropped
		default:
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

// TestLeaseHeldGivesUpOnASilentDatabase: a holder cut off from the
// database (its packets dropped: no error, no answer) learns within
// Held's 5 s bound that it cannot count on its lease, instead of waiting
// for TCP to give up (minutes), so its work's loop goes on and does not
// work on a lease another replica may hold by now.
func TestLeaseHeldGivesUpOnASilentDatabase(t *testing.T) {
	srv := pgtest.Start(t, pgtest.TCP())
	port := strings.TrimPrefix(strings.Fields(srv.TCPDSN("postgres"))[1], "port=")
	sil := newSilencer(t, "127.0.0.1:"+port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := Open(ctx, fmt.Sprintf("host=127.0.0.1 port=%d user=%s dbname=postgres sslmode=disable", sil.ln.Addr().(*net.TCPAddr).Port, pgtest.Role))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close() // 15 s: pgx's cancel request of the cut-off ping waits that long for the silent server
	h := st.Holder("lifecycle")
	defer h.Close()
	if !h.Held(ctx) {
		t.Fatal("a free lease was not taken")
	}
	close(sil.silent)
	got := make(chan bool, 1)
	t0 := time.Now()
	go func() { got <- h.Held(context.Background()) }()
	select {
	case held := <-got:
		if held {
			t.Fatal("a holder cut off from its database says it holds the lease")
		}
		t.Logf("Held said false after %v", time.Since(t0).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("Held waited 20 s on a database that does not answer")
		<-got
	}
}

// BenchmarkList10k lists an account's 10,000 records from PostgreSQL
// (issue 18's target for a listing: under 20 ms) the way ListSandboxes
// does (one COPY stream), and, in the same loop, with a parameterised
// query (a row message each, scanned by pgx): copy-ms and rows-ms per
// listing, copy/rows their ratio.
func BenchmarkList10k(b *testing.B) {
	srv := pgtest.Start(b)
	ctx := context.Background()
	st, err := Open(ctx, srv.DSN("postgres"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	a, err := st.CreateAccount(ctx, "bench")
	if err != nil {
		b.Fatal(err)
	}
	now := time.Now().UTC()
	for i := range 10000 {
		if err := st.InsertSandbox(ctx, store.Sandbox{AccountID: a.ID, Name: fmt.Sprintf("sb-%05d", i), Provider: "local",
			ProviderName: fmt.Sprintf("p-%05d", i), State: store.StateRunning, URL: "https://example.com/" + fmt.Sprint(i), CreatedAt: now, LastActivity: now}); err != nil {
			b.Fatal(err)
		}
	}
	var tc, tr time.Duration
	for b.Loop() {
		t0 := time.Now()
		l, err := st.ListSandboxes(ctx, a.ID)
		tc += time.Since(t0)
		if err != nil || len(l) != 10000 {
			b.Fatal(len(l), err)
		}
		t0 = time.Now()
		r, err := st.queryList(ctx, a.ID)
		tr += time.Since(t0)
		if err != nil || len(r) != 10000 || !reflect.DeepEqual(r[9999], l[9999]) {
			b.Fatal(len(r), err)
		}
	}
	b.ReportMetric(float64(tc.Microseconds())/1000/float64(b.N), "copy-ms")
	b.ReportMetric(float64(tr.Microseconds())/1000/float64(b.N), "rows-ms")
	b.ReportMetric(float64(tc)/float64(tr), "copy/rows")
}

// TestUpgradesADatabaseOfTheFirstSchema: a database written by replicas
// of the first schema (no disk_bytes) is opened by this one: the missing
// migrations are applied once, its records read as they were (no disk
// limit), and a disk limit is kept from then on.
func TestUpgradesADatabaseOfTheFirstSchema(t *testing.T) {
	srv := pgtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	old, err := pgx.Connect(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`,
		migrations[0],
		`INSERT INTO schema_migrations (version, applied_at) VALUES (1, 1)`,
		`INSERT INTO accounts (id, name, created_at) VALUES ('acct_1', 'alice', 1)`,
		fmt.Sprintf(`INSERT INTO sandboxes (account_id, name, provider, provider_name, state, mem_bytes, created_at, last_activity, version)
			VALUES ('acct_1', 'x', 'local', 'px', 'running', 1024, %d, %d, 3)`, now.UnixNano(), now.UnixNano()),
	} {
		if _, err := old.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	old.Close(ctx)
	migrated := func(s *Store) {
		t.Helper()
		var n, max int
		if err := s.pool.QueryRow(ctx, `SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max); err != nil || n != len(migrations) || max != len(migrations) {
			t.Fatalf("schema_migrations: %d rows up to %d (%v), want %d", n, max, err, len(migrations))
		}
	}
	s, err := Open(ctx, srv.DSN("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	migrated(s)
	got, err := s.GetSandbox(ctx, "acct_1", "x")
	if err != nil || got.Limits.MemoryBytes != 1024 || got.Limits.DiskBytes != 0 || got.Version != 3 || !got.CreatedAt.Equal(now) {
		t.Fatalf("the first schema's record: %+v, %v", got, err)
	}
	got.Limits.DiskBytes = 1 << 30
	if _, err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(ctx, srv.DSN("postgres")); err != nil { // applies nothing again
		t.Fatal(err)
	}
	defer s.Close()
	migrated(s)
	if l, err := s.ListSandboxes(ctx, "acct_1"); err != nil || len(l) != 1 || l[0].Limits.DiskBytes != 1<<30 {
		t.Fatalf("the disk limit after the upgrade: %+v, %v", l, err)
	}
}
