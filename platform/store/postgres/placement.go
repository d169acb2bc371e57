package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/managoat/managoat/platform/store"
)

// usageSQL reads a runner's counter (migration 6's trigger keeps it).
const usageSQL = `SELECT sandboxes, mem_bytes, cpu_millis, disk_bytes FROM sandbox_usage WHERE provider = $1 AND prefix = $2`

// UsageOf implements store.Placer.
func (s *Store) UsageOf(ctx context.Context, provider, prefix string) (store.Usage, error) {
	var u store.Usage
	err := s.db.QueryRow(ctx, usageSQL, provider, prefix).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes)
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Usage{}, nil
	}
	return u, dbErr(err)
}

// Usages implements store.Placer.
func (s *Store) Usages(ctx context.Context, provider string, prefixes []string) (map[string]store.Usage, error) {
	out := make(map[string]store.Usage, len(prefixes))
	if len(prefixes) == 0 {
		return out, nil
	}
	rows, err := s.db.Query(ctx, `SELECT prefix, sandboxes, mem_bytes, cpu_millis, disk_bytes FROM sandbox_usage WHERE provider = $1 AND prefix = ANY($2)`, provider, prefixes)
	if err != nil {
		return nil, dbErr(err)
	}
	defer rows.Close()
	for rows.Next() {
		var p string
		var u store.Usage
		if err := rows.Scan(&p, &u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes); err != nil {
			return nil, dbErr(err)
		}
		out[p] = u
	}
	return out, dbErr(rows.Err())
}

// CountSandboxes implements store.Placer (the account index's count).
func (s *Store) CountSandboxes(ctx context.Context, accountID string) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, `SELECT count(*) FROM sandboxes WHERE account_id = $1`, accountID).Scan(&n)
	return n, dbErr(err)
}

// InsertSandboxWithin implements store.Placer: one transaction takes an
// advisory lock of the prefix (the runner), makes sure its counter row
// exists, reads it FOR UPDATE (so a write of another record of the
// runner, whose trigger updates the row, is waited for and seen) and
// inserts, the trigger adding to the counter: two replicas placing on one
// runner are counted one after the other (the second sees the first's
// record); the locks go with the transaction.
func (s *Store) InsertSandboxWithin(ctx context.Context, b store.Sandbox, r store.Room) error {
	if b.Provider != r.Provider || r.Prefix == "" || store.UsageKey(b.ProviderName) != r.Prefix {
		return fmt.Errorf("store: sandbox %q (%s %s) is not counted in the room of %s %q", b.Name, b.Provider, b.ProviderName, r.Provider, r.Prefix)
	}
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 4242))`, r.Provider+" "+r.Prefix); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO sandbox_usage (provider, prefix) VALUES ($1, $2) ON CONFLICT DO NOTHING`, r.Provider, r.Prefix); err != nil {
			return err
		}
		var u store.Usage
		err := tx.QueryRow(ctx, usageSQL+` FOR UPDATE`, r.Provider, r.Prefix).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if err := r.Fits(u, b); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, insertSandboxSQL, insertArgs(b)...)
		return err
	})
	switch pgCode(err) {
	case uniqueViolation:
		return wrapExists(b.Name)
	case foreignKeyViolation:
		return wrapAccount(b.AccountID)
	}
	if _, ok := err.(*store.NoRoomError); ok {
		return err
	}
	return dbErr(err)
}

// SetRunnerSchedule implements store.Placer.
func (s *Store) SetRunnerSchedule(ctx context.Context, sch store.RunnerSchedule) error {
	labels, err := json.Marshal(sch.Labels)
	if err != nil {
		return err
	}
	_, err = s.db.Exec(ctx, `INSERT INTO runner_schedules (account_id, runner_id, name, state, labels, updated_at) VALUES ($1, $2, $3, $4, $5, $6)
		ON CONFLICT (account_id, runner_id) DO UPDATE SET name = excluded.name, state = excluded.state, labels = excluded.labels, updated_at = excluded.updated_at`,
		sch.AccountID, sch.RunnerID, sch.Name, sch.State, string(labels), ns(sch.UpdatedAt))
	return err
}

// RunnerSchedules implements store.Placer.
func (s *Store) RunnerSchedules(ctx context.Context, accountID string) ([]store.RunnerSchedule, error) {
	rows, err := s.db.Query(ctx, `SELECT account_id, runner_id, name, state, labels, updated_at FROM runner_schedules WHERE account_id = $1 ORDER BY runner_id`, accountID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.RunnerSchedule
	for rows.Next() {
		var r store.RunnerSchedule
		var labels string
		var at int64
		if err := rows.Scan(&r.AccountID, &r.RunnerID, &r.Name, &r.State, &labels, &at); err != nil {
			return nil, err
		}
		_ = json.Unmarshal([]byte(labels), &r.Labels)
		r.UpdatedAt = tm(at)
		out = append(out, r)
	}
	return out, dbErr(rows.Err())
}

func wrapExists(name string) error { return fmt.Errorf("sandbox %q: %w", name, store.ErrAlreadyExists) }
func wrapAccount(id string) error  { return fmt.Errorf("account %q: %w", id, store.ErrNotFound) }
