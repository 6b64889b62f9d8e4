package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
)

// Group commit, for an engine with one writer (Dialect.GroupCommit): the
// write transactions callers ask for while one runs wait in a queue, and
// the next goes through all of them (up to groupMax) in one transaction,
// each inside a savepoint of its own. A caller whose work fails is rolled
// back to its savepoint and told; the others commit. On SQLite a commit
// (its WAL frames, the pages every write touches again: a worker's row,
// the tail of the commands table) costs as much as the statements of a
// small transaction, and a fleet's polls, results and queued execs come
// in many at once, so sharing it is the cheapest write there is.
//
// Each caller still sees its own work committed, or not at all, before
// it returns: it waits for the commit of the transaction that holds it.
// A caller whose ctx ends before its turn is skipped; once its work has
// begun it waits for the outcome (that transaction's commit), since
// cancelling a statement would roll back the whole shared transaction.
const groupMax = 64

type groupCommit struct {
	db *DB

	mu      sync.Mutex
	queue   []*groupWrite
	running bool

	// commits counts the transactions run, callers the work they held.
	commits, callers atomic.Int64
}

type groupWrite struct {
	ctx  context.Context
	fn   func(querier) error
	err  error
	done chan struct{}
}

// run queues fn and returns its outcome once the transaction holding it
// committed or rolled back.
func (g *groupCommit) run(ctx context.Context, fn func(querier) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w := &groupWrite{ctx: ctx, fn: fn, done: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	start := !g.running
	g.running = true
	g.mu.Unlock()
	if start {
		go g.drain()
	}
	<-w.done
	return w.err
}

// drain commits the queue, batch after batch, until it is empty.
func (g *groupCommit) drain() {
	for {
		g.mu.Lock()
		n := min(len(g.queue), groupMax)
		if n == 0 {
			g.running = false
			g.queue = nil
			g.mu.Unlock()
			return
		}
		batch := slices.Clone(g.queue[:n])
		g.queue = g.queue[n:]
		g.mu.Unlock()
		g.commit(batch)
	}
}

func (g *groupCommit) commit(batch []*groupWrite) {
	live := batch[:0:0]
	for _, w := range batch {
		if err := w.ctx.Err(); err != nil {
			w.err = err
			close(w.done)
			continue
		}
		live = append(live, w)
	}
	switch len(live) {
	case 0:
		return
	case 1:
		// Alone: its own transaction, as without group commit.
		w := live[0]
		g.commits.Add(1)
		g.callers.Add(1)
		w.err = g.db.tryTx(w.ctx, g.db.w, g.db.d.WriteTx, w.fn)
		close(w.done)
		return
	}
	g.commits.Add(1)
	g.callers.Add(int64(len(live)))
	applied, err := g.shared(live)
	for _, w := range live {
		if w.err == nil && err != nil && slices.Contains(applied, w) {
			w.err = err
		}
		close(w.done)
	}
}

// shared runs live in one transaction and returns those whose work it
// kept; err is why that transaction did not commit (then none was kept,
// and every caller not told otherwise gets err).
func (g *groupCommit) shared(live []*groupWrite) (applied []*groupWrite, err error) {
	db := g.db
	// The transaction is on no caller's context: one caller going away
	// must not interrupt (and roll back) the others' work.
	tx, err := db.w.BeginTx(context.Background(), db.d.WriteTx)
	if err != nil {
		err = fmt.Errorf("begin: %w", err)
		for _, w := range live {
			w.err = err
		}
		return nil, err
	}
	var c Tx = sqlConn{tx}
	var st *txStmts
	if cache := db.cacheOf(db.w); cache != nil {
		st = &txStmts{tx: tx, cache: cache}
		c = st
	}
	broken := func(cause error) ([]*groupWrite, error) {
		_ = tx.Rollback()
		for _, w := range live {
			if w.err == nil {
				w.err = cause
			}
		}
		return nil, cause
	}
	for _, w := range live {
		if _, err := c.Exec(context.Background(), `SAVEPOINT groupwrite`); err != nil {
			return broken(fmt.Errorf("savepoint: %w", err))
		}
		err := w.fn(querier{c: c, d: db.d, tctx: context.WithoutCancel(w.ctx)})
		if err == nil {
			err = w.ctx.Err()
		}
		if err != nil {
			w.err = err
			if _, rerr := c.Exec(context.Background(), `ROLLBACK TO groupwrite`); rerr != nil {
				return broken(errors.Join(err, fmt.Errorf("roll back to savepoint: %w", rerr)))
			}
		}
		if _, rerr := c.Exec(context.Background(), `RELEASE groupwrite`); rerr != nil {
			return broken(fmt.Errorf("release savepoint: %w", rerr))
		}
		if err == nil {
			applied = append(applied, w)
		}
	}
	if err := tx.Commit(); err != nil {
		return applied, fmt.Errorf("commit: %w", err)
	}
	if st != nil {
		st.prepareMissed(context.Background())
	}
	return applied, nil
}
