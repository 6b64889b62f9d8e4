package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// Enqueue implements store.Commands.
func (db *DB) Enqueue(ctx context.Context, c store.NewCommand, e *store.NewExec) (store.Command, error) {
	out := store.Command{ID: c.ID, WorkerID: c.WorkerID, Kind: c.Kind, Body: c.Body, CreatedAt: fromMs(ms(c.Now))}
	var hib any
	wake := false
	if c.Kind == store.KindHibernate && c.HibernateUntil != nil {
		hib = msPtr(c.HibernateUntil)
		wake = !c.HibernateUntil.After(c.Now)
	}
	err := db.tx(ctx, func(tx querier) error {
		if wake {
			// A wake supersedes the hibernates not yet delivered: the
			// daemon is wanted awake, not asleep again after this one.
			if _, err := tx.Exec(ctx, `DELETE FROM commands WHERE worker_id = ? AND kind = ? AND delivered_at IS NULL AND acked_at IS NULL`,
				c.WorkerID, store.KindHibernate); err != nil {
				return fmt.Errorf("withdraw queued hibernates: %w", err)
			}
			ends, err := hibernationDelivered(ctx, tx, c.WorkerID, c.Now)
			if err != nil {
				return err
			}
			out.Ends = ends
		}
		// The increment takes the worker's row lock: concurrent enqueues on
		// any replica get consecutive sequence numbers. A hibernate shows
		// at once on a worker that is awake; one queued behind the
		// hibernation in force shows when it is delivered (Take).
		var (
			seen      int64
			until     sql.NullInt64
			delivered int64
			single    bool
			jobSeq    int64
		)
		// A delivery along (DeliverAfter) moves delivered_seq with
		// last_seq when the poll had everything before: SET sees the row
		// as it was.
		deliver, after := int64(0), int64(-1)
		if c.DeliverAfter != nil && c.Kind == store.KindExec {
			deliver, after = 1, *c.DeliverAfter
		}
		err := tx.QueryRow(ctx, `UPDATE workers SET last_seq = last_seq + 1,
			delivered_seq = CASE WHEN CAST(? AS BIGINT) = 1 AND delivered_seq = last_seq AND delivered_seq = ? AND NOT single_job
				THEN last_seq + 1 ELSE delivered_seq END,
			state = CASE WHEN CAST(? AS TEXT) = 'setup' AND state IN ('active', 'joining') THEN 'setting_up' ELSE state END,
			hibernating_until = CASE WHEN hibernating_until IS NULL OR hibernating_until <= ?
				THEN COALESCE(CAST(? AS BIGINT), hibernating_until) ELSE hibernating_until END
			WHERE id = ? AND (CAST(? AS TEXT) = '' OR namespace = ?)
			RETURNING last_seq, delivered_seq, namespace, label, state, last_seen_at, hibernating_until, single_job, job_seq`,
			deliver, after, c.Kind, ms(c.Now), hib, c.WorkerID, c.Namespace, c.Namespace).Scan(&out.Seq, &delivered,
			&out.Worker.Namespace, &out.Worker.Label, &out.Worker.State, &seen, &until, &single, &jobSeq)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", c.WorkerID)
		}
		if err != nil {
			return fmt.Errorf("bump seq: %w", err)
		}
		if single && store.IsJob(c.Kind) {
			// Under the row lock the increment took: of two jobs racing
			// for a single-job worker, one is refused, and its
			// transaction, increment included, rolls back. Other
			// workers pay for no read of their own.
			held, err := heldJob(ctx, tx, c.WorkerID, jobSeq)
			if err != nil {
				return err
			}
			if held != nil {
				return held
			}
		}
		out.Worker.LastSeenAt, out.Worker.HibernatingUntil = fromMs(seen), fromNullMs(until)
		var deliveredAt any
		execState := operatorapi.ExecQueued
		if deliver == 1 && delivered == out.Seq {
			t := fromMs(ms(c.Now))
			out.DeliveredAt, deliveredAt, execState = &t, ms(c.Now), operatorapi.ExecRunning
		}
		stmts := []Stmt{stmt("insert command", `INSERT INTO commands (id, worker_id, seq, kind, body, created_at, delivered_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			c.ID, c.WorkerID, out.Seq, c.Kind, nonNilBytes(c.Body), ms(c.Now), deliveredAt)}
		if e != nil {
			stmts = append(stmts, stmt("insert exec", `INSERT INTO execs (id, namespace, worker_id, command_id, command, stream, state, created_at, started_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, e.ID, e.Namespace, c.WorkerID, c.ID, e.Command, e.Stream, execState, ms(c.Now), deliveredAt))
		}
		return tx.execLast(ctx, stmts...)
	})
	if err != nil {
		return store.Command{}, fmt.Errorf("enqueue %s: %w", c.Kind, err)
	}
	return out, nil
}

