// Package sqlstore owns the SQL shared by both store engines: one
// implementation of store.Store on database/sql, with each query written
// once (with ? placeholders) and run through a Dialect that says how the
// engine numbers placeholders, locks rows, isolates and retries
// transactions, and classifies errors. The engine packages (sqlite,
// postgres) open the connections, apply their own migrations and supply
// their Dialect.
//
// Times are stored as unix milliseconds in both engines, so both round them
// the same way.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"nymph/lakeshore/store"
)

// Dialect is what differs between the engines. The zero value suits an
// engine with a single writer (SQLite): no row locks, default transactions,
// no retries, statements on the caller's context.
type Dialect struct {
	// Placeholders rewrites a query written with ? placeholders into the
	// driver's form; nil runs queries as written.
	Placeholders func(query string) string
	// ForUpdate is the clause that locks the rows a SELECT returns until
	// commit (" FOR UPDATE"), or "" where writers are serialised anyway.
	ForUpdate string
	// LockWorkerKeys is a statement taking a transaction-scoped lock on the
	// keys of the worker whose id is its one argument, or "". Keys outlive
	// worker rows, so the worker row's lock cannot serve.
	LockWorkerKeys string
	// WriteTx are the options of every write transaction (nil: default).
	WriteTx *sql.TxOptions
	// SnapshotTx are the options of a transaction reading several tables
	// as one snapshot; nil reads them straight from the pool instead.
	SnapshotTx *sql.TxOptions
	// Retryable reports whether a transaction that failed with err may be
	// run again from scratch (deadlock, serialisation failure); nil: never.
	Retryable func(err error) bool
	// IsPrimaryKeyViolation reports whether err is a duplicate primary key
	// in table.
	IsPrimaryKeyViolation func(err error, table string) bool
	// StatementContext derives the context a statement (or a transaction)
	// runs on from the caller's; nil runs it on the caller's context. The
	// caller's cancellation is checked before each statement either way.
	StatementContext func(ctx context.Context) (context.Context, context.CancelFunc)
	// RunTx, when set, runs every transaction on the engine's own driver
	// rather than through a database/sql Tx: it begins one with opts on
	// ctx (already derived by StatementContext), runs fn on it, commits if
	// fn returns nil and rolls back otherwise. database/sql watches each
	// transaction and each result in a goroutine of its own, which costs
	// a client of a networked server more than the statements do. Its Tx
	// may also pipeline (Pipeliner, pipeline.go).
	RunTx func(ctx context.Context, opts *sql.TxOptions, fn func(Tx) error) error
	// Pool, when set, runs the statements outside a transaction on the
	// engine's own driver too, for the same reason as RunTx: through
	// database/sql each also takes its pool's lock twice and watches its
	// result in a goroutine of its own, which a replica serving
	// thousands of daemons pays on every token, key and worker read.
	Pool Tx
	// Migrations are the engine's embedded migrations, all applied by the
	// time it hands the database over; Ready checks they still are.
	Migrations []Migration
	// PrepareStatements prepares each query once per connection of the
	// database/sql pools and runs it prepared from then on (see
	// stmtCache), for a driver that otherwise parses every statement it
	// runs (SQLite). pgx keeps a statement cache of its own per
	// connection, on both its paths, so PostgreSQL leaves this off.
	PrepareStatements bool
	// GroupCommit runs the write transactions that wait while one runs
	// together, in one transaction (groupcommit.go): for an engine whose
	// writes go one at a time through one connection anyway.
	GroupCommit bool
	// Committed, when set, is called after each write transaction
	// commits (SQLite: its checkpointer learns the log grew). It must
	// not block.
	Committed func()
}

// forUpdateOf locks only the rows of the given table alias (PostgreSQL
// refuses to lock the nullable side of an outer join).
func (d *Dialect) forUpdateOf(alias string) string {
	if d.ForUpdate == "" {
		return ""
	}
	return d.ForUpdate + " OF " + alias
}

// forUpdateSkipLocked passes over rows another transaction holds.
func (d *Dialect) forUpdateSkipLocked() string {
	if d.ForUpdate == "" {
		return ""
	}
	return d.ForUpdate + " SKIP LOCKED"
}

func (d *Dialect) rebind(query string) string {
	if d.Placeholders == nil {
		return query
	}
	return d.Placeholders(query)
}

func (d *Dialect) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if d.StatementContext == nil {
		return ctx, func() {}
	}
	return d.StatementContext(ctx)
}

