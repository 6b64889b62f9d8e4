package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"nymph/store"
)

// querier is what both *sql.DB and *sql.Tx offer for reads.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

const workerColumns = `w.id, w.namespace, w.machine_id, w.hello_label, w.label, w.state, w.tags, w.queues,
	w.capabilities, w.versions, w.poll_queue, w.running, w.created_at, w.last_seen_at, w.hibernating_until,
	w.last_seq, w.delivered_seq, w.acked_seq, w.queues_added, w.queues_removed,
	(SELECT COUNT(*) FROM commands c WHERE c.worker_id = w.id AND c.kind = 'setup' AND c.acked_at IS NULL)`

type rowScanner interface {
	Scan(dest ...any) error
}

func scanWorker(row rowScanner) (store.Worker, error) {
	var (
		w                                   store.Worker
		tags, queues, caps, versions, runng string
		created, seen                       int64
		hib                                 sql.NullInt64
	)
	var queuesAdded, queuesRemoved string
	err := row.Scan(&w.ID, &w.Namespace, &w.MachineID, &w.HelloLabel, &w.Label, &w.State, &tags, &queues,
		&caps, &versions, &w.PollQueue, &runng, &created, &seen, &hib,
		&w.LastSeq, &w.DeliveredSeq, &w.AckedSeq, &queuesAdded, &queuesRemoved, &w.SetupPending)
	if err != nil {
		return store.Worker{}, err
	}
	w.CreatedAt, w.LastSeenAt, w.HibernatingUntil = fromMs(created), fromMs(seen), fromNullMs(hib)
	if err := errors.Join(
		decodeJSON(tags, &w.Tags), decodeJSON(queues, &w.Queues),
		decodeJSON(caps, &w.Capabilities), decodeJSON(runng, &w.Running),
	); err != nil {
		return store.Worker{}, fmt.Errorf("worker %s: %w", w.ID, err)
	}
	w.Versions = json.RawMessage(versions)
	if err := mergeQueueEdits(&w, queuesAdded, queuesRemoved); err != nil {
		return store.Worker{}, err
	}
	normalizeWorker(&w)
	return w, nil
}

func normalizeWorker(w *store.Worker) {
	if w.Tags == nil {
		w.Tags = []string{}
	}
	if w.Queues == nil {
		w.Queues = []string{}
	}
	if w.Capabilities.Runners == nil {
		w.Capabilities.Runners = []string{}
	}
	if w.Running == nil {
		w.Running = []store.InvocationStatus{}
	}
	if len(w.Versions) == 0 {
		w.Versions = json.RawMessage("{}")
	}
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

func getWorker(ctx context.Context, q querier, namespace, id string) (store.Worker, error) {
	query := `SELECT ` + workerColumns + ` FROM workers w WHERE w.id = ?`
	args := []any{id}
	if namespace != "" {
		query += ` AND w.namespace = ?`
		args = append(args, namespace)
	}
	w, err := scanWorker(q.QueryRowContext(ctx, query, args...))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Worker{}, notFound("worker", id)
	}
	if err != nil {
		return store.Worker{}, fmt.Errorf("read worker %s: %w", id, err)
	}
	return w, nil
}

// Worker implements store.Workers.
func (db *DB) Worker(ctx context.Context, namespace, id string) (store.Worker, error) {
	return getWorker(ctx, db.r, namespace, id)
}

// ListWorkers implements store.Workers.
func (db *DB) ListWorkers(ctx context.Context, namespace string) ([]store.Worker, error) {
	rows, err := db.r.QueryContext(ctx, `SELECT `+workerColumns+` FROM workers w WHERE w.namespace = ? ORDER BY w.label, w.id`, namespace)
	if err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	defer rows.Close()
	out := []store.Worker{}
	for rows.Next() {
		w, err := scanWorker(rows)
		if err != nil {
			return nil, fmt.Errorf("list workers: %w", err)
		}
		out = append(out, w)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list workers: %w", err)
	}
	return out, nil
}

