// Package postgres is the platform's store on PostgreSQL, for a platform
// of several `managoat serve` replicas on one database (the embedded
// default is store/sqlite). It meets store.Store and passes the same kit,
// store/storetest, through github.com/jackc/pgx/v5.
//
//	st, err := postgres.Open(ctx, "postgres://managoat@db/managoat")
//
// Concurrency is the database's: InsertSandbox's primary key on (account,
// name) is the one arbiter when two replicas create the same name (one
// insert wins, the other gets store.ErrAlreadyExists), and UpdateSandbox
// is a compare-and-set on version in one statement. Migrations are the
// numbered statements of this file, each applied once in its own
// transaction under an advisory lock, so replicas that start together
// migrate once. Times are Unix nanoseconds, as in store/sqlite.
//
// Lease gives work that must run once across replicas (the idle parker,
// the reaper) to one replica at a time: a session-level advisory lock held
// on a connection of its own, released when the holder lets go or its
// connection dies, so another replica takes over at its next try. A holder
// killed closes its connection with it; a holder whose machine died or was
// cut off is noticed by the server's TCP keepalives, which TryLease sets to
// about 25 s on the lease's connection; a holder cut off from the database
// knows within 5 s (Held pings with that bound) and stops. (A session
// advisory lock needs a session of its own: the DSN must reach PostgreSQL
// itself or a pooler in session mode, never one in transaction mode.)
package postgres

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/managoat/managoat/platform/store"
	"github.com/managoat/managoat/sandbox"
)

