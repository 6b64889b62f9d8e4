package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/lakeshore/store"
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

// tokenColumns are read by scanToken, in its order.
const tokenColumns = `id, kind, namespace, label, hash, created_at, expires_at, consumed_at, revoked_at`

// scanToken reads one row of tokenColumns.
func scanToken(scan func(dest ...any) error) (store.Token, error) {
	var (
		t                          store.Token
		created                    int64
		expires, consumed, revoked sql.NullInt64
	)
	if err := scan(&t.ID, &t.Kind, &t.Namespace, &t.Label, &t.Hash, &created, &expires, &consumed, &revoked); err != nil {
		return store.Token{}, err
	}
	t.CreatedAt = fromMs(created)
	t.ExpiresAt, t.ConsumedAt, t.RevokedAt = fromNullMs(expires), fromNullMs(consumed), fromNullMs(revoked)
	return t, nil
}

// TokenByHash implements store.Tokens.
func (db *DB) TokenByHash(ctx context.Context, hash string) (store.Token, error) {
	t, err := scanToken(db.reader().QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE hash = ?`, hash).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Token{}, fmt.Errorf("token: %w", store.ErrNotFound)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("read token: %w", err)
	}
	return t, nil
}

// ListTokens implements store.Tokens.
func (db *DB) ListTokens(ctx context.Context) ([]store.Token, error) {
	rows, err := db.reader().Query(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	defer rows.Close()
	out := []store.Token{}
	for rows.Next() {
		t, err := scanToken(rows.Scan)
		if err != nil {
			return nil, fmt.Errorf("list tokens: %w", err)
		}
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return out, nil
}

// RevokeToken implements store.Tokens.
func (db *DB) RevokeToken(ctx context.Context, id string, at time.Time) (store.Token, error) {
	t, err := scanToken(db.writer().QueryRow(ctx, `UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?) WHERE id = ?
		RETURNING `+tokenColumns, ms(at), id).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Token{}, fmt.Errorf("token %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return store.Token{}, fmt.Errorf("revoke token %s: %w", id, err)
	}
	return t, nil
}
