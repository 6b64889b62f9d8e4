package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/store"
)

// Enqueue implements store.Commands.
func (db *DB) Enqueue(ctx context.Context, c store.NewCommand, e *store.NewExec) (store.Command, error) {
	out := store.Command{ID: c.ID, WorkerID: c.WorkerID, Kind: c.Kind, Body: c.Body, CreatedAt: fromMs(ms(c.Now))}
	err := db.tx(ctx, func(tx *sql.Tx) error {
		var last int64
		err := tx.QueryRowContext(ctx, `SELECT last_seq FROM workers WHERE id = ?`, c.WorkerID).Scan(&last)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", c.WorkerID)
		}
		if err != nil {
			return fmt.Errorf("read worker: %w", err)
		}
		out.Seq = last + 1
		var hib any
		if c.Kind == store.KindHibernate && c.HibernateUntil != nil {
			hib = ms(*c.HibernateUntil)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE workers SET last_seq = ?,
			state = CASE WHEN ? = 'setup' AND state IN ('active', 'joining') THEN 'setting_up' ELSE state END,
			hibernating_until = COALESCE(?, hibernating_until)
			WHERE id = ?`, out.Seq, c.Kind, hib, c.WorkerID); err != nil {
			return fmt.Errorf("bump seq: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO commands (id, worker_id, seq, kind, body, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			c.ID, c.WorkerID, out.Seq, c.Kind, nonNilBytes(c.Body), ms(c.Now)); err != nil {
			return fmt.Errorf("insert command: %w", err)
		}
		if e != nil {
			if _, err := tx.ExecContext(ctx, `INSERT INTO execs (id, namespace, worker_id, command_id, command, stream, state, created_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, e.ID, e.Namespace, c.WorkerID, c.ID, e.Command, boolInt(e.Stream), store.ExecQueued, ms(c.Now)); err != nil {
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
	err := db.tx(ctx, func(tx *sql.Tx) error {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM workers WHERE id = ?`, workerID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return notFound("worker", workerID)
		}
		if err != nil {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
			WHERE worker_id = ? AND acked_at IS NULL AND seq > ? ORDER BY seq LIMIT ?`, workerID, after, limit)
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
		acked := any(nil)
		if ackNow {
			acked = ms(now)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE commands SET delivered_at = COALESCE(delivered_at, ?), acked_at = COALESCE(?, acked_at)
			WHERE worker_id = ? AND seq BETWEEN ? AND ? AND acked_at IS NULL`, ms(now), acked, workerID, first, last); err != nil {
			return fmt.Errorf("mark delivered: %w", err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE workers SET delivered_seq = ? WHERE id = ? AND delivered_seq < ?`,
			last, workerID, last); err != nil {
			return fmt.Errorf("bump delivered seq: %w", err)
		}
		if ackNow {
			if _, err := tx.ExecContext(ctx, `UPDATE workers SET acked_seq = ? WHERE id = ? AND acked_seq < ?`,
				last, workerID, last); err != nil {
				return fmt.Errorf("bump acked seq: %w", err)
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE execs SET state = ?, started_at = ? WHERE state = ? AND command_id IN
			(SELECT id FROM commands WHERE worker_id = ? AND seq BETWEEN ? AND ? AND kind = 'exec')`,
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
	rows, err := db.r.QueryContext(ctx, `SELECT id, worker_id, seq, kind, body, created_at, delivered_at, acked_at FROM commands
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

func scanCommands(rows *sql.Rows) ([]store.Command, error) {
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

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
