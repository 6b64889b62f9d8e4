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
// so that replicas starting together migrate once. The store logic itself
// is sqlstore's, run on the pool through database/sql with this package's
// dialect.
package postgres

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the advisory lock key held while migrating: any constant
// the database's other users do not pick ("lakeshore" in ASCII, truncated).
const migrationLock int64 = 0x6c616b6573686f72

// DB is a store.Store on one PostgreSQL database.
type DB struct {
	*sqlstore.DB
	pool *pgxpool.Pool

	// mu guards notifiers, whose publishing connections Close closes.
	mu        sync.Mutex
	notifiers []*Notifier
}

var _ store.Store = (*DB)(nil)

// defaultMaxConns is the pool size of a DSN that names none.
const defaultMaxConns = 16

// Open connects to the database named by dsn (a postgres:// URL or a
// key=value string; pool_max_conns and friends are honoured) and migrates it.
func Open(ctx context.Context, dsn string) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: parse DSN: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		// pgx's default is the number of CPUs, at least 4: a replica
		// serving thousands of daemons waits on the round trip of each
		// statement, not on its CPUs, and queues behind four.
		cfg.MaxConns = defaultMaxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: connect: %w", err)
	}
	if err := migrate(ctx, pool); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: migrate: %w", err)
	}
	ms, err := sqlstore.Migrations(migrations)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	sdb := stdlib.OpenDBFromPool(pool)
	return &DB{DB: sqlstore.New(sdb, sdb, dialect(pool, ms)), pool: pool}, nil
}

// Close closes the pool and the Notifiers' publishing connections.
func (db *DB) Close() error {
	db.mu.Lock()
	ns := db.notifiers
	db.notifiers = nil
	db.mu.Unlock()
	for _, n := range ns {
		n.close()
	}
	err := db.DB.Close()
	db.pool.Close()
	return err
}

// dialect is PostgreSQL's: numbered placeholders, row locks, READ
// COMMITTED writes retried on deadlock, REPEATABLE READ snapshots,
// statements detached from their caller's cancellation, transactions and
// statements run on pgx itself (see runTx, pgxPool), and the migrations ms
// that migrate applied.
func dialect(pool *pgxpool.Pool, ms []sqlstore.Migration) sqlstore.Dialect {
	return sqlstore.Dialect{
		Placeholders:          sqlstore.Dollar,
		ForUpdate:             " FOR UPDATE",
		LockWorkerKeys:        `SELECT pg_advisory_xact_lock(hashtextextended('daemon_keys:' || CAST(? AS TEXT), 0))`,
		WriteTx:               &sql.TxOptions{Isolation: sql.LevelReadCommitted},
		SnapshotTx:            &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true},
		Retryable:             retryable,
		IsPrimaryKeyViolation: isPrimaryKeyViolation,
		StatementContext:      detach,
		RunTx: func(ctx context.Context, opts *sql.TxOptions, fn func(sqlstore.Tx) error) error {
			return runTx(ctx, pool, opts, fn)
		},
		Pool:       pgxPool{pool},
		Migrations: ms,
	}
}

// runTx runs fn in a transaction on pgx directly. Through database/sql the
// same statements cost a goroutine per transaction and one per result set
// (each woken when it ends): on a small machine those wake-ups took a
// quarter more time than the round trips themselves.
//
// The transaction's BEGIN goes with its first statement, and the
// statements fn leaves for the commit go with the COMMIT, each pair one
// round trip (see sqlstore's pipeline.go): a take, the exec path's busiest
// transaction, is three round trips instead of seven.
func runTx(ctx context.Context, pool *pgxpool.Pool, opts *sql.TxOptions, fn func(sqlstore.Tx) error) error {
	begin, err := beginStatement(opts)
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	// A connection given back inside a transaction (a failed rollback,
	// a deadline that cut a statement) is closed by the pool, not reused.
	defer conn.Release()
	tx := &pgxTx{conn: conn.Conn(), begin: begin}
	if err := fn(tx); err != nil {
		tx.rollback(ctx)
		return err
	}
	return tx.commit(ctx)
}