// migrations are applied in order; never edit one that shipped, add one.
var migrations = []string{
	`CREATE TABLE accounts (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		created_at BIGINT NOT NULL
	);
	CREATE TABLE api_keys (
		id TEXT PRIMARY KEY,
		account_id TEXT NOT NULL REFERENCES accounts(id) ON DELETE CASCADE,
		hash BYTEA NOT NULL,
		label TEXT NOT NULL DEFAULT '',
		created_at BIGINT NOT NULL,
		revoked_at BIGINT NOT NULL DEFAULT 0
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
		mem_bytes BIGINT NOT NULL DEFAULT 0,
		pids BIGINT NOT NULL DEFAULT 0,
		cpu_millis BIGINT NOT NULL DEFAULT 0,
		wall_clock_ns BIGINT NOT NULL DEFAULT 0,
		created_at BIGINT NOT NULL,
		last_activity BIGINT NOT NULL,
		parked_at BIGINT NOT NULL DEFAULT 0,
		parked_by TEXT NOT NULL DEFAULT '',
		version BIGINT NOT NULL,
		PRIMARY KEY (account_id, name),
		UNIQUE (provider, provider_name)
	);
	CREATE TABLE intents (
		id BIGSERIAL PRIMARY KEY,
		account_id TEXT NOT NULL,
		name TEXT NOT NULL,
		op TEXT NOT NULL,
		provider TEXT NOT NULL,
		provider_name TEXT NOT NULL,
		instance_id TEXT NOT NULL DEFAULT '',
		arg TEXT NOT NULL DEFAULT '',
		state TEXT NOT NULL,
		detail TEXT NOT NULL DEFAULT '',
		created_at BIGINT NOT NULL,
		updated_at BIGINT NOT NULL
	);
	CREATE INDEX intents_open ON intents(state) WHERE state IN ('pending', 'uncertain');`,
	// 2: a sandbox's disk limit (sandbox.Limits.DiskBytes), which a wake
	// from a park by destroy creates the sandbox with again.
	`ALTER TABLE sandboxes ADD COLUMN disk_bytes BIGINT NOT NULL DEFAULT 0;`,
	// 3: the runner names accounts hold (their random ids, and what may
	// connect as each); an operation id used once per sandbox (earlier
	// duplicates, which the API let through, are kept as the first).
	`CREATE TABLE runners (
		account_id TEXT NOT NULL,
		name TEXT NOT NULL,
		id TEXT NOT NULL UNIQUE,
		enrolled BOOLEAN NOT NULL DEFAULT false,
		key_id TEXT NOT NULL DEFAULT '',
		created_at BIGINT NOT NULL,
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
		updated_at BIGINT NOT NULL,
		PRIMARY KEY (account_id, runner_id)
	);`,
	// 5: the count of a runner's records (store.Placer's UsageOf, under
	// InsertSandboxWithin's lock) read from the index alone.
	`CREATE INDEX sandboxes_usage ON sandboxes(provider, provider_name, state, parked_by, mem_bytes, cpu_millis, disk_bytes);`,
	// 6: what the records of each runner ask (store.Placer's UsageOf and
	// InsertSandboxWithin), a counter row per provider and name prefix
	// (store.UsageKey: the provider name up to its last '-') kept by a
	// trigger on every write of a record, in the write's transaction, so a
	// placement reads (and locks) one row instead of summing the runner's
	// records.
	`CREATE TABLE sandbox_usage (
		provider TEXT NOT NULL,
		prefix TEXT NOT NULL,
		sandboxes BIGINT NOT NULL DEFAULT 0,
		mem_bytes BIGINT NOT NULL DEFAULT 0,
		cpu_millis BIGINT NOT NULL DEFAULT 0,
		disk_bytes BIGINT NOT NULL DEFAULT 0,
		PRIMARY KEY (provider, prefix)
	);
	INSERT INTO sandbox_usage (provider, prefix, sandboxes, mem_bytes, cpu_millis, disk_bytes)
		SELECT provider, rtrim(provider_name, '` + usageKeyChars + `'), count(*), sum(mem_bytes), sum(cpu_millis), sum(disk_bytes) FROM sandboxes
		WHERE rtrim(provider_name, '` + usageKeyChars + `') <> '' AND NOT (state = 'parked' AND parked_by = 'destroy')
		GROUP BY provider, rtrim(provider_name, '` + usageKeyChars + `');
	CREATE FUNCTION sandbox_usage_count() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		IF TG_OP IN ('UPDATE', 'DELETE') AND rtrim(OLD.provider_name, '` + usageKeyChars + `') <> '' AND NOT (OLD.state = 'parked' AND OLD.parked_by = 'destroy') THEN
			UPDATE sandbox_usage SET sandboxes = sandboxes - 1, mem_bytes = mem_bytes - OLD.mem_bytes, cpu_millis = cpu_millis - OLD.cpu_millis,
				disk_bytes = disk_bytes - OLD.disk_bytes WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `');
			DELETE FROM sandbox_usage WHERE provider = OLD.provider AND prefix = rtrim(OLD.provider_name, '` + usageKeyChars + `') AND sandboxes <= 0;
		END IF;
		IF TG_OP IN ('UPDATE', 'INSERT') AND rtrim(NEW.provider_name, '` + usageKeyChars + `') <> '' AND NOT (NEW.state = 'parked' AND NEW.parked_by = 'destroy') THEN
			INSERT INTO sandbox_usage (provider, prefix, sandboxes, mem_bytes, cpu_millis, disk_bytes)
				VALUES (NEW.provider, rtrim(NEW.provider_name, '` + usageKeyChars + `'), 1, NEW.mem_bytes, NEW.cpu_millis, NEW.disk_bytes)
				ON CONFLICT (provider, prefix) DO UPDATE SET sandboxes = sandbox_usage.sandboxes + 1, mem_bytes = sandbox_usage.mem_bytes + excluded.mem_bytes,
					cpu_millis = sandbox_usage.cpu_millis + excluded.cpu_millis, disk_bytes = sandbox_usage.disk_bytes + excluded.disk_bytes;
		END IF;
		RETURN NULL;
	END $$;
	CREATE TRIGGER sandbox_usage_count AFTER INSERT OR DELETE OR UPDATE OF provider, provider_name, state, parked_by, mem_bytes, cpu_millis, disk_bytes
		ON sandboxes FOR EACH ROW EXECUTE FUNCTION sandbox_usage_count();`,
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
		created_at BIGINT NOT NULL,
		expires_at BIGINT NOT NULL,
		revoked_at BIGINT NOT NULL DEFAULT 0
	);
	CREATE INDEX preview_links_sandbox ON preview_links(account_id, sandbox);`,
}

// usageKeyChars is store.UsageKeyChars as migration 6 wrote it into its
// trigger (a shipped migration never changes).
const usageKeyChars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._"

// migrationLock is the advisory lock key replicas take to migrate.
const migrationLock = 0x6d616e61676f6174 // "managoat"

// Store is a store.Store on a PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	db   db // pool, with the database's absence as sandbox.Unavailable

	mu     sync.Mutex
	leases map[*Lease]struct{} // held, released by Close

	keepalive string // the SET statements of keepalives the DSN leaves unset
}

var _ store.Store = (*Store)(nil)

// keepalives are the server's TCP keepalive settings for a lease's
// connection (unless the DSN sets them): a replica whose machine died or
// was cut off without closing its connection is noticed by the server in
// about 25 s (10 s idle, then 3 probes 5 s apart), and its backend ends,
// freeing the lease; with the kernel's defaults that is two hours and more.
// (The server ignores them on a Unix socket, where a dead peer's
// connection is closed by the kernel at once.) They are SET on the
// connection rather than sent at startup, which a pooler in front of the
// database may refuse.
var keepalives = []struct{ name, value string }{{"tcp_keepalives_idle", "10"}, {"tcp_keepalives_interval", "5"}, {"tcp_keepalives_count", "3"}}

