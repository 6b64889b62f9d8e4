package sqlstore

import (
	"context"
	"fmt"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// CountWorkers implements store.Counts: one pass over the workers table,
// returning a row per (state, seen before) pair rather than per worker.
func (db *DB) CountWorkers(ctx context.Context, staleBefore time.Time) ([]store.WorkerCount, error) {
	rows, err := db.reader().Query(ctx, `SELECT state, CASE WHEN last_seen_at < ? THEN 1 ELSE 0 END AS seen_before, COUNT(*)
		FROM workers GROUP BY state, seen_before`, ms(staleBefore))
	if err != nil {
		return nil, fmt.Errorf("count workers: %w", err)
	}
	defer rows.Close()
	var out []store.WorkerCount
	for rows.Next() {
		var c store.WorkerCount
		var before int64
		if err := rows.Scan(&c.State, &before, &c.N); err != nil {
			return nil, fmt.Errorf("count workers: %w", err)
		}
		c.SeenBefore = before == 1
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count workers: %w", err)
	}
	return out, rows.Close()
}

// CountQueued implements store.Counts. The commands read are the
// unacknowledged ones only (the commands_unacked index), and the
// invocations the queued ones (invocations_state).
func (db *DB) CountQueued(ctx context.Context) ([]store.QueuedCount, error) {
	rows, err := db.reader().Query(ctx, `SELECT c.kind, w.poll_queue, COUNT(*) FROM commands c JOIN workers w ON w.id = c.worker_id
		WHERE c.acked_at IS NULL AND c.delivered_at IS NULL GROUP BY c.kind, w.poll_queue
		UNION ALL
		SELECT CAST(? AS TEXT), queue, COUNT(*) FROM invocations WHERE state = ? GROUP BY queue`,
		store.KindInvocation, operatorapi.InvocationQueued)
	if err != nil {
		return nil, fmt.Errorf("count queued: %w", err)
	}
	defer rows.Close()
	var out []store.QueuedCount
	for rows.Next() {
		var c store.QueuedCount
		if err := rows.Scan(&c.Kind, &c.Queue, &c.N); err != nil {
			return nil, fmt.Errorf("count queued: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("count queued: %w", err)
	}
	return out, rows.Close()
}