// Dollar numbers ? placeholders $1, $2, ... (PostgreSQL). The queries of
// this package hold no ? inside string literals.
func Dollar(query string) string {
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	for i := 0; i < len(query); i++ {
		if query[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(query[i])
	}
	return b.String()
}

// DB is a store.Store on database/sql.
type DB struct {
	w *sql.DB // writes
	r *sql.DB // reads; may be w itself
	d *Dialect
	// ws and rs are the prepared statements of w and r (the same cache
	// when r is w); nil unless the dialect prepares statements.
	ws, rs *stmtCache
	// group shares write transactions; nil unless the dialect asks.
	group *groupCommit
	// hook observes statements (ObserveOps).
	hook *opHook
}

var _ store.Store = (*DB)(nil)

// New returns the store writing through w and reading through r (which may
// be w). The store owns both: Close closes them.
func New(w, r *sql.DB, d Dialect) *DB {
	db := &DB{w: w, r: r, d: &d, hook: &opHook{}}
	if d.GroupCommit {
		db.group = newGroupCommit(db)
	}
	if d.PrepareStatements {
		db.ws = newStmtCache(w)
		db.rs = db.ws
		if r != w {
			db.rs = newStmtCache(r)
		}
	}
	return db
}

// Close closes the prepared statements, then the pools.
func (db *DB) Close() error {
	var errs []error
	if db.ws != nil {
		errs = append(errs, db.ws.close())
		if db.rs != db.ws {
			errs = append(errs, db.rs.close())
		}
	}
	errs = append(errs, db.w.Close())
	if db.r != db.w {
		errs = append(errs, db.r.Close())
	}
	return errors.Join(errs...)
}

// txAttempts bounds the runs of a transaction the dialect calls retryable.
const txAttempts = 5

// tx runs fn in a write transaction, again when the dialect says its
// failure was transient. fn must be safe to run more than once: it only
// writes the variables it returns through.
func (db *DB) tx(ctx context.Context, fn func(querier) error) error {
	if db.group != nil {
		return db.group.run(ctx, fn)
	}
	var err error
	for attempt := 0; attempt < txAttempts; attempt++ {
		err = db.tryTx(ctx, db.w, db.d.WriteTx, fn)
		if db.d.Retryable == nil || !db.d.Retryable(err) {
			return err
		}
	}
	return err
}

// readTx runs fn on one snapshot where the dialect has snapshots, else on
// the read pool.
func (db *DB) readTx(ctx context.Context, fn func(querier) error) error {
	if db.d.SnapshotTx == nil {
		return fn(db.reader())
	}
	return db.tryTx(ctx, db.r, db.d.SnapshotTx, fn)
}

// tryTx runs fn in one transaction. A ctx cancelled meanwhile rolls it back
// at the next statement or at the latest before the commit.
func (db *DB) tryTx(ctx context.Context, pool *sql.DB, opts *sql.TxOptions, fn func(querier) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tctx, cancel := db.d.statementContext(ctx)
	defer cancel()
	if db.group != nil && pool == db.w {
		// The one writer's statements run to their end, as those of a
		// shared transaction do (groupCommit.shared); a caller gone away
		// still stops its work at the next statement and rolls it back
		// before the commit (ctx is checked at each). A statement on a
		// context that can end costs the SQLite driver a goroutine, and
		// database/sql one more for each query's rows: 16 of the 19
		// goroutines a back-to-back exec started on the control plane
		// (3 transactions), on its path.
		tctx = context.WithoutCancel(tctx)
	}
	if db.d.RunTx != nil {
		err := db.d.RunTx(tctx, opts, func(tx Tx) error {
			if err := fn(querier{c: tx, d: db.d, tctx: tctx, hook: db.hook}); err != nil {
				return err
			}
			return ctx.Err()
		})
		if err == nil && pool == db.w && db.d.Committed != nil {
			db.d.Committed()
		}
		return err
	}
	tx, err := pool.BeginTx(tctx, opts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	var c Tx = sqlConn{tx}
	var st *txStmts
	if cache := db.cacheOf(pool); cache != nil {
		st = &txStmts{tx: tx, cache: cache}
		c = st
	}
	err = fn(querier{c: c, d: db.d, tctx: tctx, hook: db.hook})
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		_ = tx.Rollback()
	} else if err = tx.Commit(); err != nil {
		err = fmt.Errorf("commit: %w", err)
	} else if pool == db.w && db.d.Committed != nil {
		db.d.Committed()
	}
	if st != nil {
		// Now that the transaction has given its connection back (the
		// writer's only one), what it ran unprepared gets prepared.
		st.prepareMissed(ctx)
	}
	return err
}

// cacheOf is the statement cache of pool, nil when statements are not
// prepared.
func (db *DB) cacheOf(pool *sql.DB) *stmtCache {
	if pool == db.w {
		return db.ws
	}
	return db.rs
}

func (db *DB) reader() querier { return querier{c: db.onPool(db.r), d: db.d, hook: db.hook} }

func (db *DB) writer() querier { return querier{c: db.onPool(db.w), d: db.d, hook: db.hook} }

// onPool runs statements straight on pool, prepared where the dialect
// prepares them, or on the dialect's own pool.
func (db *DB) onPool(pool *sql.DB) Tx {
	if db.d.Pool != nil {
		return db.d.Pool
	}
	if cache := db.cacheOf(pool); cache != nil {
		return stmtPool{cache}
	}
	return sqlConn{pool}
}

// Tx is a transaction on an engine's own driver (see Dialect.RunTx): what
// the store's queries need of it. Queries arrive rebound for the dialect.
type Tx interface {
	// Exec runs a statement and returns how many rows it changed.
	Exec(ctx context.Context, query string, args ...any) (int64, error)
	Query(ctx context.Context, query string, args ...any) (Rows, error)
}

// Rows is a result being read; Close reports a failure the statement met
// after its last row.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// sqlDBOrTx is what *sql.DB and *sql.Tx both offer.
type sqlDBOrTx interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// sqlConn is a database/sql pool or transaction as a Tx.
type sqlConn struct{ c sqlDBOrTx }

func (s sqlConn) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := s.c.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (s sqlConn) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	rs, err := s.c.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// querier runs the package's queries on a pool or a transaction, rebound
// for the dialect and each on the dialect's statement context.
type querier struct {
	c Tx
	d *Dialect
	// tctx is the context of the transaction q runs in, already derived
	// by the dialect: its statements run on it rather than on a context
	// (and a timer) of their own. Nil outside a transaction.
	tctx context.Context
	// hook observes each statement; nil observes none.
	hook *opHook
}

// statementContext is the context a statement runs on.
func (q querier) statementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if q.tctx != nil {
		return q.tctx, func() {}
	}
	return q.d.statementContext(ctx)
}

