// Package sqlite is the platform's embedded store: one SQLite file in the
// state directory, through modernc.org/sqlite (pure Go, so the binary stays
// cgo-free), in WAL mode with a busy timeout, so a restarted `managoat
// serve` finds every record where it left it.
//
//	st, err := sqlite.Open(ctx, filepath.Join(stateDir, "platform.db"))
//
// The sandbox records are mirrored in memory and written through: the
// process that holds the database's lock file (<path>.lock, taken by Open
// when free) serves every read of them from memory (a listing of 10,000
// records is a copy, not 10,000 row decodes) and is the only one that may
// write them; a process that finds the lock held (`serve admin` beside a
// running serve) reads them from SQLite and is refused a write of one
// (ErrNotOwner). Accounts, keys and intents are always read from SQLite, so
// a key revoked by another process is refused at once.
//
// Migrations are the numbered SQL statements of this file, applied in
// order inside one transaction each and recorded in schema_migrations; they
// are a few statements, so a migration library (goose, migrate) would add
// more than it saves. Times are Unix nanoseconds in UTC.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/managoat/managoat/internal/flock"
	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// migrations are applied in order; never edit one that shipped, add one.
var migrations = []string{
	`CREATE TABLE accounts (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
		hash BLOB NOT NULL,
		label TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		revoked_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX api_keys_account ON api_keys(account_id);
	CREATE TABLE sandboxes (
		account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
		name TEXT NOT NULL,
		provider TEXT NOT NULL,
		provider_name TEXT NOT NULL,
		instance_id TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		url TEXT NOT NULL DEFAULT '',
		mem_bytes INTEGER NOT NULL DEFAULT 0,
		pids INTEGER NOT NULL DEFAULT 0,
		cpu_millis INTEGER NOT NULL DEFAULT 0,
		wall_clock_ns INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		last_activity INTEGER NOT NULL,
		parked_at INTEGER NOT NULL DEFAULT 0,
		parked_by TEXT NOT NULL DEFAULT '',
		version INTEGER NOT NULL,
		PRIMARY KEY (account_id, name),
		UNIQUE (provider, provider_name)
	);
	CREATE TABLE intents (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		account_id TEXT NOT NULL,
		name TEXT NOT NULL,
		op TEXT NOT NULL,
		provider TEXT NOT NULL,
		provider_name TEXT NOT NULL,
		instance_id TEXT NOT NULL DEFAULT '',
		arg TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL
	);
	CREATE INDEX intents_open ON intents(state) WHERE state IN ('pending', 'uncertain');`,
	// 2: a sandbox's disk limit (sandbox.Limits.DiskBytes), which a wake
	// from a park by destroy creates the sandbox with again.
	`ALTER TABLE sandboxes ADD COLUMN disk_bytes INTEGER NOT NULL DEFAULT 0;`,
	// 3: the runner names accounts hold (their random ids, and what may
	// connect as each); an operation id used once per sandbox (earlier
	// duplicates, which the API let through, are kept as the first).
	`CREATE TABLE runners (
		account_id TEXT NOT NULL,
		name TEXT NOT NULL,
		id TEXT NOT NULL UNIQUE,
		enrolled INTEGER NOT NULL DEFAULT 0,
		key_id TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		PRIMARY KEY (account_id, name)
	);
	DELETE FROM intents WHERE op = 'create_checkpoint_once' AND id NOT IN
		(SELECT min(id) FROM intents WHERE op = 'create_checkpoint_once' GROUP BY provider, provider_name, arg);
	CREATE UNIQUE INDEX intents_operation ON intents(provider, provider_name, arg) WHERE op = 'create_checkpoint_once';
	CREATE INDEX intents_sandbox ON intents(account_id, name);`,
	// 4: what an account's operator set on its runners (cordon, drain,
	// labels), by runner id (store.RunnerSchedule).
	`CREATE TABLE runner_schedules (
		account_id TEXT NOT NULL,
		runner_id TEXT NOT NULL,
		name TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL DEFAULT '',
		labels TEXT NOT NULL DEFAULT 'null',
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (account_id, runner_id)
	);`,
	// 5: the count of a runner's records (store.Placer's UsageOf, under
	// InsertSandboxWithin's lock) read from the index alone.
	`CREATE INDEX sandboxes_usage ON sandboxes(provider, provider_name, state, parked_by, mem_bytes, cpu_millis, disk_bytes);`,
	// 6: what the records of each runner ask (store.Placer's UsageOf and
	// InsertSandboxWithin), a counter row per provider and name prefix
	// (store.UsageKey: the provider name up to its last '-') kept by
	// triggers on every write of a record, so a placement reads one row
	// instead of summing the runner's records.
	`CREATE TABLE sandbox_usage (
		provider TEXT NOT NULL,
		prefix TEXT NOT NULL,
		sandboxes INTEGER NOT NULL DEFAULT 0,
		mem_bytes INTEGER NOT NULL DEFAULT 0,
		cpu_millis INTEGER NOT NULL DEFAULT 0,
		disk_bytes INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (provider, prefix)
	);
	INSERT INTO sandbox_usage (provider, prefix, sandboxes, mem_bytes, cpu_millis, disk_bytes)
		SELECT provider, rtrim(provider_name, '` + usageKeyChars + `'), count(*), sum(mem_bytes), sum(cpu_millis), sum(disk_bytes) FROM sandboxes
		WHERE rtrim(provider_name, '` + usageKeyChars + `') <> '' AND NOT (state = 'parked' AND parked_by = 'destroy')
		GROUP BY provider, rtrim(provider_name, '` + usageKeyChars + `');
	CREATE TRIGGER sandbox_usage_insert AFTER INSERT ON sandboxes
		WHEN rtrim(NEW.provider_name, '` + usageKeyChars + `') <> '' AND NOT (NEW.state = 'parked' AND NEW.parked_by = 'destroy')
	BEGIN
		INSERT OR IGNORE INTO sandbox_usage (provider, prefix) VALUES (NEW.provider, rtrim(NEW.provider_name, '` + usageKeyChars + `'));
		UPDATE sandbox_usage SET sandboxes = sandboxes + 1, mem_bytes = mem_bytes + NEW.mem_bytes, cpu_millis = cpu_millis + NEW.cpu_millis,
			disk_bytes = disk_bytes + NEW.disk_bytes WHERE provider = NEW.provider AND prefix = rtrim(NEW.provider_name, '` + usageKeyChars + `');
	END;
	CREATE TRIGGER sandbox_usage_delete AFTER DELETE ON sandboxes
		WHEN rtrim(OLD.provider_name, '` + usageKeyChars + `') <> '' AND NOT (OLD.state = 'parked' AND OLD.parked_by = 'destroy')
	BEGIN
		UPDATE sandbox_usage SET sandboxes = sandboxes - 1, mem_bytes = mem_bytes - OLD.mem_bytes, cpu_millis = cpu_millis - OLD.cpu_millis,
			disk_bytes = disk_bytes - OLD.disk_bytes WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `');
		DELETE FROM sandbox_usage WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `') AND sandboxes <= 0;
	END;
	CREATE TRIGGER sandbox_usage_update_old AFTER UPDATE OF provider, provider_name, state, parked_by, mem_bytes, cpu_millis, disk_bytes ON sandboxes
		WHEN rtrim(OLD.provider_name, '` + usageKeyChars + `') <> '' AND NOT (OLD.state = 'parked' AND OLD.parked_by = 'destroy')
	BEGIN
		UPDATE sandbox_usage SET sandboxes = sandboxes - 1, mem_bytes = mem_bytes - OLD.mem_bytes, cpu_millis = cpu_millis - OLD.cpu_millis,
			disk_bytes = disk_bytes - OLD.disk_bytes WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `');
		DELETE FROM sandbox_usage WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `') AND sandboxes <= 0;
	END;
	CREATE TRIGGER sandbox_usage_update_new AFTER UPDATE OF provider, provider_name, state, parked_by, mem_bytes, cpu_millis, disk_bytes ON sandboxes
		WHEN rtrim(NEW.provider_name, '` + usageKeyChars + `') <> '' AND NOT (NEW.state = 'parked' AND NEW.parked_by = 'destroy')
	BEGIN
		INSERT OR IGNORE INTO sandbox_usage (provider, prefix) VALUES (NEW.provider, rtrim(NEW.provider_name, '` + usageKeyChars + `'));
		UPDATE sandbox_usage SET sandboxes = sandboxes + 1, mem_bytes = mem_bytes + NEW.mem_bytes, cpu_millis = cpu_millis + NEW.cpu_millis,
			disk_bytes = disk_bytes + NEW.disk_bytes WHERE provider = NEW.provider AND prefix = rtrim(NEW.provider_name, '` + usageKeyChars + `');
	END;`,
	// 7: the image a sandbox was created from and its labels (a JSON
	// object, "" for none), and the preview links handed out for its
	// ports (platform/api/preview.go), each revocable by its id.
	`ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN labels TEXT NOT NULL DEFAULT '';
	CREATE TABLE preview_links (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id),
		sandbox TEXT NOT NULL,
		provider_name TEXT NOT NULL DEFAULT '',
		port INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		revoked_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX preview_links_sandbox ON preview_links(account_id, sandbox);`,
}