// Open connects to the database at dsn (a URL or libpq keyword string)
// and applies the migrations it lacks.
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password: never echo it.
		return nil, errors.New("postgres: the connection string does not parse")
	}
	var keep []string
	for _, k := range keepalives {
		if _, set := cfg.ConnConfig.RuntimeParams[k.name]; !set {
			keep = append(keep, "SET "+k.name+" = "+k.value)
		}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	s := &Store{pool: pool, db: db{pool}, leases: map[*Lease]struct{}{}, keepalive: strings.Join(keep, "; ")}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return s, nil
}

func (s *Store) migrate(ctx context.Context) error {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrationLock)); err != nil {
		return err
	}
	defer func() { _, _ = conn.Exec(context.Background(), `SELECT pg_advisory_unlock($1)`, int64(migrationLock)) }()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return err
	}
	for i, m := range migrations {
		v := i + 1
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			var n int
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM schema_migrations WHERE version = $1`, v).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if _, err := tx.Exec(ctx, m); err != nil {
				return fmt.Errorf("migration %d: %w", v, err)
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, v, time.Now().UnixNano())
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Close releases the leases still held and closes the pool.
func (s *Store) Close() error {
	s.mu.Lock()
	held := make([]*Lease, 0, len(s.leases))
	for l := range s.leases {
		held = append(held, l)
	}
	s.mu.Unlock()
	for _, l := range held {
		l.Release()
	}
	s.pool.Close()
	return nil
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

// pgCode is the SQLSTATE of err, "" for another error.
func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

const (
	uniqueViolation     = "23505"
	foreignKeyViolation = "23503"
)

// db is the pool seen by the store's methods: an error that says the
// database is out of reach (it refused or dropped the connection, or is
// shutting down or starting) is sandbox.Unavailable{database_unavailable},
// so the API answers 503 and the caller retries; the pool connects again
// by itself when the database is back.
type db struct{ p *pgxpool.Pool }

func (d db) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t, err := d.p.Exec(ctx, sql, args...)
	return t, dbErr(err)
}

func (d db) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r, err := d.p.Query(ctx, sql, args...)
	return r, dbErr(err)
}

func (d db) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return row{d.p.QueryRow(ctx, sql, args...)}
}

type row struct{ r pgx.Row }

func (r row) Scan(dest ...any) error { return dbErr(r.r.Scan(dest...)) }

// ReasonDatabaseUnavailable is the Unavailable reason of a store call the
// database could not answer.
const ReasonDatabaseUnavailable = "database_unavailable"

func dbErr(err error) error {
	if err == nil || errors.Is(err, pgx.ErrNoRows) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57: operator intervention
		// (shutdown, cannot connect now). Other classes are the SQL's.
		if !strings.HasPrefix(pe.Code, "08") && !strings.HasPrefix(pe.Code, "57") {
			return err
		}
	}
	var u *sandbox.UnavailableError
	if errors.As(err, &u) {
		return err
	}
	return sandbox.Unavailable(ReasonDatabaseUnavailable, err)
}

func notFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

func newID(prefix string) string {
	var b [10]byte
	_, _ = rand.Read(b[:])
	return prefix + "_" + hex.EncodeToString(b[:])
}

// CreateAccount implements store.Store.
func (s *Store) CreateAccount(ctx context.Context, name string) (store.Account, error) {
	a := store.Account{ID: newID("acct"), Name: name, CreatedAt: time.Now().UTC()}
	_, err := s.db.Exec(ctx, `INSERT INTO accounts (id, name, created_at) VALUES ($1, $2, $3)`, a.ID, a.Name, ns(a.CreatedAt))
	if pgCode(err) == uniqueViolation {
		return store.Account{}, fmt.Errorf("account %q: %w", name, store.ErrAlreadyExists)
	}
	if err != nil {
		return store.Account{}, err
	}
	return a, nil
}

func (s *Store) account(ctx context.Context, col, arg string) (store.Account, error) {
	var a store.Account
	var c int64
	err := s.db.QueryRow(ctx, `SELECT id, name, created_at FROM accounts WHERE `+col+` = $1`, arg).Scan(&a.ID, &a.Name, &c)
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
	rows, err := s.db.Query(ctx, `SELECT id, name, created_at FROM accounts ORDER BY name`)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Account, error) {
		var a store.Account
		var c int64
		err := r.Scan(&a.ID, &a.Name, &c)
		a.CreatedAt = tm(c)
		return a, err
	})
	return out, dbErr(err)
}

// AddKey implements store.Store.
func (s *Store) AddKey(ctx context.Context, k store.Key) error {
	_, err := s.db.Exec(ctx, `INSERT INTO api_keys (id, account_id, hash, label, created_at) VALUES ($1, $2, $3, $4, $5)`,
		k.ID, k.AccountID, k.Hash, k.Label, ns(k.CreatedAt))
	switch pgCode(err) {
	case uniqueViolation:
		return fmt.Errorf("key %q: %w", k.ID, store.ErrAlreadyExists)
	case foreignKeyViolation:
		return fmt.Errorf("account %q: %w", k.AccountID, store.ErrNotFound)
	}
	return err
}

const keyCols = `id, account_id, hash, label, created_at, revoked_at`

func scanKey(sc pgx.Row) (store.Key, error) {
	var k store.Key
	var c, r int64
	err := sc.Scan(&k.ID, &k.AccountID, &k.Hash, &k.Label, &c, &r)
	k.CreatedAt, k.RevokedAt = tm(c), tm(r)
	return k, err
}

// KeyByID implements store.Store.
func (s *Store) KeyByID(ctx context.Context, id string) (store.Key, error) {
	k, err := scanKey(s.db.QueryRow(ctx, `SELECT `+keyCols+` FROM api_keys WHERE id = $1`, id))
	return k, notFound(err)
}

// ListKeys implements store.Store.
func (s *Store) ListKeys(ctx context.Context, accountID string) ([]store.Key, error) {
	rows, err := s.db.Query(ctx, `SELECT `+keyCols+` FROM api_keys WHERE account_id = $1 ORDER BY created_at, id`, accountID)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Key, error) { return scanKey(r) })
	return out, dbErr(err)
}

// RevokeKey implements store.Store.
func (s *Store) RevokeKey(ctx context.Context, id string, at time.Time) error {
	tag, err := s.db.Exec(ctx, `UPDATE api_keys SET revoked_at = $1 WHERE id = $2 AND revoked_at = 0`, ns(at), id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		if _, err := s.KeyByID(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

const sbCols = `account_id, name, provider, provider_name, instance_id, state, url, mem_bytes, pids, cpu_millis, wall_clock_ns,
	created_at, last_activity, parked_at, parked_by, version, disk_bytes, image, labels`

func scanSandbox(sc pgx.Row) (store.Sandbox, error) {
	var b store.Sandbox
	var c, la, pa, wc, pids int64
	var labels string
	err := sc.Scan(&b.AccountID, &b.Name, &b.Provider, &b.ProviderName, &b.InstanceID, &b.State, &b.URL,
		&b.Limits.MemoryBytes, &pids, &b.Limits.CPUMillis, &wc, &c, &la, &pa, &b.ParkedBy, &b.Version, &b.Limits.DiskBytes,
		&b.Image, &labels)
	b.Limits.Pids = int(pids)
	b.Limits.WallClock = time.Duration(wc)
	b.CreatedAt, b.LastActivity, b.ParkedAt = tm(c), tm(la), tm(pa)
	if err == nil {
		b.Labels, err = store.ParseLabels(labels)
	}
	return b, err
}

const insertSandboxSQL = `INSERT INTO sandboxes (` + sbCols + `) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 1, $16, $17, $18)`

func insertArgs(b store.Sandbox) []any {
	return []any{b.AccountID, b.Name, b.Provider, b.ProviderName, b.InstanceID, b.State, b.URL,
		b.Limits.MemoryBytes, int64(b.Limits.Pids), int64(b.Limits.CPUMillis), int64(b.Limits.WallClock),
		ns(b.CreatedAt), ns(b.LastActivity), ns(b.ParkedAt), b.ParkedBy, b.Limits.DiskBytes, b.Image, store.LabelsJSON(b.Labels)}
}

// InsertSandbox implements store.Store.
func (s *Store) InsertSandbox(ctx context.Context, b store.Sandbox) error {
	_, err := s.db.Exec(ctx, insertSandboxSQL, insertArgs(b)...)
	switch pgCode(err) {
	case uniqueViolation:
		return fmt.Errorf("sandbox %q: %w", b.Name, store.ErrAlreadyExists)
	case foreignKeyViolation:
		return fmt.Errorf("account %q: %w", b.AccountID, store.ErrNotFound)
	}
	return err
}

// GetSandbox implements store.Store.
func (s *Store) GetSandbox(ctx context.Context, accountID, name string) (store.Sandbox, error) {
	b, err := scanSandbox(s.db.QueryRow(ctx, `SELECT `+sbCols+` FROM sandboxes WHERE account_id = $1 AND name = $2`, accountID, name))
	return b, notFound(err)
}

// ListSandboxes implements store.Store. The rows come as one COPY
// stream (text format) rather than a row message each: 10,000 records
// cross in about a third of the time, and parse without reflection (see
// copyList).
func (s *Store) ListSandboxes(ctx context.Context, accountID string) ([]store.Sandbox, error) {
	if plainID(accountID) {
		return s.copyList(ctx, accountID)
	}
	return s.queryList(ctx, accountID)
}

// plainID reports whether id may stand in a COPY statement as a literal
// (COPY takes no parameters): letters, digits, '_' and '-', as every ID
// this store makes. Another is listed by a parameterised query.
func plainID(id string) bool {
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// copyList lists the records through COPY ... TO STDOUT.
func (s *Store) copyList(ctx context.Context, accountID string) ([]store.Sandbox, error) {
	q := `COPY (SELECT ` + sbCols + ` FROM sandboxes ORDER BY account_id, name) TO STDOUT`
	if accountID != "" {
		q = `COPY (SELECT ` + sbCols + ` FROM sandboxes WHERE account_id = '` + accountID + `' ORDER BY name) TO STDOUT`
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, dbErr(err)
	}
	defer conn.Release()
	var buf bytes.Buffer
	if _, err := conn.Conn().PgConn().CopyTo(ctx, &buf, q); err != nil {
		return nil, dbErr(err)
	}
	return parseCopy(buf.Bytes())
}

// parseCopy reads the records of COPY's text format: a line a row, its
// columns (sbCols' order) separated by tabs, a backslash, tab, newline,
// carriage return, backspace, form feed or vertical tab within a value
// escaped with a backslash (no column is NULL).
func parseCopy(b []byte) ([]store.Sandbox, error) {
	out := make([]store.Sandbox, 0, bytes.Count(b, []byte{'\n'}))
	var f [19][]byte
	for len(b) > 0 {
		nl := bytes.IndexByte(b, '\n')
		if nl < 0 {
			return nil, errors.New("postgres: a listing ends mid-row")
		}
		line := b[:nl]
		b = b[nl+1:]
		n := 0
		for n < len(f) {
			tab := bytes.IndexByte(line, '\t')
			if tab < 0 {
				f[n], line = line, nil
				n++
				break
			}
			f[n], line = line[:tab], line[tab+1:]
			n++
		}
		if n != len(f) || line != nil {
			return nil, fmt.Errorf("postgres: a listed row has %d columns, want %d", n, len(f))
		}
		var r store.Sandbox
		var ints [9]int64 // mem_bytes, pids, cpu_millis, wall_clock_ns, created_at, last_activity, parked_at, version, disk_bytes
		for i, col := range []int{7, 8, 9, 10, 11, 12, 13, 15, 16} {
			v, err := strconv.ParseInt(string(f[col]), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("postgres: a listed row's column %d: %w", col, err)
			}
			ints[i] = v
		}
		r.AccountID, r.Name, r.Provider, r.ProviderName = copyText(f[0]), copyText(f[1]), copyText(f[2]), copyText(f[3])
		r.InstanceID, r.State, r.URL, r.ParkedBy = copyText(f[4]), copyText(f[5]), copyText(f[6]), copyText(f[14])
		r.Limits.MemoryBytes, r.Limits.Pids, r.Limits.CPUMillis, r.Limits.WallClock = ints[0], int(ints[1]), int(ints[2]), time.Duration(ints[3])
		r.Limits.DiskBytes = ints[8]
		r.CreatedAt, r.LastActivity, r.ParkedAt, r.Version = tm(ints[4]), tm(ints[5]), tm(ints[6]), ints[7]
		r.Image = copyText(f[17])
		l, err := store.ParseLabels(copyText(f[18]))
		if err != nil {
			return nil, err
		}
		r.Labels = l
		out = append(out, r)
	}
	return out, nil
}

// copyText is a text value of COPY's text format, unescaped.
func copyText(v []byte) string {
	if bytes.IndexByte(v, '\\') < 0 {
		return string(v)
	}
	out := make([]byte, 0, len(v))
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '\\' && i+1 < len(v) {
			i++
			switch c = v[i]; c {
			case 'n':
				c = '\n'
			case 't':
				c = '\t'
			case 'r':
				c = '\r'
			case 'b':
				c = '\b'
			case 'f':
				c = '\f'
			case 'v':
				c = '\v'
			}
		}
		out = append(out, c)
	}
	return string(out)
}

// queryList lists the records with a parameterised query.
func (s *Store) queryList(ctx context.Context, accountID string) ([]store.Sandbox, error) {
	q, args := `SELECT `+sbCols+` FROM sandboxes ORDER BY account_id, name`, []any(nil)
	if accountID != "" {
		q, args = `SELECT `+sbCols+` FROM sandboxes WHERE account_id = $1 ORDER BY name`, []any{accountID}
	}
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Sandbox, error) { return scanSandbox(r) })
	if out == nil && err == nil {
		out = []store.Sandbox{}
	}
	return out, dbErr(err)
}

// UpdateSandbox implements store.Store.
func (s *Store) UpdateSandbox(ctx context.Context, b store.Sandbox) (store.Sandbox, error) {
	row := s.db.QueryRow(ctx, `UPDATE sandboxes SET provider_name = $1, instance_id = $2, state = $3, url = $4,
		mem_bytes = $5, pids = $6, cpu_millis = $7, wall_clock_ns = $8, last_activity = greatest(last_activity, $9), parked_at = $10, parked_by = $11,
		disk_bytes = $15, version = version + 1 WHERE account_id = $12 AND name = $13 AND version = $14 AND provider_name = $1 RETURNING `+sbCols,
		b.ProviderName, b.InstanceID, b.State, b.URL, b.Limits.MemoryBytes, int64(b.Limits.Pids), int64(b.Limits.CPUMillis), int64(b.Limits.WallClock),
		ns(b.LastActivity), ns(b.ParkedAt), b.ParkedBy, b.AccountID, b.Name, b.Version, b.Limits.DiskBytes)
	nb, err := scanSandbox(row)
	switch {
	case pgCode(err) == uniqueViolation:
		return b, fmt.Errorf("sandbox %q: %w", b.Name, store.ErrAlreadyExists)
	case errors.Is(err, pgx.ErrNoRows):
		if _, err := s.GetSandbox(ctx, b.AccountID, b.Name); err != nil {
			return b, err
		}
		return b, store.ErrConflict
	case err != nil:
		return b, err
	}
	return nb, nil
}

// TouchSandbox implements store.Store.
func (s *Store) TouchSandbox(ctx context.Context, accountID, name string, at time.Time) error {
	tag, err := s.db.Exec(ctx, `UPDATE sandboxes SET last_activity = greatest(last_activity, $1) WHERE account_id = $2 AND name = $3`, ns(at), accountID, name)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteSandbox implements store.Store.
func (s *Store) DeleteSandbox(ctx context.Context, accountID, name string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM sandboxes WHERE account_id = $1 AND name = $2`, accountID, name)
	return err
}

