package sqlite

import (
	"context"
	"encoding/json"

	"github.com/managoat/managoat/platform/store"
)

// usageSQL sums the records of a provider's name range, without those
// parked by destroy; the (provider, provider_name) index serves the range.
const usageSQL = `SELECT count(*), coalesce(sum(mem_bytes), 0), coalesce(sum(cpu_millis), 0), coalesce(sum(disk_bytes), 0)
	FROM sandboxes WHERE provider = ? AND provider_name >= ? AND provider_name < ? AND NOT (state = 'parked' AND parked_by = 'destroy')`

// UsageOf implements store.Placer.
func (s *Store) UsageOf(ctx context.Context, provider, prefix string) (store.Usage, error) {
	var u store.Usage
	err := s.db.QueryRowContext(ctx, usageSQL, provider, prefix, store.PrefixEnd(prefix)).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes)
	return u, err
}

// InsertSandboxWithin implements store.Placer: the count and the insert
// are made under the store's write lock, which every write of this
// database takes (one process owns it).
func (s *Store) InsertSandboxWithin(ctx context.Context, b store.Sandbox, r store.Room) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	u, err := s.UsageOf(ctx, r.Provider, r.Prefix)
	if err != nil {
		return err
	}
	if err := r.Fits(u, b); err != nil {
		return err
	}
	if err := s.insertSQL(ctx, b); err != nil {
		return err
	}
	b.Version = 1
	s.mu.Lock()
	if s.cache[b.AccountID] == nil {
		s.cache[b.AccountID] = map[string]store.Sandbox{}
	}
	s.cache[b.AccountID][b.Name] = b
	s.addName(b.AccountID, b.Name)
	s.mu.Unlock()
	return nil
}

// SetRunnerSchedule implements store.Placer.
func (s *Store) SetRunnerSchedule(ctx context.Context, sch store.RunnerSchedule) error {
	labels, err := json.Marshal(sch.Labels)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO runner_schedules (account_id, runner_id, name, state, labels, updated_at) VALUES (?, ?, ?, ?, ?, ?)
		ON CONFLICT (account_id, runner_id) DO UPDATE SET name = excluded.name, state = excluded.state, labels = excluded.labels, updated_at = excluded.updated_at`,
		sch.AccountID, sch.RunnerID, sch.Name, sch.State, string(labels), ns(sch.UpdatedAt))
	return err
}

// RunnerSchedules implements store.Placer.
func (s *Store) RunnerSchedules(ctx context.Context, accountID string) ([]store.RunnerSchedule, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT account_id, runner_id, name, state, labels, updated_at FROM runner_schedules WHERE account_id = ? ORDER BY runner_id`, accountID)
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
	return out, rows.Err()
}
