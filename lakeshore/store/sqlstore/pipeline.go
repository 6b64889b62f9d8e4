package sqlstore

import (
	"context"
	"fmt"
)

// Pipelining. On a networked server every statement of a transaction is a
// round trip, and between two of them the transaction sits open, holding
// its connection and its row locks, until the caller is scheduled again to
// send the next: on a busy machine that wait, not the statements, is what
// a transaction costs (PostgreSQL shows such connections "idle in
// transaction"). Statements whose results nothing reads but their errors
// need not wait for one another: execAll sends them together, and
// execLast sends a transaction's last ones with its commit. An engine
// whose Tx cannot pipeline (SQLite, database/sql) runs them one by one, as
// it would have anyway.

// Stmt is one statement of a pipeline, ? placeholders rebound by the
// dialect; What names it in the error it fails with.
type Stmt struct {
	Query string
	Args  []any
	What  string
}

// Pipeliner is a Tx that can pipeline (see Dialect.RunTx).
type Pipeliner interface {
	// ExecAll runs stmts in order in one round trip. The first to fail
	// ends it: its error is returned (wrapped with its What), and the
	// transaction can only roll back.
	ExecAll(ctx context.Context, stmts []Stmt) error
	// ExecAtCommit queues stmts to run in order just before the commit,
	// in the same round trip; the first to fail rolls the transaction
	// back and is what its commit returns.
	ExecAtCommit(stmts []Stmt)
}

// stmt is a Stmt written with ? placeholders.
func stmt(what, query string, args ...any) Stmt { return Stmt{Query: query, Args: args, What: what} }

func (q querier) rebindAll(stmts []Stmt) []Stmt {
	out := make([]Stmt, len(stmts))
	for i, s := range stmts {
		out[i] = Stmt{Query: q.d.rebind(s.Query), Args: s.Args, What: s.What}
	}
	return out
}

// execAll runs stmts in order, in one round trip where the engine
// pipelines.
func (q querier) execAll(ctx context.Context, stmts ...Stmt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p, ok := q.c.(Pipeliner); ok {
		sctx, cancel := q.statementContext(ctx)
		defer cancel()
		done := q.hook.begin(pipelineOp)
		err := p.ExecAll(sctx, q.rebindAll(stmts))
		if done != nil {
			done(err != nil)
		}
		return err
	}
	return q.oneByOne(ctx, stmts)
}

// execLast runs stmts as the last of the transaction q is in: where the
// engine pipelines they go with its commit, and their failure is the
// commit's; elsewhere they run now. Nothing may run on q after them.
func (q querier) execLast(ctx context.Context, stmts ...Stmt) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p, ok := q.c.(Pipeliner); ok && q.tctx != nil {
		p.ExecAtCommit(q.rebindAll(stmts))
		return nil
	}
	return q.oneByOne(ctx, stmts)
}

func (q querier) oneByOne(ctx context.Context, stmts []Stmt) error {
	for _, s := range stmts {
		if _, err := q.Exec(ctx, s.Query, s.Args...); err != nil {
			return fmt.Errorf("%s: %w", s.What, err)
		}
	}
	return nil
}