// DeleteSandboxIf implements store.Store.
func (s *Store) DeleteSandboxIf(ctx context.Context, b store.Sandbox) error {
	tag, err := s.db.Exec(ctx, `DELETE FROM sandboxes WHERE account_id = $1 AND name = $2 AND provider_name = $3 AND ($4 = 0 OR version = $4)`,
		b.AccountID, b.Name, b.ProviderName, b.Version)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		if _, err := s.GetSandbox(ctx, b.AccountID, b.Name); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			return err
		}
		return store.ErrConflict
	}
	return nil
}

// AddIntent implements store.Store.
func (s *Store) AddIntent(ctx context.Context, in store.Intent) (int64, error) {
	now := time.Now().UnixNano()
	if in.State == "" {
		in.State = store.IntentPending
	}
	var id int64
	err := s.db.QueryRow(ctx, `INSERT INTO intents (account_id, name, op, provider, provider_name, instance_id, arg, state, detail, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING id`,
		in.AccountID, in.Name, in.Op, in.Provider, in.ProviderName, in.InstanceID, in.Arg, in.State, in.Detail, now, now).Scan(&id)
	if pgCode(err) == uniqueViolation {
		return 0, fmt.Errorf("operation %q of sandbox %q: %w", in.Arg, in.Name, store.ErrAlreadyExists)
	}
	return id, dbErr(err)
}

