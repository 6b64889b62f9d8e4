package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"nymph/store"
)

// SaveAck implements store.Reports.
func (db *DB) SaveAck(ctx context.Context, a store.Ack) (bool, error) {
	var applied bool
	var errJSON any
	if len(a.Error) > 0 {
		errJSON = string(a.Error)
	}
	err := db.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO invocation_acks (invocation_id, worker_id, state, result_blob, error, received_at)
			VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (invocation_id) DO NOTHING`,
			a.InvocationID, a.WorkerID, a.State, nonNilBytes(a.ResultBlob), errJSON, ms(a.ReceivedAt))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		applied = n > 0
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("save ack of %s: %w", a.InvocationID, err)
	}
	return applied, nil
}

// SaveEvent implements store.Reports.
func (db *DB) SaveEvent(ctx context.Context, e store.Event) error {
	err := db.tx(ctx, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO invocation_events (id, invocation_id, worker_id, kind, data, ts, received_at)
			VALUES (?, ?, ?, ?, ?, ?, ?)`, e.ID, e.InvocationID, e.WorkerID, e.Kind, nonNilBytes(e.Data), ms(e.TS), ms(e.ReceivedAt))
		return err
	})
	if err != nil {
		return fmt.Errorf("save event of %s: %w", e.InvocationID, err)
	}
	return nil
}

// SaveResultChunk implements store.Reports.
func (db *DB) SaveResultChunk(ctx context.Context, c store.ResultChunk) (bool, error) {
	var applied bool
	err := db.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO result_chunks (invocation_id, seq, data, last, received_at)
			VALUES (?, ?, ?, ?, ?) ON CONFLICT (invocation_id, seq) DO NOTHING`,
			c.InvocationID, int64(c.Seq), nonNilBytes(c.Data), boolInt(c.Last), ms(c.ReceivedAt))
		if err != nil {
			return err
		}
		n, _ := res.RowsAffected()
		applied = n > 0
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("save result chunk %s/%d: %w", c.InvocationID, c.Seq, err)
	}
	return applied, nil
}
