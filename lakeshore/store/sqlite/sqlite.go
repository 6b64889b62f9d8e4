// Package sqlite is the embedded implementation of store.Store: one SQLite
// file (pure Go driver, WAL journal, busy timeout) with its schema applied
// from embedded migrations on open.
//
// Writes go through a pool of exactly one connection, so transactions never
// contend for SQLite's single write lock and never see SQLITE_BUSY from a
// lock upgrade; reads use a separate small pool, which WAL lets run beside
// the writer. The write transactions that wait while one runs share
// the next (group commit, each in a savepoint of its own), and every
// statement is prepared once per connection. synchronous=NORMAL keeps every committed transaction across a
// crash or SIGKILL of the process; only a power loss can lose the last ones.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"modernc.org/sqlite" // registers the "sqlite" driver

	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlstore"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is a store.Store on one SQLite file.
type DB struct {
	*sqlstore.DB
	w    *sql.DB // the writer, which sqlstore.DB owns
	ckpt *checkpointer
}

var _ store.Store = (*DB)(nil)

// Options tune OpenWith.
type Options struct {
	// Log receives what the store says of itself (a failed checkpoint).
	Log zerolog.Logger
}

// Open opens (creating if needed) the database at path and migrates it.
func Open(ctx context.Context, path string) (*DB, error) {
	return OpenWith(ctx, path, Options{Log: zerolog.Nop()})
}

// OpenWith is Open with options.
func OpenWith(ctx context.Context, path string, o Options) (*DB, error) {
	return openWith(ctx, path, o, checkpointTuning{commits: checkpointCommits, restart: restartFrames})
}

// checkpointTuning is what tests change of the checkpointer.
type checkpointTuning struct {
	// commits and restart are checkpointCommits and restartFrames.
	commits int64
	restart int
	// observe, when set, is told the log's frames and how many of them
	// each checkpoint moved.
	observe func(frames, moved int)
}

func openWith(ctx context.Context, path string, o Options, tune checkpointTuning) (*DB, error) {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(NORMAL)")
	q.Add("_pragma", "foreign_keys(ON)")
	// The checkpointer moves the log, off the commits (checkpoint.go).
	q.Add("_pragma", "wal_autocheckpoint(0)")
	// A log that grew in a burst is cut back when it starts over, instead
	// of keeping its largest size on disk.
	q.Add("_pragma", "journal_size_limit(67108864)")
	w, err := sql.Open("sqlite", path+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	ms, err := migrate(ctx, w)
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, err)
	}
	rq := url.Values{}
	rq.Add("_pragma", "busy_timeout(10000)")
	rq.Add("_pragma", "query_only(1)")
	r, err := sql.Open("sqlite", path+"?"+rq.Encode())
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s for reading: %w", path, err)
	}
	// Every reader stays open: each connection keeps the statements
	// prepared on it, which a connection closed when idle would take along.
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	cq := url.Values{}
	cq.Add("_pragma", "busy_timeout(10000)")
	c, err := sql.Open("sqlite", path+"?"+cq.Encode())
	if err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("open %s for checkpoints: %w", path, err)
	}
	c.SetMaxOpenConns(1)
	c.SetMaxIdleConns(1)
	c.SetConnMaxLifetime(0)
	c.SetConnMaxIdleTime(0)
	ckpt := newCheckpointer(c, w, o.Log, tune)
	d := dialect(ms)
	d.Committed = ckpt.kick
	return &DB{DB: sqlstore.New(w, r, d), w: w, ckpt: ckpt}, nil
}

// Close stops the checkpoints, then closes the store: the last
// connection closed moves what is left of the log.
func (db *DB) Close() error {
	return errors.Join(db.ckpt.stop(), db.DB.Close())
}

// readers is the size of the read pool.
const readers = 4

// dialect is SQLite's: the zero value (one writer, no row locks, no
// retries, statements on the caller's context), plus its error codes, the
// migrations ms it applied, and statements prepared once per connection:
// parsing them again on every run was most of an empty poll's cost.
func dialect(ms []sqlstore.Migration) sqlstore.Dialect {
	return sqlstore.Dialect{IsPrimaryKeyViolation: isPrimaryKeyViolation, Migrations: ms, PrepareStatements: true, GroupCommit: true}
}

// sqliteConstraintPrimaryKey is SQLITE_CONSTRAINT_PRIMARYKEY.
const sqliteConstraintPrimaryKey = 1555

func isPrimaryKeyViolation(err error, table string) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqliteConstraintPrimaryKey && strings.Contains(se.Error(), " "+table+".")
}

// migrate applies the embedded migrations not applied yet and returns
// them all.
func migrate(ctx context.Context, db *sql.DB) ([]sqlstore.Migration, error) {
	if _, err := db.ExecContext(ctx, sqlstore.CreateMigrationsTable); err != nil {
		return nil, err
	}
	ms, err := sqlstore.Migrations(migrations)
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if err := applyMigration(ctx, db, m); err != nil {
			return nil, err
		}
	}
	return ms, nil
}

func applyMigration(ctx context.Context, db *sql.DB, m sqlstore.Migration) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, m.Version).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, m.SQL); err != nil {
		return fmt.Errorf("migration %s: %w", m.Name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)`, m.Version, time.Now().UnixMilli()); err != nil {
		return err
	}
	return tx.Commit()
}
