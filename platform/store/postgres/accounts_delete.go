package postgres

import (
	"context"

	"github.com/managoat/managoat/platform/store"
)

// DeleteAccount implements store.Store. The account's row is locked first
// (FOR UPDATE, which a sandbox insert's foreign-key check waits for), so
// the look for its sandboxes and open intents, a statement of its own that
// sees every insert committed before the lock, and the delete see the
// same account: a create of one of its sandboxes is either seen, and the
// delete refused, or made after it, and refused by its foreign key.
func (s *Store) DeleteAccount(ctx context.Context, id string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return dbErr(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var got string
	if err := tx.QueryRow(ctx, `SELECT id FROM accounts WHERE id = $1 FOR UPDATE`, id).Scan(&got); err != nil {
		return notFound(dbErr(err))
	}
	var inUse bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE account_id = $1)
		OR EXISTS (SELECT 1 FROM intents WHERE account_id = $1 AND state IN ('pending', 'uncertain'))`, id).Scan(&inUse); err != nil {
		return dbErr(err)
	}
	if inUse {
		return store.ErrInUse
	}
	for _, q := range []string{`DELETE FROM api_keys WHERE account_id = $1`, `DELETE FROM runners WHERE account_id = $1`, `DELETE FROM runner_schedules WHERE account_id = $1`,
		`DELETE FROM intents WHERE account_id = $1`, `DELETE FROM preview_links WHERE account_id = $1`, `DELETE FROM accounts WHERE id = $1`} {
		if _, err := tx.Exec(ctx, q, id); err != nil {
			return dbErr(err)
		}
	}
	return dbErr(tx.Commit(ctx))
}
