package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"sync"
)

// maxCachedStatements bounds a pool's prepared statements. The store's
// queries are constants but for a few built with lists of varying length
// (IN lists, multi-row inserts); once the cache is full, a query not in it
// runs unprepared, as every query did before: nothing is evicted, so no
// statement is closed under a caller.
const maxCachedStatements = 256

// stmtCache holds one *sql.Stmt per query text for a pool. database/sql
// prepares a Stmt lazily on each connection it runs on and keeps it there,
// so each query is parsed once per connection instead of on every run
// (the SQLite driver keeps a prepared single statement and resets it
// between runs). A *sql.Stmt is safe for concurrent use; the cache adds
// only a read-mostly map.
type stmtCache struct {
	pool *sql.DB
	m    sync.Map // query text -> *sql.Stmt

	mu     sync.Mutex // serialises additions and close
	n      int
	closed bool
}

func newStmtCache(pool *sql.DB) *stmtCache { return &stmtCache{pool: pool} }

// lookup returns query's statement, nil when it was never prepared.
func (c *stmtCache) lookup(query string) *sql.Stmt {
	if st, ok := c.m.Load(query); ok {
		return st.(*sql.Stmt)
	}
	return nil
}

// get returns query's statement, preparing it on the pool when it is new;
// nil when the cache is full or closed, and the query is to run
// unprepared. It takes a connection of the pool to prepare on: never call
// it inside a transaction on the same pool (the writer has only one).
func (c *stmtCache) get(ctx context.Context, query string) (*sql.Stmt, error) {
	if st := c.lookup(query); st != nil {
		return st, nil
	}
	if !c.room() {
		return nil, nil
	}
	st, err := c.pool.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	return c.add(query, st), nil
}

// room reports whether a new statement may still be added.
func (c *stmtCache) room() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.closed && c.n < maxCachedStatements
}

// add keeps st as query's statement and returns it, or the one another
// caller added first (closing st); nil, with st closed, when there is no
// room any more.
func (c *stmtCache) add(query string, st *sql.Stmt) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if had, ok := c.m.Load(query); ok {
		st.Close()
		return had.(*sql.Stmt)
	}
	if c.closed || c.n >= maxCachedStatements {
		st.Close()
		return nil
	}
	c.m.Store(query, st)
	c.n++
	return st
}

// close closes every statement; queries from then on run unprepared
// (and fail on the closed pool).
func (c *stmtCache) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	c.m.Range(func(k, v any) bool {
		errs = append(errs, v.(*sql.Stmt).Close())
		c.m.Delete(k)
		return true
	})
	c.n = 0
	return errors.Join(errs...)
}

// stmtPool runs statements on a pool, prepared.
type stmtPool struct{ c *stmtCache }

func (p stmtPool) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	st, err := p.c.get(ctx, query)
	if err != nil {
		return 0, err
	}
	if st == nil {
		return sqlConn{p.c.pool}.Exec(ctx, query, args...)
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (p stmtPool) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	st, err := p.c.get(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return sqlConn{p.c.pool}.Query(ctx, query, args...)
	}
	rs, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// txStmts runs a transaction's statements through the pool's prepared
// ones: tx.StmtContext reuses a statement already prepared on the
// transaction's connection. A query the cache lacks runs unprepared and
// is prepared once the transaction is over (see prepareMissed), since
// preparing on the pool would wait for the connection the transaction
// holds. A transaction runs its statements one after another, from one
// goroutine, so this needs no lock.
type txStmts struct {
	tx    *sql.Tx
	cache *stmtCache
	// bound are the transaction's handles on cached statements.
	bound map[string]*sql.Stmt
	// open are the queries whose rows are being read: one prepared
	// statement cannot run again before its rows are closed, so a query
	// run again meanwhile runs unprepared.
	open   []string
	missed []string
}

// stmt is query's statement bound to the transaction, nil when it is to
// run unprepared.
func (t *txStmts) stmt(ctx context.Context, query string) *sql.Stmt {
	if slices.Contains(t.open, query) {
		return nil
	}
	if st, ok := t.bound[query]; ok {
		return st
	}
	st := t.cache.lookup(query)
	if st == nil {
		if !slices.Contains(t.missed, query) {
			t.missed = append(t.missed, query)
		}
		return nil
	}
	st = t.tx.StmtContext(ctx, st)
	if t.bound == nil {
		t.bound = make(map[string]*sql.Stmt)
	}
	t.bound[query] = st
	return st
}

func (t *txStmts) Exec(ctx context.Context, query string, args ...any) (int64, error) {
	st := t.stmt(ctx, query)
	if st == nil {
		return sqlConn{t.tx}.Exec(ctx, query, args...)
	}
	res, err := st.ExecContext(ctx, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (t *txStmts) Query(ctx context.Context, query string, args ...any) (Rows, error) {
	st := t.stmt(ctx, query)
	if st == nil {
		return sqlConn{t.tx}.Query(ctx, query, args...)
	}
	rs, err := st.QueryContext(ctx, args...)
	if err != nil {
		return nil, err
	}
	t.open = append(t.open, query)
	return &txRows{Rows: rs, t: t, query: query}, nil
}

// prepareMissed prepares on the pool the queries the transaction ran
// unprepared. A failure only leaves a query unprepared for next time.
func (t *txStmts) prepareMissed(ctx context.Context) {
	for _, q := range t.missed {
		_, _ = t.cache.get(ctx, q)
	}
}

// txRows gives its statement back to the transaction when closed.
type txRows struct {
	*sql.Rows
	t      *txStmts
	query  string
	closed bool
}

func (r *txRows) Close() error {
	err := r.Rows.Close()
	if !r.closed {
		r.closed = true
		if i := slices.Index(r.t.open, r.query); i >= 0 {
			r.t.open = slices.Delete(r.t.open, i, i+1)
		}
	}
	return err
}
