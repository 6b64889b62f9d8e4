package sqlstore

import (
	"context"
	"fmt"

	"nymph/lakeshore/store"
)

// SaveAck implements store.Reports.
func (db *DB) SaveAck(ctx context.Context, a store.Ack) (bool, error) {
	n, err := db.writer().affected(ctx, `INSERT INTO invocation_acks (invocation_id, worker_id, state, result_blob, error, received_at)
		VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (invocation_id) DO NOTHING`,
		a.InvocationID, a.WorkerID, a.State, nonNilBytes(a.ResultBlob), jsonOrNil(a.Error), ms(a.ReceivedAt))
	if err != nil {
		return false, fmt.Errorf("save ack of %s: %w", a.InvocationID, err)
	}
	return n > 0, nil
}

// SaveResultChunk implements store.Reports.
func (db *DB) SaveResultChunk(ctx context.Context, c store.ResultChunk) (bool, error) {
	n, err := db.writer().affected(ctx, `INSERT INTO result_chunks (invocation_id, seq, data, last, received_at)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT (invocation_id, seq) DO NOTHING`,
		c.InvocationID, int64(c.Seq), nonNilBytes(c.Data), c.Last, ms(c.ReceivedAt))
	if err != nil {
		return false, fmt.Errorf("save result chunk %s/%d: %w", c.InvocationID, c.Seq, err)
	}
	return n > 0, nil
}
