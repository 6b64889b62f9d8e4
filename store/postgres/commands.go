package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"nymph/store"
)

// Enqueue implements store.Commands.
func (db *DB) Enqueue(ctx context.Context, c store.NewCommand, e *store.NewExec) (store.Command, error) {
	out := store.Command{ID: c.ID, WorkerID: c.WorkerID, Kind: c.Kind, Body: c.Body, CreatedAt: fromMs(ms(c.Now))}
	var hib *int64
	if c.Kind == store.KindHibernate && c.HibernateUntil != nil {
		hib = msPtr(c.HibernateUntil)
	}
	err := db.tx(ctx, func(tx querier) error {
		// The increment takes the worker's row lock: concurrent enqueues on
		// any replica get consecutive sequence numbers.
		err := tx.QueryRow(ctx, `UPDATE workers SET last_seq = last_seq + 1,
			state = CASE WHEN $1::text = 'setup' AND state IN ('active', 'joining') THEN 'setting_up' ELSE state END,
			hibernating_until = COALESCE($2::bigint, hibernating_until)
			WHERE id = $3 RETURNING last_seq`, c.Kind, hib, c.WorkerID).Scan(&out.Seq)
		if errors.Is(err, pgx.ErrNoRows) {
			return notFound("worker", c.WorkerID)
		}
		if err != nil {
			return fmt.Errorf("bump seq: %w", err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO commands (id, worker_id, seq, kind, body, created_at) VALUES ($1, $2, $3, $4, $5, $6)`,
			c.ID, c.WorkerID, out.Seq, c.Kind, nonNilBytes(c.Body), ms(c.Now)); err != nil {
			return fmt.Errorf("insert command: %w", err)
		}
		if e != nil {
			if _, err := tx.Exec(ctx, `INSERT INTO execs (id, namespace, worker_id, command_id, command, stream, state, created_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`, e.ID, e.Namespace, c.WorkerID, c.ID, e.Command, e.Stream, store.ExecQueued, ms(c.Now)); err != nil {
				return fmt.Errorf("insert exec: %w", err)
			}
		}
		return nil
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
		if err := lockWorker(ctx, tx, workerID); err != nil {
			return err
		}
		// FOR UPDATE: a cancel withdrawing one of these commands either
		// happens before (and the row is gone) or waits and then finds it
		// delivered; it never withdraws a command this take hands out.
		rows, err := tx.Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
			WHERE worker_id = $1 AND acked_at IS NULL AND seq > $2 ORDER BY seq LIMIT $3 FOR UPDATE`, workerID, after, limit)
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
		if len(out) == 0 {
			return nil
		}
		first, last := out[0].Seq, out[len(out)-1].Seq
		var acked *int64
		if ackNow {
			v := ms(now)
			acked = &v
		}
		if _, err := tx.Exec(ctx, `UPDATE commands SET delivered_at = COALESCE(delivered_at, $1), acked_at = COALESCE($2::bigint, acked_at)
			WHERE worker_id = $3 AND seq BETWEEN $4 AND $5 AND acked_at IS NULL`, ms(now), acked, workerID, first, last); err != nil {
			return fmt.Errorf("mark delivered: %w", err)
		}
		if _, err := tx.Exec(ctx, `UPDATE workers SET delivered_seq = $1 WHERE id = $2 AND delivered_seq < $1`, last, workerID); err != nil {
			return fmt.Errorf("bump delivered seq: %w", err)
		}
		if ackNow {
			if _, err := tx.Exec(ctx, `UPDATE workers SET acked_seq = $1 WHERE id = $2 AND acked_seq < $1`, last, workerID); err != nil {
				return fmt.Errorf("bump acked seq: %w", err)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE execs SET state = $1, started_at = $2 WHERE state = $3 AND command_id IN
			(SELECT id FROM commands WHERE worker_id = $4 AND seq BETWEEN $5 AND $6 AND kind = 'exec')`,
			store.ExecRunning, ms(now), store.ExecQueued, workerID, first, last); err != nil {
			return fmt.Errorf("mark execs running: %w", err)
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

// ListCommands implements store.Commands.
func (db *DB) ListCommands(ctx context.Context, workerID string) ([]store.Command, error) {
	rows, err := db.q.Query(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
		WHERE worker_id = $1 ORDER BY seq`, workerID)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	out, err := scanCommands(rows)
	if err != nil {
		return nil, fmt.Errorf("list commands: %w", err)
	}
	return out, nil
}

func scanCommands(rows pgx.Rows) ([]store.Command, error) {
	defer rows.Close()
	out := []store.Command{}
	for rows.Next() {
		var (
			c          store.Command
			created    int64
			deliv, ack *int64
		)
		if err := rows.Scan(&c.ID, &c.WorkerID, &c.Seq, &c.Kind, &c.Body, &created, &deliv, &ack); err != nil {
			return nil, err
		}
		c.CreatedAt, c.DeliveredAt, c.AckedAt = fromMs(created), fromNullMs(deliv), fromNullMs(ack)
		out = append(out, c)
	}
	return out, rows.Err()
}
