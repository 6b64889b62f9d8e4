package sqlstore

import (
	"context"
	"fmt"
	"time"
)

// noncePurgeEvery is how many recorded nonces go by between two purges of
// the expired ones: often enough to keep the table at about one skew
// window of requests, rarely enough to cost nothing per request.
const noncePurgeEvery = 256

// UseNonce implements store.Nonces.
func (db *DB) UseNonce(ctx context.Context, keyID, nonce string, expires, now time.Time) (bool, error) {
	n, err := db.writer().Exec(ctx, `INSERT INTO nonces (key_id, nonce, expires_at) VALUES (?, ?, ?)
		ON CONFLICT (key_id, nonce) DO NOTHING`, keyID, nonce, ms(expires))
	if err != nil {
		return false, fmt.Errorf("record nonce: %w", err)
	}
	if db.nonceUses.Add(1)%noncePurgeEvery == 0 {
		if _, err := db.writer().Exec(ctx, `DELETE FROM nonces WHERE expires_at <= ?`, ms(now)); err != nil {
			return false, fmt.Errorf("purge nonces: %w", err)
		}
	}
	return n == 1, nil
}
