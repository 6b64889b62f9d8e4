package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"nymph/batch"
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
	q  *batch.Queue[*groupWrite]

	// commits counts the transactions run (tests see the sharing by it).
	commits atomic.Int64
}

type groupWrite struct {
	ctx  context.Context
	fn   func(querier) error
	err  error
	done chan struct{}
}

func newGroupCommit(db *DB) *groupCommit {
	g := &groupCommit{db: db}
	g.q = batch.New(groupMax, g.commit)
	return g
}

// run queues fn and returns its outcome once the transaction holding it
// committed or rolled back.
func (g *groupCommit) run(ctx context.Context, fn func(querier) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	w := &groupWrite{ctx: ctx, fn: fn, done: make(chan struct{})}
	g.q.Run(w)
	<-w.done
	return w.err
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
		w.err = g.db.tryTx(w.ctx, g.db.w, g.db.d.WriteTx, w.fn)
		close(w.done)
		return
	}
	g.commits.Add(1)
	err := g.shared(live)
	for _, w := range live {
		// Whose work the transaction kept (no error of its own) hears
		// why it did not commit, if it did not.
		if w.err == nil {
			w.err = err
		}
		close(w.done)
	}
}

// shared runs live in one transaction, each caller whose work failed told
// so in its err, and returns why the transaction did not commit (nil: it
// did).
func (g *groupCommit) shared(live []*groupWrite) error {
	db := g.db
	// The transaction is on no caller's context: one caller going away
	// must not interrupt (and roll back) the others' work.
	tx, err := db.w.BeginTx(context.Background(), db.d.WriteTx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	var c Tx = sqlConn{tx}
	var st *txStmts
	if cache := db.cacheOf(db.w); cache != nil {
		st = &txStmts{tx: tx, cache: cache}
		c = st
	}
	broken := func(cause error) error {
		_ = tx.Rollback()
		return cause
	}
	for _, w := range live {
		if _, err := c.Exec(context.Background(), `SAVEPOINT groupwrite`); err != nil {
			return broken(fmt.Errorf("savepoint: %w", err))
		}
		err := w.fn(querier{c: c, d: db.d, tctx: context.WithoutCancel(w.ctx), hook: db.hook})
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
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if st != nil {
		st.prepareMissed(context.Background())
	}
	return nil
}