const intentCols = `id, account_id, name, op, provider, provider_name, instance_id, arg, state, detail, created_at, updated_at`

func (s *Store) intents(ctx context.Context, where string, args ...any) ([]store.Intent, error) {
	rows, err := s.db.Query(ctx, `SELECT `+intentCols+` FROM intents WHERE `+where+` ORDER BY id`, args...)
	if err != nil {
		return nil, dbErr(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Intent, error) {
		var in store.Intent
		var c, u int64
		err := r.Scan(&in.ID, &in.AccountID, &in.Name, &in.Op, &in.Provider, &in.ProviderName, &in.InstanceID, &in.Arg, &in.State, &in.Detail, &c, &u)
		in.CreatedAt, in.UpdatedAt = tm(c), tm(u)
		return in, err
	})
	return out, dbErr(err)
}

// IntentsOf implements store.Store.
func (s *Store) IntentsOf(ctx context.Context, accountID, name string) ([]store.Intent, error) {
	return s.intents(ctx, `account_id = $1 AND name = $2`, accountID, name)
}

// SetIntent implements store.Store.
func (s *Store) SetIntent(ctx context.Context, id int64, state, detail string) error {
	tag, err := s.db.Exec(ctx, `UPDATE intents SET state = $1, detail = $2, updated_at = $3 WHERE id = $4`, state, detail, time.Now().UnixNano(), id)
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 0 {
		return store.ErrNotFound
	}
	return nil
}

