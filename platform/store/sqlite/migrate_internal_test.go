package sqlite

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// TestUpgradesADatabaseOfTheFirstSchema: a database written by a serve of
// the first schema (no disk_bytes) is opened by this one: the missing
// migrations are applied once, its records read as they were (no disk
// limit), and a disk limit can be kept from then on.
func TestUpgradesADatabaseOfTheFirstSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "platform.db")
	ctx := context.Background()
	old, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	for _, q := range []string{
		`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`,
		migrations[0],
		`INSERT INTO schema_migrations (version, applied_at) VALUES (1, 1)`,
		`INSERT INTO accounts (id, name, created_at) VALUES ('acct_1', 'alice', 1)`,
	} {
		if _, err := old.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.ExecContext(ctx, `INSERT INTO sandboxes (account_id, name, provider, provider_name, state, mem_bytes, created_at, last_activity, version)
		VALUES ('acct_1', 'x', 'local', 'px', 'running', 1024, ?, ?, 3)`, now.UnixNano(), now.UnixNano()); err != nil {
		t.Fatal(err)
	}
	old.Close()
	s, err := Open(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	migrated := func(s *Store) {
		t.Helper()
		var n, max int
		if err := s.db.QueryRowContext(ctx, `SELECT count(*), max(version) FROM schema_migrations`).Scan(&n, &max); err != nil || n != len(migrations) || max != len(migrations) {
			t.Fatalf("schema_migrations: %d rows up to %d (%v), want %d", n, max, err, len(migrations))
		}
	}
	migrated(s)
	got, err := s.GetSandbox(ctx, "acct_1", "x")
	if err != nil || got.Limits != (sandbox.Limits{MemoryBytes: 1024}) || got.Version != 3 || !got.CreatedAt.Equal(now) || got.State != store.StateRunning {
		t.Fatalf("the first schema's record: %+v, %v", got, err)
	}
	got.Limits.DiskBytes = 1 << 30
	if _, err := s.UpdateSandbox(ctx, got); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err = Open(ctx, path); err != nil { // applies nothing again
		t.Fatal(err)
	}
	defer s.Close()
	migrated(s)
	if got, _ := s.GetSandbox(ctx, "acct_1", "x"); got.Limits.DiskBytes != 1<<30 {
		t.Fatalf("the disk limit after the upgrade: %+v", got.Limits)
	}
}
