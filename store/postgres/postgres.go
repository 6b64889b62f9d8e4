// Package postgres is the store.Store for several control-plane replicas
// sharing one PostgreSQL database, with the same semantics as the embedded
// SQLite store. It also carries wake-ups between those replicas over
// LISTEN/NOTIFY (Notifier).
//
// Every write runs in a READ COMMITTED transaction that takes row locks
// before it decides anything: the worker row serialises that worker's
// command sequence (enqueue, claim, take, acknowledge), an invocation's row
// serialises its state changes, and queued invocations are claimed with
// FOR UPDATE SKIP LOCKED so that two replicas claiming at once neither wait
// on each other nor take the same one. A transaction that still loses to a
// deadlock or a serialisation failure is retried. A cancelled caller stops
// at the next statement boundary, never inside a statement (see detached).
//
// The schema comes from embedded migrations, applied under an advisory lock
// so that replicas starting together migrate once.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"nymph/store"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the advisory lock key held while migrating: any constant
// the database's other users do not pick ("lakeshore" in ASCII, truncated).
const migrationLock int64 = 0x6c616b6573686f72

// DB is a store.Store on one PostgreSQL database.
type DB struct {
	pool *pgxpool.Pool
	q    querier // the pool, detached
}

var _ store.Store = (*DB)(nil)

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value string; pool_max_conns and friends are honoured) and migrates it.
func Open(ctx context.Context, dsn string) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", err)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	return &DB{pool: pool, q: detached{pool}}, nil
}

// Close closes the pool.
func (db *DB) Close() error {
	db.pool.Close()
	return nil
}

// Pool is the connection pool, for tests that inspect the database.
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	// A session lock, held across the per-migration transactions: a second
	// replica waits here, then finds every version applied.
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrationLock); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	defer func() {
		// The unlock must run even when ctx is done, or the lock stays with
		// a pooled connection.
		uctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := conn.Exec(uctx, `SELECT pg_advisory_unlock($1)`, migrationLock); err != nil {
			conn.Conn().Close(uctx)
		}
	}()
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, applied_at BIGINT NOT NULL)`); err != nil {
		return err
	}
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	for _, name := range names {
		base := strings.TrimPrefix(name, "migrations/")
		num, _, _ := strings.Cut(base, "_")
		version, err := strconv.Atoi(num)
		if err != nil {
			return fmt.Errorf("migration %s: name must start with a number: %w", name, err)
		}
		if err := applyMigration(ctx, conn.Conn(), name, version); err != nil {
			return err
		}
	}
	return nil
}

func applyMigration(ctx context.Context, conn *pgx.Conn, name string, version int) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = $1`, version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	text, err := migrations.ReadFile(name)
	if err != nil {
		return err
	}
	// Without arguments pgx sends the simple protocol, which takes a file
	// of several statements.
	if _, err := tx.Exec(ctx, string(text)); err != nil {
		return fmt.Errorf("migration %s: %w", name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, version, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// querier is what the pool and a transaction both offer.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// detached runs each statement only if the caller's context is still live,
// but on a context its cancellation does not reach. pgx cannot abandon a
// statement halfway without dropping the connection, prepared statements
// and all, and a control plane sees a request cancelled mid-statement on
// every exec (the daemon drops its poll in flight when the exec ends):
// detached, a cancellation costs at most the one short statement in flight
// instead of a reconnect. Everything in this package goes through it.
type detached struct{ q querier }

// statementTimeout bounds a detached statement (or transaction) that the
// caller's deadline does not bound sooner: a hung database still fails the
// request, at the price of that connection.
const statementTimeout = 30 * time.Second

// detach is ctx without its cancellation, keeping a deadline.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d := time.Now().Add(statementTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return context.WithDeadline(context.WithoutCancel(ctx), d)
}

func (d detached) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	dctx, cancel := detach(ctx)
	rows, err := d.q.Query(dctx, sql, args...)
	if err != nil {
		cancel()
		return nil, err
	}
	return cancelRows{rows, cancel}, nil
}

func (d detached) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := ctx.Err(); err != nil {
		return errRow{err}
	}
	dctx, cancel := detach(ctx)
	return cancelRow{d.q.QueryRow(dctx, sql, args...), cancel}
}

func (d detached) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := ctx.Err(); err != nil {
		return pgconn.CommandTag{}, err
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	return d.q.Exec(dctx, sql, args...)
}

// cancelRows releases the statement's context when the rows are closed.
type cancelRows struct {
	pgx.Rows
	cancel context.CancelFunc
}

func (r cancelRows) Close() {
	r.Rows.Close()
	r.cancel()
}

// cancelRow releases the statement's context once scanned.
type cancelRow struct {
	row    pgx.Row
	cancel context.CancelFunc
}

func (r cancelRow) Scan(dest ...any) error {
	defer r.cancel()
	return r.row.Scan(dest...)
}

// errRow is a row that was never queried.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// txAttempts bounds the retries of a transaction that lost to a deadlock or
// a serialisation failure; each retry starts from scratch.
const txAttempts = 5

// tx runs fn in a READ COMMITTED transaction, again when PostgreSQL chose it
// as a deadlock victim. fn must be safe to run more than once: it only
// writes the variables it returns through.
func (db *DB) tx(ctx context.Context, fn func(querier) error) error {
	var err error
	for attempt := 0; attempt < txAttempts; attempt++ {
		err = db.tryTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, fn)
		if !retryable(err) {
			return err
		}
	}
	return err
}

// tryTx runs fn in one transaction, statements detached from ctx's
// cancellation; a ctx cancelled meanwhile rolls it back at the next
// statement or at the latest before the commit, as database/sql does.
func (db *DB) tryTx(ctx context.Context, opts pgx.TxOptions, fn func(querier) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	tx, err := db.pool.BeginTx(dctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	err = fn(detached{tx})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = tx.Rollback(dctx)
		return err
	}
	if err := tx.Commit(dctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func retryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == "40001" || pe.Code == "40P01" // serialization_failure, deadlock_detected
}

// uniqueViolation reports whether err is a unique violation of constraint.
func uniqueViolation(err error, constraint string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == constraint
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMs(v int64) time.Time { return time.UnixMilli(v).UTC() }

func msPtr(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

func fromNullMs(v *int64) *time.Time {
	if v == nil {
		return nil
	}
	t := fromMs(*v)
	return &t
}

func notFound(what, id string) error {
	return fmt.Errorf("%s %q: %w", what, id, store.ErrNotFound)
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