// OpenIntents implements store.Store.
func (s *Store) OpenIntents(ctx context.Context) ([]store.Intent, error) {
	return s.intents(ctx, `state IN ('pending', 'uncertain')`)
}

// pruneBatch is how many intents one statement of PruneIntents removes.
const pruneBatch = 10000

// PruneIntents implements store.Store.
func (s *Store) PruneIntents(ctx context.Context, before time.Time) (int64, error) {
	var n int64
	for {
		tag, err := s.db.Exec(ctx, `DELETE FROM intents WHERE id IN (SELECT id FROM intents
			WHERE state NOT IN ('pending', 'uncertain') AND updated_at < $1
			AND NOT (op = 'create_checkpoint_once' AND EXISTS (SELECT 1 FROM sandboxes b
				WHERE b.provider = intents.provider AND b.provider_name = intents.provider_name)) LIMIT $2)`, ns(before), pruneBatch)
		if err != nil {
			return n, dbErr(err)
		}
		k := tag.RowsAffected()
		if n += k; k < pruneBatch {
			return n, nil
		}
	}
}

const runnerCols = `account_id, name, id, enrolled, key_id, created_at`

func scanRunner(sc pgx.Row) (store.Runner, error) {
	var r store.Runner
	var c int64
	err := sc.Scan(&r.AccountID, &r.Name, &r.ID, &r.Enrolled, &r.KeyID, &c)
	r.CreatedAt = tm(c)
	return r, err
}