// Hello implements store.Workers.
func (db *DB) Hello(ctx context.Context, h store.Hello) (store.Worker, bool, error) {
	var (
		out     store.Worker
		created bool
	)
	tags, err1 := encodeJSON(nonNil(h.Tags))
	queues, err2 := encodeJSON(nonNil(h.Queues))
	caps := h.Capabilities
	caps.Runners = nonNil(caps.Runners)
	capsJSON, err3 := encodeJSON(caps)
	if err := errors.Join(err1, err2, err3); err != nil {
		return store.Worker{}, false, fmt.Errorf("hello: encode: %w", err)
	}
	versions := string(h.Versions)
	if versions == "" {
		versions = "{}"
	}
	err := db.tx(ctx, func(tx *sql.Tx) error {
		var id, state string
		err := tx.QueryRowContext(ctx, `SELECT id, state FROM workers WHERE namespace = ? AND machine_id = ? AND hello_label = ?`,
			h.Namespace, h.MachineID, h.Label).Scan(&id, &state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			created = true
			id = h.NewID
			label := h.Label
			if label == "" {
				label = id
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO workers (id, namespace, machine_id, hello_label, label, state, tags, queues,
				capabilities, versions, created_at, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				id, h.Namespace, h.MachineID, h.Label, label, store.StateActive, tags, queues, capsJSON, versions, ms(h.Now), ms(h.Now))
			if err != nil {
				return fmt.Errorf("insert worker: %w", err)
			}
		case err != nil:
			return fmt.Errorf("find worker: %w", err)
		default:
			_, err = tx.ExecContext(ctx, `UPDATE workers SET tags = ?, queues = ?, capabilities = ?, versions = ?, last_seen_at = ?,
				hibernating_until = NULL,
				state = CASE WHEN EXISTS (SELECT 1 FROM commands c WHERE c.worker_id = workers.id AND c.kind = 'setup' AND c.acked_at IS NULL)
					THEN 'setting_up' ELSE 'active' END
				WHERE id = ?`, tags, queues, capsJSON, versions, ms(h.Now), id)
			if err != nil {
				return fmt.Errorf("update worker: %w", err)
			}
		}
		out, err = getWorker(ctx, tx, "", id)
		return err
	})
	if err != nil {
		return store.Worker{}, false, fmt.Errorf("hello: %w", err)
	}
	return out, created, nil
}

// RecordPoll implements store.Workers.
func (db *DB) RecordPoll(ctx context.Context, p store.Poll) (store.Worker, error) {
	running, err := encodeJSON(nonNilStatus(p.Running))
	if err != nil {
		return store.Worker{}, fmt.Errorf("poll: encode running: %w", err)
	}
	var caps sql.NullString
	if p.UpdatedCapabilities != nil {
		c := *p.UpdatedCapabilities
		c.Runners = nonNil(c.Runners)
		s, err := encodeJSON(c)
		if err != nil {
			return store.Worker{}, fmt.Errorf("poll: encode capabilities: %w", err)
		}
		caps = sql.NullString{String: s, Valid: true}
	}
	var out store.Worker
	err = db.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE workers SET last_seen_at = ?, poll_queue = ?, running = ?,
			capabilities = COALESCE(?, capabilities),
			hibernating_until = CASE WHEN hibernating_until IS NOT NULL AND hibernating_until <= ? THEN NULL ELSE hibernating_until END
			WHERE id = ?`, ms(p.Now), p.Queue, running, caps, ms(p.Now), p.WorkerID)
		if err != nil {
			return fmt.Errorf("update worker: %w", err)
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return notFound("worker", p.WorkerID)
		}
		if p.Cursor != nil {
			if err := ackThrough(ctx, tx, p.WorkerID, *p.Cursor, p.Now); err != nil {
				return err
			}
		}
		_, err = tx.ExecContext(ctx, `UPDATE workers SET state = 'active' WHERE id = ? AND (state = 'joining' OR (state = 'setting_up'
			AND NOT EXISTS (SELECT 1 FROM commands c WHERE c.worker_id = workers.id AND c.kind = 'setup' AND c.acked_at IS NULL)))`, p.WorkerID)
		if err != nil {
			return fmt.Errorf("settle state: %w", err)
		}
		out, err = getWorker(ctx, tx, "", p.WorkerID)
		return err
	})
	if err != nil {
		return store.Worker{}, fmt.Errorf("poll: %w", err)
	}
	return out, nil
}

// ackThrough acknowledges every command up to cursor. The cursor is clamped
// to the highest sequence ever delivered, so a bogus or stale cursor can never
// acknowledge a command the daemon has not been sent.
func ackThrough(ctx context.Context, tx *sql.Tx, workerID string, cursor int64, now time.Time) error {
	var delivered int64
	if err := tx.QueryRowContext(ctx, `SELECT delivered_seq FROM workers WHERE id = ?`, workerID).Scan(&delivered); err != nil {
		return fmt.Errorf("read delivered seq: %w", err)
	}
	c := min(cursor, delivered)
	if c <= 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, `UPDATE commands SET acked_at = ?, delivered_at = COALESCE(delivered_at, ?)
		WHERE worker_id = ? AND seq <= ? AND acked_at IS NULL`, ms(now), ms(now), workerID, c); err != nil {
		return fmt.Errorf("ack commands: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE workers SET acked_seq = ? WHERE id = ? AND acked_seq < ?`, c, workerID, c); err != nil {
		return fmt.Errorf("ack seq: %w", err)
	}
	return nil
}

// DeleteWorker implements store.Workers.
func (db *DB) DeleteWorker(ctx context.Context, namespace, id string) error {
	err := db.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM workers WHERE id = ? AND namespace = ?`, id, namespace)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return notFound("worker", id)
		}
		_, err = tx.ExecContext(ctx, `DELETE FROM commands WHERE worker_id = ?`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("delete worker: %w", err)
	}
	return nil
}

// DeleteWorkersSeenBefore implements store.Workers.
func (db *DB) DeleteWorkersSeenBefore(ctx context.Context, namespace string, t time.Time) ([]string, error) {
	ids := []string{}
	err := db.tx(ctx, func(tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT id FROM workers WHERE namespace = ? AND last_seen_at < ? ORDER BY id`, namespace, ms(t))
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, id := range ids {
			if _, err := tx.ExecContext(ctx, `DELETE FROM workers WHERE id = ?`, id); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM commands WHERE worker_id = ?`, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("delete workers seen before %s: %w", t.Format(time.RFC3339), err)
	}
	return ids, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func nonNilStatus(s []store.InvocationStatus) []store.InvocationStatus {
	if s == nil {
		return []store.InvocationStatus{}
	}
	return s
}