// Take implements store.Commands.
func (db *DB) Take(ctx context.Context, workerID string, after int64, limit int, ackNow bool, now time.Time) ([]store.Command, error) {
	var out []store.Command
	err := db.tx(ctx, func(tx querier) error {
		var (
			single bool
			jobSeq int64
		)
		err := tx.QueryRow(ctx, `SELECT single_job, job_seq FROM workers WHERE id = ?`+tx.d.ForUpdate, workerID).Scan(&single, &jobSeq)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", workerID)
		}
		if err != nil {
			return fmt.Errorf("lock worker %s: %w", workerID, err)
		}
		// FOR UPDATE: a cancel withdrawing one of these commands either
		// happens before (and the row is gone) or waits and then finds it
		// delivered; it never withdraws a command this take hands out.
		rows, err := tx.Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
			WHERE worker_id = ? AND acked_at IS NULL AND seq > ? ORDER BY seq LIMIT ?`+tx.d.ForUpdate, workerID, after, limit)
		if err != nil {
			return err
		}
		out, err = scanCommands(rows)
		if err != nil {
			return err
		}
		for i, c := range out {
			if c.Kind == store.KindHibernate {
				out = out[:i+1]
				break
			}
		}
		if single {
			var took int64
			out, took = oneJob(out, jobSeq)
			if took != jobSeq {
				if _, err := tx.Exec(ctx, `UPDATE workers SET job_seq = ? WHERE id = ?`, took, workerID); err != nil {
					return fmt.Errorf("record single job: %w", err)
				}
			}
		}
		if len(out) == 0 {
			return nil
		}
		first, last := out[0].Seq, out[len(out)-1].Seq
		if end := out[len(out)-1]; end.Kind == store.KindHibernate {
			if err := hibernationInForce(ctx, tx, workerID, end, now); err != nil {
				return err
			}
		}
		var acked any
		if ackNow {
			acked = ms(now)
		}
		// Acknowledged now, they were received by the worker's current
		// process (legacy daemons name none: '').
		stmts := []Stmt{
			stmt("mark delivered", `UPDATE commands SET delivered_at = COALESCE(delivered_at, ?), acked_at = COALESCE(CAST(? AS BIGINT), acked_at),
			acked_by = CASE WHEN CAST(? AS BIGINT) IS NULL THEN acked_by ELSE (SELECT w.incarnation FROM workers w WHERE w.id = commands.worker_id) END
			WHERE worker_id = ? AND seq BETWEEN ? AND ? AND acked_at IS NULL`, ms(now), acked, acked, workerID, first, last),
			stmt("bump delivered seq", `UPDATE workers SET delivered_seq = ? WHERE id = ? AND delivered_seq < ?`, last, workerID, last),
		}
		if ackNow {
			stmts = append(stmts, stmt("bump acked seq", `UPDATE workers SET acked_seq = ? WHERE id = ? AND acked_seq < ?`, last, workerID, last))
		}
		stmts = append(stmts, stmt("mark execs running", `UPDATE execs SET state = ?, started_at = ? WHERE state = ? AND command_id IN
			(SELECT id FROM commands WHERE worker_id = ? AND seq BETWEEN ? AND ? AND kind = 'exec')`,
			operatorapi.ExecRunning, ms(now), operatorapi.ExecQueued, workerID, first, last))
		if err := tx.execLast(ctx, stmts...); err != nil {
			return err
		}
		t := fromMs(ms(now))
		for i := range out {
			if out[i].DeliveredAt == nil {
				out[i].DeliveredAt = &t
			}
			if ackNow {
				out[i].AckedAt = &t
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("take commands of %s: %w", workerID, err)
	}
	return out, nil
}

// hibernationInForce records the deadline of the hibernate being
// delivered as the worker's: the one it serves from now on (none for a
// wake, whose deadline has passed). A body that does not decode leaves the
// worker as it is; the daemon skips such a command.
func hibernationInForce(ctx context.Context, tx querier, workerID string, c store.Command, now time.Time) error {
	until, ok := hibernateDeadline(c.Body)
	if !ok {
		return nil
	}
	var v any
	if until.After(now) {
		v = ms(until)
	}
	if _, err := tx.Exec(ctx, `UPDATE workers SET hibernating_until = CAST(? AS BIGINT) WHERE id = ?`, v, workerID); err != nil {
		return fmt.Errorf("record the hibernation in force: %w", err)
	}
	return nil
}

// hibernationDelivered makes a worker's HibernatingUntil that of the last
// hibernate it was delivered, when that is still running: a withdrawn
// hibernate, recorded when it was queued, is not in force. It only ever
// shortens (a hello cleared what the daemon forgot by restarting).
// It returns the deadline in force, if any.
func hibernationDelivered(ctx context.Context, tx querier, workerID string, now time.Time) (*time.Time, error) {
	rows, err := tx.Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
		WHERE worker_id = ? AND kind = ? AND delivered_at IS NOT NULL ORDER BY seq DESC LIMIT 1`, workerID, store.KindHibernate)
	if err != nil {
		return nil, fmt.Errorf("last delivered hibernate: %w", err)
	}
	last, err := scanCommands(rows)
	if err != nil {
		return nil, fmt.Errorf("last delivered hibernate: %w", err)
	}
	var v any
	if len(last) == 1 {
		if until, ok := hibernateDeadline(last[0].Body); ok && until.After(now) {
			v = ms(until)
		}
	}
	var in sql.NullInt64
	if err := tx.QueryRow(ctx, `UPDATE workers SET hibernating_until = CASE
		WHEN hibernating_until IS NULL OR CAST(? AS BIGINT) IS NULL THEN NULL
		WHEN hibernating_until < CAST(? AS BIGINT) THEN hibernating_until ELSE CAST(? AS BIGINT) END WHERE id = ?
		RETURNING hibernating_until`, v, v, v, workerID).Scan(&in); err != nil && !errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("record the hibernation in force: %w", err)
	}
	if until := fromNullMs(in); until != nil && until.After(now) {
		return until, nil
	}
	return nil, nil
}

