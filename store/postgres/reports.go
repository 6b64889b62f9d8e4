package postgres

import (
	"context"
	"fmt"

	"nymph/store"
)

// SaveAck implements store.Reports.
func (db *DB) SaveAck(ctx context.Context, a store.Ack) (bool, error) {
	var errJSON *string
	if len(a.Error) > 0 {
		s := string(a.Error)
		errJSON = &s
	}
	tag, err := db.q.Exec(ctx, `INSERT INTO invocation_acks (invocation_id, worker_id, state, result_blob, error, received_at)
		VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (invocation_id) DO NOTHING`,
		a.InvocationID, a.WorkerID, a.State, nonNilBytes(a.ResultBlob), errJSON, ms(a.ReceivedAt))
	if err != nil {
		return false, fmt.Errorf("save ack of %s: %w", a.InvocationID, err)
	}
	return tag.RowsAffected() > 0, nil
}

// SaveEvent implements store.Reports.
func (db *DB) SaveEvent(ctx context.Context, e store.Event) error {
	_, err := db.q.Exec(ctx, `INSERT INTO invocation_events (id, invocation_id, worker_id, kind, data, ts, received_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7)`, e.ID, e.InvocationID, e.WorkerID, e.Kind, nonNilBytes(e.Data), ms(e.TS), ms(e.ReceivedAt))
	if err != nil {
		return fmt.Errorf("save event of %s: %w", e.InvocationID, err)
	}
	return nil
}

// SaveResultChunk implements store.Reports.
func (db *DB) SaveResultChunk(ctx context.Context, c store.ResultChunk) (bool, error) {
	tag, err := db.q.Exec(ctx, `INSERT INTO result_chunks (invocation_id, seq, data, last, received_at)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (invocation_id, seq) DO NOTHING`,
		c.InvocationID, int64(c.Seq), nonNilBytes(c.Data), c.Last, ms(c.ReceivedAt))
	if err != nil {
		return false, fmt.Errorf("save result chunk %s/%d: %w", c.InvocationID, c.Seq, err)
	}
	return tag.RowsAffected() > 0, nil
}