// usageKeyChars is store.UsageKeyChars as migration 6 wrote it into its
// triggers (a shipped migration never changes).
const usageKeyChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._"

// Store is a store.Store on one SQLite file.
type Store struct {
	db   *sql.DB
	path string

	unlock func() // the lock file's, when this process owns the sandbox records
	wmu    sync.Mutex
	mu     sync.RWMutex
	cache  map[string]map[string]store.Sandbox // account → name → record; nil unless owner
	names  map[string][]string                 // account → its names, sorted
}

// ErrNotOwner is a write of a sandbox record by a process that does not
// hold the database's lock file.
var ErrNotOwner = errors.New("sqlite store: another process (managoat serve) holds this database's sandbox records")

// Owner reports whether this process holds the lock file, so serves and
// writes the sandbox records.
func (s *Store) Owner() bool { return s.cache != nil }

var _ store.Store = (*Store)(nil)

// Open opens (creating it 0600 if missing) the database at path and
// applies the migrations it lacks.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600); err != nil {
		return nil, err
	} else {
		f.Close()
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "busy_timeout(10000)", "foreign_keys(1)", "synchronous(NORMAL)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(4)
	s := &Store{db: db, path: path}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	lock := path + ".lock"
	if f, err := os.OpenFile(lock, os.O_RDWR|os.O_CREATE, 0o600); err == nil {
		f.Close()
	}
	if unlock, ok := flock.TryLock(lock); ok {
		s.unlock = unlock
		if err := s.load(ctx); err != nil {
			unlock()
			db.Close()
			return nil, fmt.Errorf("store %s: %w", path, err)
		}
	}
	return s, nil
}