// hibernateDeadline decodes a hibernate command's deadline.
func hibernateDeadline(body []byte) (time.Time, bool) {
	h, ok := messages.DecodeCommand(messages.Command{Kind: messages.KindHibernate, Body: body}).(*messages.Hibernate)
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(int64(h.UntilEpochS), 0).UTC(), true
}

// WakePending implements store.Commands.
func (db *DB) WakePending(ctx context.Context, workerID string, after int64) (bool, error) {
	rows, err := db.reader().Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
		WHERE worker_id = ? AND kind = ? AND acked_at IS NULL AND seq > ? ORDER BY seq`, workerID, store.KindHibernate, after)
	if err != nil {
		return false, fmt.Errorf("look for a wake of %s: %w", workerID, err)
	}
	cmds, err := scanCommands(rows)
	if err != nil {
		return false, fmt.Errorf("look for a wake of %s: %w", workerID, err)
	}
	for _, c := range cmds {
		// The deadline is whole seconds; a wake's is its enqueue time
		// rounded down, a hibernate's is later than its enqueue time.
		if until, ok := hibernateDeadline(c.Body); ok && !until.After(c.CreatedAt) {
			return true, nil
		}
	}
	return false, nil
}

// oneJob cuts a single-job worker's batch before any job command but its
// one job, jobSeq (0: it has none yet, and the first one in the batch
// becomes it). It returns the batch and the job's seq.
func oneJob(cmds []store.Command, jobSeq int64) ([]store.Command, int64) {
	for i, c := range cmds {
		if !store.IsJob(c.Kind) {
			continue
		}
		switch jobSeq {
		case 0:
			jobSeq = c.Seq
		case c.Seq:
		default:
			return cmds[:i], jobSeq
		}
	}
	return cmds, jobSeq
}

// ListCommands implements store.Commands.
func (db *DB) ListCommands(ctx context.Context, workerID string) ([]store.Command, error) {
	rows, err := db.reader().Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
		WHERE worker_id = ? ORDER BY seq`, workerID)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	out, err := scanCommands(rows)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	return out, nil
}

// Command implements store.Commands.
func (db *DB) Command(ctx context.Context, id string) (store.Command, error) {
	rows, err := db.reader().Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
		WHERE id = ?`, id)
	if err != nil {
		return store.Command{}, fmt.Errorf("read command %s: %w", id, err)
	}
	out, err := scanCommands(rows)
	if err != nil {
		return store.Command{}, fmt.Errorf("read command %s: %w", id, err)
	}
	if len(out) == 0 {
		return store.Command{}, notFound("command", id)
	}
	return out[0], nil
}

func scanCommands(rows *rows) ([]store.Command, error) {
	defer rows.Close()
	out := []store.Command{}
	for rows.Next() {
		var (
			c          store.Command
			created    int64
			deliv, ack sql.NullInt64
		)
		if err := rows.Scan(&c.ID, &c.WorkerID, &c.Seq, &c.Kind, &c.Body, &created, &deliv, &ack); err != nil {
			return nil, err
		}
		c.CreatedAt, c.DeliveredAt, c.AckedAt = fromMs(created), fromNullMs(deliv), fromNullMs(ack)
		out = append(out, c)
	}
	return out, rows.Err()
}
