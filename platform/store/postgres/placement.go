package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/managoat/managoat/platform/store"
)

// usageSQL sums the records of a provider's name range, without those
// parked by destroy; the (provider, provider_name) index serves the range.
const usageSQL = `SELECT count(*), coalesce(sum(mem_bytes), 0)::BIGINT, coalesce(sum(cpu_millis), 0)::BIGINT, coalesce(sum(disk_bytes), 0)::BIGINT
	FROM sandboxes WHERE provider = $1 AND provider_name >= $2 AND provider_name < $3 AND NOT (state = 'parked' AND parked_by = 'destroy')`

// UsageOf implements store.Placer.
func (s *Store) UsageOf(ctx context.Context, provider, prefix string) (store.Usage, error) {
	var u store.Usage
	err := s.db.QueryRow(ctx, usageSQL, provider, prefix, store.PrefixEnd(prefix)).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes)
	return u, err
}

// InsertSandboxWithin implements store.Placer: one transaction takes an
// advisory lock of the prefix (the runner), sums its records and inserts,
// so two replicas placing on one runner are counted one after the other
// (the second sees the first's record); the lock goes with the
// transaction.
func (s *Store) InsertSandboxWithin(ctx context.Context, b store.Sandbox, r store.Room) error {
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 4242))`, r.Provider+" "+r.Prefix); err != nil {
			return err
		}
		var u store.Usage
		if err := tx.QueryRow(ctx, usageSQL, r.Provider, r.Prefix, store.PrefixEnd(r.Prefix)).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes); err != nil {
			return err
		}
		if err := r.Fits(u, b); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO sandboxes (`+sbCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 1, $16)`,
			b.AccountID, b.Name, b.Provider, b.ProviderName, b.InstanceID, b.State, b.URL,
			b.Limits.MemoryBytes, int64(b.Limits.Pids), int64(b.Limits.CPUMillis), int64(b.Limits.WallClock),
			ns(b.CreatedAt), ns(b.LastActivity), ns(b.ParkedAt), b.ParkedBy, b.Limits.DiskBytes)
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