// load fills the mirror from the table.
func (s *Store) load(ctx context.Context) error {
	all, err := s.listSQL(ctx, "")
	if err != nil {
		return err
	}
	c := map[string]map[string]store.Sandbox{}
	for _, b := range all {
		if c[b.AccountID] == nil {
			c[b.AccountID] = map[string]store.Sandbox{}
		}
		c[b.AccountID][b.Name] = b
	}
	s.cache = c
	s.names = map[string][]string{}
	for acct, m := range c {
		ns := make([]string, 0, len(m))
		for n := range m {
			ns = append(ns, n)
		}
		slices.Sort(ns)
		s.names[acct] = ns
	}
	return nil
}

// addName and dropName keep an account's sorted names; s.mu is held.
func (s *Store) addName(acct, name string) {
	ns := s.names[acct]
	if i, found := slices.BinarySearch(ns, name); !found {
		s.names[acct] = slices.Insert(ns, i, name)
	}
}

func (s *Store) dropName(acct, name string) {
	ns := s.names[acct]
	if i, found := slices.BinarySearch(ns, name); found {
		s.names[acct] = slices.Delete(ns, i, i+1)
	}
}

func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)`); err != nil {
		return err
	}
	for i, m := range migrations {
		v := i + 1
		err := s.tx(ctx, func(tx *sql.Tx) error {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations WHERE version = ?`, v).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, m); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, v, time.Now().UnixNano())
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) tx(ctx context.Context, f func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// Close closes the database and releases the lock file.
func (s *Store) Close() error {
	err := s.db.Close()
	if s.unlock != nil {
		s.unlock()
		s.unlock = nil
	}
	return err
}

func ns(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func tm(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func isUnique(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		c := se.Code()
		return c == sqlite3.SQLITE_CONSTRAINT_UNIQUE || c == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}

func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// CreateAccount implements store.Store.
func (s *Store) CreateAccount(ctx context.Context, name string) (store.Account, error) {
	a := store.Account{ID: newID("acct"), Name: name, CreatedAt: time.Now().UTC()}
	_, err := s.db.ExecContext(ctx, `INSERT INTO accounts (id, name, created_at) VALUES (?, ?, ?)`, a.ID, a.Name, ns(a.CreatedAt))
	if isUnique(err) {
		return store.Account{}, fmt.Errorf("account %q: %w", name, store.ErrAlreadyExists)
	}
	return a, err
}

func (s *Store) account(ctx context.Context, where string, arg string) (store.Account, error) {
	var a store.Account
	var c int64
	err := s.db.QueryRowContext(ctx, `SELECT id, name, created_at FROM accounts WHERE `+where+` = ?`, arg).Scan(&a.ID, &a.Name, &c)
	a.CreatedAt = tm(c)
	return a, notFound(err)
}

// AccountByName implements store.Store.
func (s *Store) AccountByName(ctx context.Context, name string) (store.Account, error) {
	return s.account(ctx, "name", name)
}

// AccountByID implements store.Store.
func (s *Store) AccountByID(ctx context.Context, id string) (store.Account, error) {
	return s.account(ctx, "id", id)
}

// ListAccounts implements store.Store.
func (s *Store) ListAccounts(ctx context.Context) ([]store.Account, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, created_at FROM accounts ORDER BY name`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Account
	for rows.Next() {
		var a store.Account
		var c int64
		if err := rows.Scan(&a.ID, &a.Name, &c); err != nil {
			return nil, err
		}
		a.CreatedAt = tm(c)
		out = append(out, a)
	}
	return out, rows.Err()
}

// AddKey implements store.Store.
func (s *Store) AddKey(ctx context.Context, k store.Key) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO api_keys (id, account_id, hash, label, created_at) VALUES (?, ?, ?, ?, ?)`,
		k.ID, k.AccountID, k.Hash, k.Label, ns(k.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("key %q: %w", k.ID, store.ErrAlreadyExists)
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY {
		return fmt.Errorf("account %q: %w", k.AccountID, store.ErrNotFound)
	}
	return err
}

const keyCols = `id, account_id, hash, label, created_at, revoked_at`

func scanKey(sc interface{ Scan(...any) error }) (store.Key, error) {
	var k store.Key
	var c, r int64
	err := sc.Scan(&k.ID, &k.AccountID, &k.Hash, &k.Label, &c, &r)
	k.CreatedAt, k.RevokedAt = tm(c), tm(r)
	return k, err
}

// KeyByID implements store.Store.
func (s *Store) KeyByID(ctx context.Context, id string) (store.Key, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = ?`, id))
	return k, notFound(err)
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, accountID string) ([]store.Key, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE account_id = ? ORDER BY created_at, id`, accountID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Key
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeKey implements store.Store.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	r, err := s.db.ExecContext(ctx, `UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at = 0`, ns(at), id)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		if _, err := s.KeyByID(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

const sbCols = `account_id, name, provider, provider_name, instance_id, state, url, mem_bytes, pids, cpu_millis, wall_clock_ns,
	created_at, last_activity, parked_at, parked_by, version, disk_bytes, image, labels`

func scanSandbox(sc interface{ Scan(...any) error }) (store.Sandbox, error) {
	var b store.Sandbox
	var c, la, pa, wc int64
	var labels string
	err := sc.Scan(&b.AccountID, &b.Name, &b.Provider, &b.ProviderName, &b.InstanceID, &b.State, &b.URL,
		&b.Limits.MemoryBytes, &b.Limits.Pids, &b.Limits.CPUMillis, &wc, &c, &la, &pa, &b.ParkedBy, &b.Version, &b.Limits.DiskBytes,
		&b.Image, &labels)
	b.Limits.WallClock = time.Duration(wc)
	b.CreatedAt, b.LastActivity, b.ParkedAt = tm(c), tm(la), tm(pa)
	if err == nil {
		b.Labels, err = store.ParseLabels(labels)
	}
	return b, err
}

// InsertSandbox implements store.Store.
func (s *Store) InsertSandbox(ctx context.Context, b store.Sandbox) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	err := s.insertSQL(ctx, b)
	if err == nil {
		b.Version = 1
		s.mu.Lock()
		if s.cache[b.AccountID] == nil {
			s.cache[b.AccountID] = map[string]store.Sandbox{}
		}
		s.cache[b.AccountID][b.Name] = b
		s.addName(b.AccountID, b.Name)
		s.mu.Unlock()
	}
	return err
}

func (s *Store) insertSQL(ctx context.Context, b store.Sandbox) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO sandboxes (`+sbCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?, ?, ?)`,
		b.AccountID, b.Name, b.Provider, b.ProviderName, b.InstanceID, b.State, b.URL,
		b.Limits.MemoryBytes, b.Limits.Pids, b.Limits.CPUMillis, int64(b.Limits.WallClock),
		ns(b.CreatedAt), ns(b.LastActivity), ns(b.ParkedAt), b.ParkedBy, b.Limits.DiskBytes, b.Image, store.LabelsJSON(b.Labels))
	if isUnique(err) {
		return fmt.Errorf("sandbox %q: %w", b.Name, store.ErrAlreadyExists)
	}
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY {
		return fmt.Errorf("account %q: %w", b.AccountID, store.ErrNotFound)
	}
	return err
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, accountID, name string) (store.Sandbox, error) {
	if s.Owner() {
		s.mu.RLock()
		b, ok := s.cache[accountID][name]
		s.mu.RUnlock()
		if !ok {
			return b, store.ErrNotFound
		}
		return b, nil
	}
	b, err := scanSandbox(s.db.QueryRowContext(ctx, `SELECT `+sbCols+` FROM sandboxes WHERE account_id = ? AND name = ?`, accountID, name))
	return b, notFound(err)
}

// ListSandboxes implements store.Store.
func (s *Store) ListSandboxes(ctx context.Context, accountID string) ([]store.Sandbox, error) {
	if !s.Owner() {
		return s.listSQL(ctx, accountID)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	accts := []string{accountID}
	if accountID == "" {
		accts = make([]string, 0, len(s.names))
		for a := range s.names {
			accts = append(accts, a)
		}
		slices.Sort(accts)
	}
	n := 0
	for _, a := range accts {
		n += len(s.names[a])
	}
	out := make([]store.Sandbox, 0, n)
	for _, a := range accts {
		m := s.cache[a]
		for _, name := range s.names[a] {
			out = append(out, m[name])
		}
	}
	return out, nil
}

func (s *Store) listSQL(ctx context.Context, accountID string) ([]store.Sandbox, error) {
	q, args := `SELECT `+sbCols+` FROM sandboxes ORDER BY account_id, name`, []any(nil)
	if accountID != "" {
		q, args = `SELECT `+sbCols+` FROM sandboxes WHERE account_id = ? ORDER BY name`, []any{accountID}
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Sandbox{}
	for rows.Next() {
		b, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, b store.Sandbox) (store.Sandbox, error) {
	if !s.Owner() {
		return b, ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	old, ok := s.cache[b.AccountID][b.Name]
	s.mu.RUnlock()
	if !ok {
		return b, store.ErrNotFound
	}
	if old.Version != b.Version || old.ProviderName != b.ProviderName {
		return b, store.ErrConflict
	}
	if _, err := s.updateSQL(ctx, b); err != nil {
		return b, err
	}
	nb := old
	nb.ProviderName, nb.InstanceID, nb.State, nb.URL, nb.Limits = b.ProviderName, b.InstanceID, b.State, b.URL, b.Limits
	if b.LastActivity.After(nb.LastActivity) {
		nb.LastActivity = b.LastActivity
	}
	nb.ParkedAt, nb.ParkedBy, nb.Version = b.ParkedAt, b.ParkedBy, old.Version+1
	s.mu.Lock()
	s.cache[b.AccountID][b.Name] = nb
	s.mu.Unlock()
	return nb, nil
}

func (s *Store) updateSQL(ctx context.Context, b store.Sandbox) (store.Sandbox, error) {
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET provider_name = ?, instance_id = ?, state = ?, url = ?,
		mem_bytes = ?, pids = ?, cpu_millis = ?, wall_clock_ns = ?, last_activity = max(last_activity, ?), parked_at = ?, parked_by = ?,
		disk_bytes = ?, version = version + 1 WHERE account_id = ? AND name = ? AND version = ? AND provider_name = ?`,
		b.ProviderName, b.InstanceID, b.State, b.URL, b.Limits.MemoryBytes, b.Limits.Pids, b.Limits.CPUMillis, int64(b.Limits.WallClock),
		ns(b.LastActivity), ns(b.ParkedAt), b.ParkedBy, b.Limits.DiskBytes, b.AccountID, b.Name, b.Version, b.ProviderName)
	if isUnique(err) {
		return b, fmt.Errorf("sandbox %q: %w", b.Name, store.ErrAlreadyExists)
	}
	if err != nil {
		return b, err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		if _, err := s.GetSandbox(ctx, b.AccountID, b.Name); err != nil {
			return b, err
		}
		return b, store.ErrConflict
	}
	return b, nil
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, accountID, name string, at time.Time) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	b, ok := s.cache[accountID][name]
	s.mu.RUnlock()
	if !ok {
		return store.ErrNotFound
	}
	if !at.After(b.LastActivity) {
		return nil
	}
	if err := s.touchSQL(ctx, accountID, name, at); err != nil {
		return err
	}
	b.LastActivity = at
	s.mu.Lock()
	s.cache[accountID][name] = b
	s.mu.Unlock()
	return nil
}

func (s *Store) touchSQL(ctx context.Context, accountID, name string, at time.Time) error {
	r, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET last_activity = max(last_activity, ?) WHERE account_id = ? AND name = ?`, ns(at), accountID, name)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteSandbox implements store.Store.
func (s *Store) DeleteSandbox(ctx context.Context, accountID, name string) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE account_id = ? AND name = ?`, accountID, name)
	if err == nil {
		s.mu.Lock()
		delete(s.cache[accountID], name)
		s.dropName(accountID, name)
		s.mu.Unlock()
	}
	return err
}

// DeleteSandboxIf implements store.Store.
func (s *Store) DeleteSandboxIf(ctx context.Context, b store.Sandbox) error {
	if !s.Owner() {
		return ErrNotOwner
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	r, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE account_id = ? AND name = ? AND provider_name = ? AND (? = 0 OR version = ?)`,
		b.AccountID, b.Name, b.ProviderName, b.Version, b.Version)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		if _, err := s.GetSandbox(ctx, b.AccountID, b.Name); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		}
		return store.ErrConflict
	}
	s.mu.Lock()
	delete(s.cache[b.AccountID], b.Name)
	s.dropName(b.AccountID, b.Name)
	s.mu.Unlock()
	return nil
}

// AddIntent implements store.Store.
func (s *Store) AddIntent(ctx context.Context, in store.Intent) (int64, error) {
	now := time.Now().UnixNano()
	if in.State == "" {
		in.State = store.IntentPending
	}
	r, err := s.db.ExecContext(ctx, `INSERT INTO intents (account_id, name, op, provider, provider_name, instance_id, arg, state, detail, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, in.AccountID, in.Name, in.Op, in.Provider, in.ProviderName, in.InstanceID, in.Arg, in.State, in.Detail, now, now)
	if isUnique(err) {
		return 0, fmt.Errorf("operation %q of sandbox %q: %w", in.Arg, in.Name, store.ErrAlreadyExists)
	}
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

const intentCols = `id, account_id, name, op, provider, provider_name, instance_id, arg, state, detail, created_at, updated_at`

func (s *Store) intents(ctx context.Context, where string, args ...any) ([]store.Intent, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+intentCols+` FROM intents WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Intent
	for rows.Next() {
		var in store.Intent
		var c, u int64
		if err := rows.Scan(&in.ID, &in.AccountID, &in.Name, &in.Op, &in.Provider, &in.ProviderName, &in.InstanceID, &in.Arg, &in.State, &in.Detail, &c, &u); err != nil {
			return nil, err
		}
		in.CreatedAt, in.UpdatedAt = tm(c), tm(u)
		out = append(out, in)
	}
	return out, rows.Err()
}

// IntentsOf implements store.Store.
func (s *Store) IntentsOf(ctx context.Context, accountID, name string) ([]store.Intent, error) {
	return s.intents(ctx, `account_id = ? AND name = ?`, accountID, name)
}

// SetIntent implements store.Store.
func (s *Store) SetIntent(ctx context.Context, id int64, state, detail string) error {
	r, err := s.db.ExecContext(ctx, `UPDATE intents SET state = ?, detail = ?, updated_at = ? WHERE id = ?`, state, detail, time.Now().UnixNano(), id)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// OpenIntents implements store.Store.
func (s *Store) OpenIntents(ctx context.Context) ([]store.Intent, error) {
	return s.intents(ctx, `state IN ('pending', 'uncertain')`)
}

// pruneBatch is how many intents one statement of PruneIntents removes
// (a long delete would hold the database's write lock).
const pruneBatch = 10000

// PruneIntents implements store.Store.
func (s *Store) PruneIntents(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	for {
		r, err := s.db.ExecContext(ctx, `DELETE FROM intents WHERE id IN (SELECT id FROM intents
			WHERE state NOT IN ('pending', 'uncertain') AND updated_at < ?
			AND NOT (op = 'create_checkpoint_once' AND EXISTS (SELECT 1 FROM sandboxes b
				WHERE b.provider = intents.provider AND b.provider_name = intents.provider_name)) LIMIT ?)`, ns(before), pruneBatch)
		if err != nil {
			return n, err
		}
		k, _ := r.RowsAffected()
		if n += k; k < pruneBatch {
			return n, nil
		}
	}
}

const runnerCols = `account_id, name, id, enrolled, key_id, created_at`

func scanRunner(sc interface{ Scan(...any) error }) (store.Runner, error) {
	var r store.Runner
	var c int64
	err := sc.Scan(&r.AccountID, &r.Name, &r.ID, &r.Enrolled, &r.KeyID, &c)
	r.CreatedAt = tm(c)
	return r, err
}

// AddRunner implements store.Store.
func (s *Store) AddRunner(ctx context.Context, r store.Runner) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO runners (`+runnerCols+`) VALUES (?, ?, ?, ?, ?, ?)`,
		r.AccountID, r.Name, r.ID, r.Enrolled, r.KeyID, ns(r.CreatedAt))
	if isUnique(err) {
		return fmt.Errorf("runner %q: %w", r.Name, store.ErrAlreadyExists)
	}
	return err
}

// RunnerByName implements store.Store.
func (s *Store) RunnerByName(ctx context.Context, accountID, name string) (store.Runner, error) {
	r, err := scanRunner(s.db.QueryRowContext(ctx, `SELECT `+runnerCols+` FROM runners WHERE account_id = ? AND name = ?`, accountID, name))
	return r, notFound(err)
}

// ListRunners implements store.Store.
func (s *Store) ListRunners(ctx context.Context, accountID string) ([]store.Runner, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+runnerCols+` FROM runners WHERE account_id = ? ORDER BY name`, accountID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Runner
	for rows.Next() {
		r, err := scanRunner(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// UpdateRunner implements store.Store.
func (s *Store) UpdateRunner(ctx context.Context, prev, next store.Runner) error {
	r, err := s.db.ExecContext(ctx, `UPDATE runners SET enrolled = ?, key_id = ? WHERE account_id = ? AND name = ? AND id = ? AND enrolled = ? AND key_id = ?`,
		next.Enrolled, next.KeyID, prev.AccountID, prev.Name, prev.ID, prev.Enrolled, prev.KeyID)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		if _, err := s.RunnerByName(ctx, prev.AccountID, prev.Name); err != nil {
			return err
		}
		return store.ErrConflict
	}
	return nil
}

// DeleteRunner implements store.Store.
func (s *Store) DeleteRunner(ctx context.Context, accountID, name string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM runners WHERE account_id = ? AND name = ?`, accountID, name)
	return err
}

func newID(prefix string) string { return prefix + "_" + strings.ToLower(sandbox.NewRef()) }

const plCols = `id, account_id, sandbox, provider_name, port, created_at, expires_at, revoked_at`

func scanPreviewLink(sc interface{ Scan(...any) error }) (store.PreviewLink, error) {
	var l store.PreviewLink
	var c, e, r, port int64
	err := sc.Scan(&l.ID, &l.AccountID, &l.Sandbox, &l.ProviderName, &port, &c, &e, &r)
	l.Port, l.CreatedAt, l.ExpiresAt, l.RevokedAt = int(port), tm(c), tm(e), tm(r)
	return l, err
}

// AddPreviewLink implements store.Store.
func (s *Store) AddPreviewLink(ctx context.Context, l store.PreviewLink) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO preview_links (`+plCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		l.ID, l.AccountID, l.Sandbox, l.ProviderName, int64(l.Port), ns(l.CreatedAt), ns(l.ExpiresAt), ns(l.RevokedAt))
	if isUnique(err) {
		return fmt.Errorf("preview link %q: %w", l.ID, store.ErrAlreadyExists)
	}
	return err
}

// PreviewLinkByID implements store.Store.
func (s *Store) PreviewLinkByID(ctx context.Context, id string) (store.PreviewLink, error) {
	l, err := scanPreviewLink(s.db.QueryRowContext(ctx, `SELECT `+plCols+` FROM preview_links WHERE id = ?`, id))
	return l, notFound(err)
}

// ListPreviewLinks implements store.Store.
func (s *Store) ListPreviewLinks(ctx context.Context, accountID, sandbox, providerName string) ([]store.PreviewLink, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+plCols+` FROM preview_links WHERE account_id = ? AND sandbox = ? AND provider_name = ? ORDER BY created_at, id`,
		accountID, sandbox, providerName)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.PreviewLink{}
	for rows.Next() {
		l, err := scanPreviewLink(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// RevokePreviewLink implements store.Store.
func (s *Store) RevokePreviewLink(ctx context.Context, accountID, sandbox, id string, at time.Time) error {
	r, err := s.db.ExecContext(ctx, `UPDATE preview_links SET revoked_at = CASE WHEN revoked_at = 0 THEN ? ELSE revoked_at END
		WHERE id = ? AND account_id = ? AND sandbox = ?`, ns(at), id, accountID, sandbox)
	if err != nil {
		return err
	}
	if n, _ := r.RowsAffected(); n == 0 {
		return fmt.Errorf("preview link %q: %w", id, store.ErrNotFound)
	}
	return nil
}