// AddRunner implements store.Store.
func (s *Store) AddRunner(ctx context.Context, r store.Runner) error {
	_, err := s.db.Exec(ctx, `INSERT INTO runners (`+runnerCols+`) VALUES ($1, $2, $3, $4, $5, $6)`,
		r.AccountID, r.Name, r.ID, r.Enrolled, r.KeyID, ns(r.CreatedAt))
	if pgCode(err) == uniqueViolation {
		return fmt.Errorf("runner %q: %w", r.Name, store.ErrAlreadyExists)
	}
	return dbErr(err)
}

// RunnerByName implements store.Store.
func (s *Store) RunnerByName(ctx context.Context, accountID, name string) (store.Runner, error) {
	r, err := scanRunner(s.db.QueryRow(ctx, `SELECT `+runnerCols+` FROM runners WHERE account_id = $1 AND name = $2`, accountID, name))
	return r, notFound(dbErr(err))
}

// ListRunners implements store.Store.
func (s *Store) ListRunners(ctx context.Context, accountID string) ([]store.Runner, error) {
	rows, err := s.db.Query(ctx, `SELECT `+runnerCols+` FROM runners WHERE account_id = $1 ORDER BY name`, accountID)
	if err != nil {
		return nil, dbErr(err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Runner, error) { return scanRunner(r) })
	return out, dbErr(err)
}

// UpdateRunner implements store.Store.
func (s *Store) UpdateRunner(ctx context.Context, prev, next store.Runner) error {
	tag, err := s.db.Exec(ctx, `UPDATE runners SET enrolled = $1, key_id = $2 WHERE account_id = $3 AND name = $4 AND id = $5 AND enrolled = $6 AND key_id = $7`,
		next.Enrolled, next.KeyID, prev.AccountID, prev.Name, prev.ID, prev.Enrolled, prev.KeyID)
	if err != nil {
		return dbErr(err)
	}
	if tag.RowsAffected() == 0 {
		if _, err := s.RunnerByName(ctx, prev.AccountID, prev.Name); err != nil {
			return err
		}
		return store.ErrConflict
	}
	return nil
}

// DeleteRunner implements store.Store.
func (s *Store) DeleteRunner(ctx context.Context, accountID, name string) error {
	_, err := s.db.Exec(ctx, `DELETE FROM runners WHERE account_id = $1 AND name = $2`, accountID, name)
	return dbErr(err)
}

// Lease is one replica's hold on a named piece of work.
type Lease struct {
	s    *Store
	conn *pgxpool.Conn
	key  int64
	once sync.Once
}

