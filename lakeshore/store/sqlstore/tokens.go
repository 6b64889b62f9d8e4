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
	// A token is minted unbound: only a hello binds it (bindHello).
	_, err := db.writer().Exec(ctx, `INSERT INTO tokens (id, kind, namespace, label, hash, created_at, expires_at, consumed_at, revoked_at, fleet)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, t.ID, t.Kind, t.Namespace, t.Label, t.Hash, ms(t.CreatedAt),
		msPtr(t.ExpiresAt), msPtr(t.ConsumedAt), msPtr(t.RevokedAt), t.Fleet)
	if err != nil {
		return fmt.Errorf("create token: %w", err)
	}
	return nil
}

// tokenColumns are read by scanToken, in its order.
const tokenColumns = `id, kind, namespace, label, hash, created_at, expires_at, consumed_at, revoked_at, fleet, worker_id`

// scanToken reads one row of tokenColumns.
func scanToken(scan func(dest ...any) error) (store.Token, error) {
	var (
		t                          store.Token
		created                    int64
		expires, consumed, revoked sql.NullInt64
		worker                     sql.NullString
	)
	if err := scan(&t.ID, &t.Kind, &t.Namespace, &t.Label, &t.Hash, &created, &expires, &consumed, &revoked, &t.Fleet, &worker); err != nil {
		return store.Token{}, err
	}
	t.WorkerID = worker.String
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

// bindHello applies the token rules of store.Hello to the worker row id,
// which the hello's transaction has just inserted or updated and so holds
// locked: every hello binding or claiming that row waits for this one. The
// token row is locked too, so two hellos racing with one token from two
// machines are ordered, and the second finds it bound.
func bindHello(ctx context.Context, tx querier, h store.Hello, id string) error {
	if h.TokenID == "" && !h.Fleet {
		return nil
	}
	owner, err := workerOwner(ctx, tx, id)
	if err != nil {
		return err
	}
	if owner != nil && owner.ID == h.TokenID {
		return nil
	}
	if h.TokenID == "" {
		if owner != nil && owner.Live(h.Now) {
			return fmt.Errorf("worker %s is bound to token %s: %w", id, owner.ID, store.ErrWorkerOwned)
		}
		return nil
	}
	if owner != nil && owner.Live(h.Now) {
		return fmt.Errorf("worker %s is bound to token %s: %w", id, owner.ID, store.ErrWorkerOwned)
	}
	var bound sql.NullString
	err = tx.QueryRow(ctx, `SELECT worker_id FROM tokens WHERE id = ?`+tx.d.ForUpdate, h.TokenID).Scan(&bound)
	if errors.Is(err, sql.ErrNoRows) {
		return notFound("token", h.TokenID)
	}
	if err != nil {
		return fmt.Errorf("read token %s: %w", h.TokenID, err)
	}
	if bound.Valid && bound.String != id {
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM workers WHERE id = ?)`, bound.String).Scan(&exists); err != nil {
			return fmt.Errorf("read worker %s: %w", bound.String, err)
		}
		if exists {
			return fmt.Errorf("token %s is bound to worker %s: %w", h.TokenID, bound.String, store.ErrTokenBound)
		}
	}
	if owner != nil {
		// Revoked or expired: its worker is taken over.
		if _, err := tx.Exec(ctx, `UPDATE tokens SET worker_id = NULL WHERE id = ?`, owner.ID); err != nil {
			return fmt.Errorf("unbind token %s: %w", owner.ID, err)
		}
	}
	if _, err := tx.Exec(ctx, `UPDATE tokens SET worker_id = ? WHERE id = ?`, id, h.TokenID); err != nil {
		return fmt.Errorf("bind token %s: %w", h.TokenID, err)
	}
	return nil
}

// workerOwner returns the token bound to worker id, nil when there is none.
func workerOwner(ctx context.Context, tx querier, id string) (*store.Token, error) {
	t, err := scanToken(tx.QueryRow(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE worker_id = ?`, id).Scan)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the token of worker %s: %w", id, err)
	}
	return &t, nil
}