// beginStatement is the BEGIN of a transaction with opts.
func beginStatement(opts *sql.TxOptions) (string, error) {
	b := "BEGIN"
	if opts == nil {
		return b, nil
	}
	switch opts.Isolation {
	case sql.LevelDefault:
	case sql.LevelReadCommitted:
		b += " ISOLATION LEVEL READ COMMITTED"
	case sql.LevelRepeatableRead:
		b += " ISOLATION LEVEL REPEATABLE READ"
	case sql.LevelSerializable:
		b += " ISOLATION LEVEL SERIALIZABLE"
	default:
		return "", fmt.Errorf("begin: isolation level %v not supported", opts.Isolation)
	}
	if opts.ReadOnly {
		b += " READ ONLY"
	}
	return b, nil
}

// pgxTx is a transaction as sqlstore runs its queries on it: on one
// connection, begun by the batch that carries its first statement.
type pgxTx struct {
	conn *pgx.Conn
	// begin is the BEGIN still to send, "" once sent.
	begin string
	// atCommit are the statements to send with the COMMIT.
	atCommit []sqlstore.Stmt
}

// batch starts a batch with the BEGIN if it is still to be sent, and
// says whether it was.
func (t *pgxTx) batch() (*pgx.Batch, bool) {
	b := &pgx.Batch{}
	if t.begin == "" {
		return b, false
	}
	b.Queue(t.begin)
	t.begin = ""
	return b, true
}

func (t *pgxTx) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	b, begun := t.batch()
	if !begun {
		tag, err := t.conn.Exec(ctx, query, args...)
		if err != nil {
			return 0, err
		}
		return tag.RowsAffected(), nil
	}
	b.Queue(query, args...)
	br := t.conn.SendBatch(ctx, b)
	tag, err := execBegun(br)
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// execBegun reads the BEGIN's result, then the statement's.
func execBegun(br pgx.BatchResults) (pgconn.CommandTag, error) {
	if _, err := br.Exec(); err != nil {
		return pgconn.CommandTag{}, fmt.Errorf("begin: %w", err)
	}
	return br.Exec()
}

func (t *pgxTx) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	b, begun := t.batch()
	if !begun {
		rs, err := t.conn.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		return pgxRows{rs}, nil
	}
	b.Queue(query, args...)
	br := t.conn.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, fmt.Errorf("begin: %w", err)
	}
	rs, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{pgxRows{rs}, br}, nil
}

// ExecAll implements sqlstore.Pipeliner.
func (t *pgxTx) ExecAll(ctx context.Context, stmts []sqlstore.Stmt) error {
	if len(stmts) == 0 {
		return nil
	}
	b, begun := t.batch()
	for _, s := range stmts {
		b.Queue(s.Query, s.Args...)
	}
	return runBatch(t.conn.SendBatch(ctx, b), begun, stmts, false)
}

// ExecAtCommit implements sqlstore.Pipeliner.
func (t *pgxTx) ExecAtCommit(stmts []sqlstore.Stmt) {
	t.atCommit = append(t.atCommit, stmts...)
}

// runBatch reads a batch's results: the BEGIN's if begun, then stmts',
// then the COMMIT's if commit, and closes it. The first failure is the
// batch's; a COMMIT that rolled back is one.
func runBatch(br pgx.BatchResults, begun bool, stmts []sqlstore.Stmt, commit bool) error {
	err := func() error {
		if begun {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("begin: %w", err)
			}
		}
		for _, s := range stmts {
			if _, err := br.Exec(); err != nil {
				return fmt.Errorf("%s: %w", s.What, err)
			}
		}
		if commit {
			tag, err := br.Exec()
			if err != nil {
				return fmt.Errorf("commit: %w", err)
			}
			if tag.String() != "COMMIT" {
				return fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
			}
		}
		return nil
	}()
	if cerr := br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