// leaseKey maps a work name to its advisory lock key.
func leaseKey(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("managoat-lease:" + name))
	return int64(h.Sum64())
}

// TryLease takes the lease on name if no replica holds it: ok false when
// another does. The lease lasts until Release or until its connection
// ends (the replica died): the database then frees it, and another
// replica's next TryLease wins.
func (s *Store) TryLease(ctx context.Context, name string) (*Lease, bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	if s.keepalive != "" {
		// Best effort: a server that refuses them still grants the lease,
		// freed then when the kernel gives the dead peer up.
		_, _ = conn.Exec(ctx, s.keepalive)
	}
	key := leaseKey(name)
	var ok bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, key).Scan(&ok); err != nil {
		conn.Release()
		return nil, false, err
	}
	if !ok {
		conn.Release()
		return nil, false, nil
	}
	l := &Lease{s: s, conn: conn, key: key}
	s.mu.Lock()
	s.leases[l] = struct{}{}
	s.mu.Unlock()
	return l, true, nil
}

// leasePing bounds Held's look at its connection: a database out of
// reach must not hold up the work's loop (a ping to a machine gone silent
// waits for TCP to give up, minutes).
const leasePing = 5 * time.Second

// Held reports whether the lease is still held (its connection answers
// within 5 s); a holder checks it before each pass of its work.
func (l *Lease) Held(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, leasePing)
	defer cancel()
	return l.conn.Ping(ctx) == nil
}

// Release gives the lease up; total.
func (l *Lease) Release() {
	l.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock($1)`, l.key); err != nil {
			// The lock is the connection's: closing it frees the lock.
			_ = l.conn.Conn().Close(ctx)
		}
		l.conn.Release()
		l.s.mu.Lock()
		delete(l.s.leases, l)
		l.s.mu.Unlock()
	})
}

// Holder keeps trying for the lease on one piece of work: Held reports
// whether this replica holds it now, taking it when it is free (the
// holder died) and noticing when its own connection was lost. It is the
// shape lifecycle.Config.Lease takes:
//
//	h := st.Holder("lifecycle")
//	defer h.Close()
//	lifecycle.New(lifecycle.Config{..., Lease: h.Held})
type Holder struct {
	s    *Store
	name string
	mu   sync.Mutex
	l    *Lease
}

// Holder returns a holder of the lease on name.
func (s *Store) Holder(name string) *Holder { return &Holder{s: s, name: name} }

// Held implements lifecycle.Config.Lease. It answers within about 5 s
// (10 s when it lets a lost lease go) whatever the database does: false
// when the database does not answer in time.
func (h *Holder) Held(ctx context.Context) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, leasePing)
	defer cancel()
	if h.l != nil {
		if h.l.Held(ctx) {
			return true
		}
		h.l.Release()
		h.l = nil
	}
	l, ok, err := h.s.TryLease(ctx, h.name)
	if err != nil || !ok {
		return false
	}
	h.l = l
	return true
}

// Close gives the lease up if held.
func (h *Holder) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.l != nil {
		h.l.Release()
		h.l = nil
	}
}

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
	_, err := s.db.Exec(ctx, `INSERT INTO preview_links (`+plCols+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		l.ID, l.AccountID, l.Sandbox, l.ProviderName, int64(l.Port), ns(l.CreatedAt), ns(l.ExpiresAt), ns(l.RevokedAt))
	if pgCode(err) == uniqueViolation {
		return fmt.Errorf("preview link %q: %w", l.ID, store.ErrAlreadyExists)
	}
	return err
}

// PreviewLinkByID implements store.Store.
func (s *Store) PreviewLinkByID(ctx context.Context, id string) (store.PreviewLink, error) {
	l, err := scanPreviewLink(s.db.QueryRow(ctx, `SELECT `+plCols+` FROM preview_links WHERE id = $1`, id))
	return l, notFound(err)
}

// ListPreviewLinks implements store.Store.
func (s *Store) ListPreviewLinks(ctx context.Context, accountID, sandbox, providerName string) ([]store.PreviewLink, error) {
	rows, err := s.db.Query(ctx, `SELECT `+plCols+` FROM preview_links WHERE account_id = $1 AND sandbox = $2 AND provider_name = $3 ORDER BY created_at, id`,
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
	r, err := s.db.Exec(ctx, `UPDATE preview_links SET revoked_at = CASE WHEN revoked_at = 0 THEN $1 ELSE revoked_at END
		WHERE id = $2 AND account_id = $3 AND sandbox = $4`, ns(at), id, accountID, sandbox)
	if err != nil {
		return err
	}
	if r.RowsAffected() == 0 {
		return fmt.Errorf("preview link %q: %w", id, store.ErrNotFound)
	}
	return nil
}
