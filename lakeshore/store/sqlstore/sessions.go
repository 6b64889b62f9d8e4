package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"nymph/lakeshore/store"
)

// CreateSession implements store.Sessions.
func (db *DB) CreateSession(ctx context.Context, s store.Session) error {
	_, err := db.writer().Exec(ctx, `INSERT INTO sessions (id_hash, csrf, created_at, expires_at, absolute_at)
		VALUES (?, ?, ?, ?, ?)`, s.IDHash, s.CSRF, ms(s.CreatedAt), ms(s.ExpiresAt), ms(s.AbsoluteAt))
	if err != nil {
		return fmt.Errorf("create session: %w", err)
	}
	return nil
}

// TouchSession implements store.Sessions: one UPDATE … RETURNING, so a
// session deleted by another replica's logout is never extended.
func (db *DB) TouchSession(ctx context.Context, idHash string, now time.Time, idle time.Duration) (store.Session, error) {
	next := ms(now.Add(idle))
	var created, expires, absolute int64
	s := store.Session{IDHash: idHash}
	err := db.writer().QueryRow(ctx, `UPDATE sessions SET expires_at = CASE WHEN ? < absolute_at THEN ? ELSE absolute_at END
		WHERE id_hash = ? AND expires_at > ? AND absolute_at > ?
		RETURNING csrf, created_at, expires_at, absolute_at`, next, next, idHash, ms(now), ms(now)).
		Scan(&s.CSRF, &created, &expires, &absolute)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Session{}, fmt.Errorf("session: %w", store.ErrNotFound)
	}
	if err != nil {
		return store.Session{}, fmt.Errorf("touch session: %w", err)
	}
	s.CreatedAt, s.ExpiresAt, s.AbsoluteAt = fromMs(created), fromMs(expires), fromMs(absolute)
	return s, nil
}

// DeleteSession implements store.Sessions.
func (db *DB) DeleteSession(ctx context.Context, idHash string) error {
	if _, err := db.writer().Exec(ctx, `DELETE FROM sessions WHERE id_hash = ?`, idHash); err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	return nil
}

// PurgeSessions implements store.Sessions.
func (db *DB) PurgeSessions(ctx context.Context, now time.Time) (int64, error) {
	n, err := db.writer().Exec(ctx, `DELETE FROM sessions WHERE expires_at <= ? OR absolute_at <= ?`, ms(now), ms(now))
	if err != nil {
		return 0, fmt.Errorf("purge sessions: %w", err)
	}
	return n, nil
}
