package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/managoat/managoat/platform/store"
)

// usageSQL reads a runner's counter (migration 6's triggers keep it).
const usageSQL = `SELECT sandboxes, mem_bytes, cpu_millis, disk_bytes FROM sandbox_usage WHERE provider = ? AND prefix = ?`

// UsageOf implements store.Placer.
func (s *Store) UsageOf(ctx context.Context, provider, prefix string) (store.Usage, error) {
	var u store.Usage
	err := s.db.QueryRowContext(ctx, usageSQL, provider, prefix).Scan(&u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Usage{}, nil
	}
	return u, err
}

// usagesChunk bounds the prefixes of one query (SQLite's variables).
const usagesChunk = 500

// Usages implements store.Placer.
func (s *Store) Usages(ctx context.Context, provider string, prefixes []string) (map[string]store.Usage, error) {
	out := make(map[string]store.Usage, len(prefixes))
	for len(prefixes) > 0 {
		part := prefixes[:min(len(prefixes), usagesChunk)]
		prefixes = prefixes[len(part):]
		args := make([]any, 0, len(part)+1)
		args = append(args, provider)
		for _, p := range part {
			args = append(args, p)
		}
		rows, err := s.db.QueryContext(ctx, `SELECT prefix, sandboxes, mem_bytes, cpu_millis, disk_bytes FROM sandbox_usage WHERE provider = ? AND prefix IN (?`+
			strings.Repeat(", ?", len(part)-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var p string
			var u store.Usage
			if err := rows.Scan(&p, &u.Sandboxes, &u.MemoryBytes, &u.CPUMillis, &u.DiskBytes); err != nil {
				rows.Close()
				return nil, err
			}
			out[p] = u
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// CountSandboxes implements store.Placer: the owner counts its cache,
// another process the table's account index.
func (s *Store) CountSandboxes(ctx context.Context, accountID string) (int, error) {
	if s.Owner() {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return len(s.names[accountID]), nil
	}
	var n int
	err := s.db.QueryRowContext(ctx, `SELECT count(*) FROM sandboxes WHERE account_id = ?`, accountID).Scan(&n)
	return n, err
}

// InsertSandboxWithin implements store.Placer: the counter's read and the
// insert (whose trigger adds to the counter) are made under the store's
// write lock, which every write of this database takes (one process owns
// it).
func (s *Store) InsertSandboxWithin(ctx context.Context, b store.Sandbox, r store.Room) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	if err := inRoom(b, r); err != nil {
		return err
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

// inRoom refuses a record the room's counter would not count.
func inRoom(b store.Sandbox, r store.Room) error {
	if b.Provider != r.Provider || r.Prefix == "" || store.UsageKey(b.ProviderName) != r.Prefix {
		return fmt.Errorf("store: sandbox %q (%s %s) is not counted in the room of %s %q", b.Name, b.Provider, b.ProviderName, r.Provider, r.Prefix)
	}
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
