package sqlite

import (
	"context"
	"database/sql"

	"github.com/managoat/managoat/platform/store"
)

// DeleteAccount implements store.Store: the account goes (its keys by
// their foreign key's cascade) only while no sandbox record and no open
// intent is its, in the statement that deletes it; its runner records, runner
// schedules, settled intents and preview links go in the same transaction.
func (s *Store) DeleteAccount(ctx context.Context, id string) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		// Its preview links first (their foreign key): undone with the
		// rest when the account is in use.
		if _, err := tx.ExecContext(ctx, `DELETE FROM preview_links WHERE account_id = ?`, id); err != nil {
			return err
		}
		r, err := tx.ExecContext(ctx, `DELETE FROM accounts WHERE id = ?
			AND NOT EXISTS (SELECT 1 FROM sandboxes WHERE account_id = ?)
			AND NOT EXISTS (SELECT 1 FROM intents WHERE account_id = ? AND state IN ('pending', 'uncertain'))`, id, id, id)
		if err != nil {
			return err
		}
		if n, _ := r.RowsAffected(); n == 0 {
			var one int
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM accounts WHERE id = ?`, id).Scan(&one); err != nil {
				return notFound(err)
			}
			return store.ErrInUse
		}
		for _, q := range []string{`DELETE FROM api_keys WHERE account_id = ?`, `DELETE FROM runners WHERE account_id = ?`, `DELETE FROM runner_schedules WHERE account_id = ?`, `DELETE FROM intents WHERE account_id = ?`} {
			if _, err := tx.ExecContext(ctx, q, id); err != nil {
				return err
			}
		}
		return nil
	})
}
