package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"nymph/lakeshore/store"
)

const eventColumns = `id, invocation_id, worker_id, kind, data, ts, received_at, seq, size`

// SaveEvent implements store.Events.
func (db *DB) SaveEvent(ctx context.Context, e store.Event) (bool, error) {
	var seq any
	if e.Seq != nil {
		seq = *e.Seq
	}
	n, err := db.writer().affected(ctx, `INSERT INTO invocation_events (`+eventColumns+`)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		e.ID, e.InvocationID, e.WorkerID, e.Kind, nonNilBytes(e.Data), ms(e.TS), ms(e.ReceivedAt), seq, e.Size)
	if err != nil {
		return false, fmt.Errorf("save event of %s: %w", e.InvocationID, err)
	}
	return n > 0, nil
}

// InvocationLog implements store.Events. The sizes are read first, so that
// a page is cut without reading the data past the cut.
func (db *DB) InvocationLog(ctx context.Context, q store.LogQuery) ([]store.Event, bool, error) {
	if q.MaxEvents <= 0 {
		return []store.Event{}, false, nil
	}
	var (
		out  []store.Event
		more bool
	)
	err := db.readTx(ctx, func(tx querier) error {
		out, more = nil, false
		rows, err := tx.Query(ctx, `SELECT seq, size FROM invocation_events
			WHERE invocation_id = ? AND kind = ? AND seq > ? ORDER BY seq LIMIT ?`, q.InvocationID, q.Kind, q.After, q.MaxEvents+1)
		if err != nil {
			return err
		}
		last, n, total := q.After, 0, 0
		for rows.Next() {
			var seq, size int64
			if err := rows.Scan(&seq, &size); err != nil {
				rows.Close()
				return err
			}
			if n == q.MaxEvents || (n > 0 && total+int(size) > q.MaxBytes) {
				more = true
				break
			}
			last, n, total = seq, n+1, total+int(size)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		rows, err = tx.Query(ctx, `SELECT `+eventColumns+` FROM invocation_events
			WHERE invocation_id = ? AND kind = ? AND seq > ? AND seq <= ? ORDER BY seq`, q.InvocationID, q.Kind, q.After, last)
		if err != nil {
			return err
		}
		out, err = scanEvents(rows)
		return err
	})
	if err != nil {
		return nil, false, fmt.Errorf("read log of %s: %w", q.InvocationID, err)
	}
	if out == nil {
		out = []store.Event{}
	}
	return out, more, nil
}

// WorkerEvents implements store.Events.
func (db *DB) WorkerEvents(ctx context.Context, workerID string, kinds []string, limit int) ([]store.Event, error) {
	if len(kinds) == 0 || limit <= 0 {
		return []store.Event{}, nil
	}
	args := []any{workerID}
	for _, k := range kinds {
		args = append(args, k)
	}
	args = append(args, limit)
	rows, err := db.reader().Query(ctx, `SELECT `+eventColumns+` FROM invocation_events
		WHERE worker_id = ? AND kind IN (`+marks(len(kinds))+`) ORDER BY received_at DESC, id DESC LIMIT ?`, args...)
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", workerID, err)
	}
	out, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("list events of %s: %w", workerID, err)
	}
	return out, nil
}

// LatestWorkerEvents implements store.Events.
func (db *DB) LatestWorkerEvents(ctx context.Context, namespace, kind string) (map[string]store.Event, error) {
	rows, err := db.reader().Query(ctx, `SELECT `+eventColumns+` FROM (
			SELECT e.id, e.invocation_id, e.worker_id, e.kind, e.data, e.ts, e.received_at, e.seq, e.size,
				ROW_NUMBER() OVER (PARTITION BY e.worker_id ORDER BY e.received_at DESC, e.id DESC) AS rn
			FROM invocation_events e JOIN workers w ON w.id = e.worker_id
			WHERE w.namespace = ? AND e.kind = ?) latest
		WHERE rn = 1`, namespace, kind)
	if err != nil {
		return nil, fmt.Errorf("latest %s events: %w", kind, err)
	}
	evs, err := scanEvents(rows)
	if err != nil {
		return nil, fmt.Errorf("latest %s events: %w", kind, err)
	}
	out := make(map[string]store.Event, len(evs))
	for _, e := range evs {
		out[e.WorkerID] = e
	}
	return out, nil
}

func scanEvents(rows *rows) ([]store.Event, error) {
	defer rows.Close()
	out := []store.Event{}
	for rows.Next() {
		var (
			e            store.Event
			ts, received int64
			seq          sql.NullInt64
		)
		if err := rows.Scan(&e.ID, &e.InvocationID, &e.WorkerID, &e.Kind, &e.Data, &ts, &received, &seq, &e.Size); err != nil {
			return nil, err
		}
		e.TS, e.ReceivedAt = fromMs(ts), fromMs(received)
		if seq.Valid {
			v := seq.Int64
			e.Seq = &v
		}
		out = append(out, e)
	}
	return out, rows.Err()
}

func marks(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}