// commit sends the statements left for it and the COMMIT, in one round
// trip; a transaction that never began has nothing to commit.
func (t *pgxTx) commit(ctx context.Context) error {
	if t.begin != "" && len(t.atCommit) == 0 {
		return nil
	}
	b, begun := t.batch()
	for _, s := range t.atCommit {
		b.Queue(s.Query, s.Args...)
	}
	b.Queue("COMMIT")
	if err := runBatch(t.conn.SendBatch(ctx, b), begun, t.atCommit, true); err != nil {
		// A statement that failed left the transaction aborted, its
		// COMMIT skipped.
		t.rollback(ctx)
		return err
	}
	return nil
}

// rollback ends a transaction that failed, if it began.
func (t *pgxTx) rollback(ctx context.Context) {
	if t.begin != "" {
		return
	}
	// A ROLLBACK that fails leaves the connection mid-transaction, and
	// the pool closes such a connection when it is given back.
	_, _ = t.conn.Exec(ctx, "ROLLBACK")
}

// batchRows is the result of a query sent in a batch: closing it closes
// the batch too.
type batchRows struct {
	pgxRows
	br pgx.BatchResults
}

func (r batchRows) Close() error {
	err := r.pgxRows.Close()
	if cerr := r.br.Close(); err == nil && cerr != nil {
		err = cerr
	}
	return err
}

// pgxPool is the pool as sqlstore runs its statements outside a
// transaction on it: each on a connection of its own, given back when the
// statement (or its result) is done.
type pgxPool struct{ pool *pgxpool.Pool }

func (p pgxPool) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := p.pool.Exec(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

func (p pgxPool) Query(ctx context.Context, query string, args ...any) (sqlstore.Rows, error) {
	rs, err := p.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rs}, nil
}

// pgxRows reports on Close what pgx reports in Err once closed.
type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return r.Rows.Err()
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
	if _, err := conn.Exec(ctx, sqlstore.CreateMigrationsTable); err != nil {
		return err
	}
	ms, err := sqlstore.Migrations(migrations)
	if err != nil {
		return err
	}
	for _, m := range ms {
		if err := applyMigration(ctx, conn.Conn(), m); err != nil {
			return err
		}
	}
	return nil
}

func applyMigration(ctx context.Context, conn *pgx.Conn, m sqlstore.Migration) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx)
	var n int
	if err := tx.QueryRow(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = $1`, m.Version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	// Without arguments pgx sends the simple protocol, which takes a file
	// of several statements.
	if _, err := tx.Exec(ctx, m.SQL); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)`, m.Version, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// statementTimeout bounds a detached statement (or transaction) that the
// caller's deadline does not bound sooner: a hung database still fails the
// request, at the price of that connection.
const statementTimeout = 30 * time.Second

// detach is ctx without its cancellation, keeping a deadline. Every
// statement runs on it, and only if the caller's context is still live.
// pgx cannot abandon a statement halfway without dropping the connection,
// prepared statements and all, and a control plane sees a request
// cancelled mid-statement on every exec (the daemon drops its poll in
// flight when the exec ends): detached, a cancellation costs at most the
// one short statement in flight instead of a reconnect.
func detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d := time.Now().Add(statementTimeout)
	if cd, ok := ctx.Deadline(); ok && cd.Before(d) {
		d = cd
	}
	return context.WithDeadline(context.WithoutCancel(ctx), d)
}

// retryable: a transaction that lost to a deadlock or a serialisation
// failure runs again from scratch.
func retryable(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	return pe.Code == "40001" || pe.Code == "40P01" // serialization_failure, deadlock_detected
}

// isPrimaryKeyViolation reports whether err is a unique violation of table's
// primary key (named <table>_pkey by default).
func isPrimaryKeyViolation(err error, table string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505" && pe.ConstraintName == table+"_pkey"
}
