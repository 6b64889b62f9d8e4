package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"nymph/store"
)

// CreateToken implements store.Tokens.
func (db *DB) CreateToken(ctx context.Context, t store.Token) error {
	_, err := db.writer().Exec(ctx, `INSERT INTO tokens (id, kind, namespace, label, hash, created_at, expires_at, consumed_at, revoked_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Kind, t.Namespace, t.Label, t.Hash, ms(t.CreatedAt),
		msPtr(t.ExpiresAt), msPtr(t.ConsumedAt), msPtr(t.RevokedAt))
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

// TokenByHash implements store.Tokens.
func (db *DB) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	var (
		t                          store.Token
		created                    int64
		expires, consumed, revoked sql.NullInt64
	)
	err := db.reader().QueryRow(ctx, `SELECT id, kind, namespace, label, hash, created_at, expires_at, consumed_at, revoked_at
		FROM tokens WHERE hash = ?`, hash).Scan(&t.ID, &t.Kind, &t.Namespace, &t.Label, &t.Hash, &created, &expires, &consumed, &revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Token{}, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("read token: %w", err)
	}
	t.CreatedAt = fromMs(created)
	t.ExpiresAt, t.ConsumedAt, t.RevokedAt = fromNullMs(expires), fromNullMs(consumed), fromNullMs(revoked)
	return t, nil
}
