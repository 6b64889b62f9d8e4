package sqlstore

import (
	"context"
	"fmt"
	"time"

	"nymph/lakeshore/store"
)

// RecordPayload implements store.Payloads.
func (db *DB) RecordPayload(ctx context.Context, p store.PayloadBlob) error {
	_, err := db.writer().affected(ctx, `INSERT INTO payload_blobs (namespace, key, job_id, created_at) VALUES (?, ?, ?, ?)
		ON CONFLICT (namespace, key) DO UPDATE SET job_id = CASE WHEN excluded.job_id <> '' THEN excluded.job_id ELSE payload_blobs.job_id END`,
		p.Namespace, p.Key, p.JobID, ms(p.CreatedAt))
	if err != nil {
		return fmt.Errorf("record payload %s/%s: %w", p.Namespace, p.Key, err)
	}
	return nil
}

// ExpiredPayloads implements store.Payloads. A job finishes after it was
// created, so created_at < cutoff (the index) bounds the rows looked at;
// the holds are point lookups by primary key and by args_key.
func (db *DB) ExpiredPayloads(ctx context.Context, cutoff time.Time, limit int) ([]store.PayloadBlob, error) {
	c := ms(cutoff)
	rows, err := db.reader().Query(ctx, `SELECT p.namespace, p.key, p.job_id, p.created_at FROM payload_blobs p
		WHERE p.created_at < ?
		AND NOT EXISTS (SELECT 1 FROM invocations i WHERE i.namespace = p.namespace AND i.args_key = p.key AND i.args_key <> ''
			AND (i.finished_at IS NULL OR i.finished_at >= ?))
		AND NOT (p.job_id <> '' AND (
			EXISTS (SELECT 1 FROM invocations i WHERE i.id = p.job_id AND (i.finished_at IS NULL OR i.finished_at >= ?))
			OR EXISTS (SELECT 1 FROM execs x WHERE x.id = p.job_id AND (x.finished_at IS NULL OR x.finished_at >= ?))))
		ORDER BY p.created_at, p.namespace, p.key LIMIT ?`, c, c, c, c, limit)
	if err != nil {
		return nil, fmt.Errorf("expired payloads: %w", err)
	}
	defer rows.Close()
	out := []store.PayloadBlob{}
	for rows.Next() {
		var (
			p       store.PayloadBlob
			created int64
		)
		if err := rows.Scan(&p.Namespace, &p.Key, &p.JobID, &created); err != nil {
			return nil, fmt.Errorf("expired payloads: %w", err)
		}
		p.CreatedAt = fromMs(created)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("expired payloads: %w", err)
	}
	return out, nil
}

// ForgetPayload implements store.Payloads.
func (db *DB) ForgetPayload(ctx context.Context, namespace, key string) error {
	if _, err := db.writer().affected(ctx, `DELETE FROM payload_blobs WHERE namespace = ? AND key = ?`, namespace, key); err != nil {
		return fmt.Errorf("forget payload %s/%s: %w", namespace, key, err)
	}
	return nil
}