// Exec runs a statement and returns how many rows it changed.
func (q querier) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	sctx, cancel := q.statementContext(ctx)
	defer cancel()
	done := q.hook.begin(query)
	n, err := q.c.Exec(sctx, q.d.rebind(query), args...)
	if done != nil {
		done(err != nil)
	}
	return n, err
}

// affected runs a statement and returns how many rows it changed.
func (q querier) affected(ctx context.Context, query string, args ...any) (int64, error) {
	return q.Exec(ctx, query, args...)
}

func (q querier) Query(ctx context.Context, query string, args ...any) (*rows, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	sctx, cancel := q.statementContext(ctx)
	done := q.hook.begin(query)
	rs, err := q.c.Query(sctx, q.d.rebind(query), args...)
	if err != nil {
		cancel()
		if done != nil {
			done(true)
		}
		return nil, err
	}
	return &rows{Rows: rs, cancel: cancel, done: done}, nil
}

// QueryRow runs a query for its first row, as database/sql's QueryRow:
// no row scans as sql.ErrNoRows.
func (q querier) QueryRow(ctx context.Context, query string, args ...any) rowScanner {
	rs, err := q.Query(ctx, query, args...)
	if err != nil {
		return errRow{err}
	}
	return row{rs}
}

// rows releases the statement's context when closed.
type rows struct {
	Rows
	cancel context.CancelFunc
	// done, when set, observes the query at its first Close.
	done func(failed bool)
}

func (r *rows) Close() error {
	err := r.Rows.Close()
	r.cancel()
	if r.done != nil {
		r.done(err != nil || r.Rows.Err() != nil)
		r.done = nil
	}
	return err
}

// row scans the first row of its result and closes it.
type row struct{ rs *rows }

func (r row) Scan(dest ...any) error {
	var err error
	if r.rs.Next() {
		err = r.rs.Scan(dest...)
	} else if err = r.rs.Err(); err == nil {
		err = sql.ErrNoRows
	}
	// A statement can fail after its rows (a deferred constraint, a
	// RETURNING whose write fails late): that failure is the answer.
	if cerr := r.rs.Close(); cerr != nil && (err == nil || errors.Is(err, sql.ErrNoRows)) {
		err = cerr
	}
	return err
}

// errRow is a row that was never queried.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

type rowScanner interface {
	Scan(dest ...any) error
}

// collectStrings reads a one-column result and closes it.
func collectStrings(rs *rows) ([]string, error) {
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		if err := rs.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rs.Err()
}

func ms(t time.Time) int64 { return t.UnixMilli() }

func fromMs(v int64) time.Time { return time.UnixMilli(v).UTC() }

// msPtr is a nullable time argument.
func msPtr(t *time.Time) any {
	if t == nil {
		return nil
	}
	return t.UnixMilli()
}

func fromNullMs(v sql.NullInt64) *time.Time {
	if !v.Valid {
		return nil
	}
	t := fromMs(v.Int64)
	return &t
}

// strOrNil is a nullable text argument.
func strOrNil(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// jsonOrNil is a nullable JSON text argument: empty is NULL.
func jsonOrNil(b []byte) any {
	if len(b) == 0 {
		return nil
	}
	return string(b)
}

func nullString(s sql.NullString) *string {
	if !s.Valid {
		return nil
	}
	v := s.String
	return &v
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

func decodeJSON(s string, v any) error {
	if s == "" {
		return nil
	}
	return json.Unmarshal([]byte(s), v)
}

func encodeJSON(v any) (string, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return "", err
	}
	return string(b), nil
}
