package store

import (
	"context"
	"time"
)

// Sessions keeps the dashboard's login sessions. The store sees only the
// hash of a session id, never the id its cookie carries.
type Sessions interface {
	// CreateSession stores a new session.
	CreateSession(ctx context.Context, s Session) error
	// TouchSession returns the session with idHash if it has not expired
	// by now, its idle expiry moved to now+idle (never past its absolute
	// expiry). An unknown or expired session is ErrNotFound.
	TouchSession(ctx context.Context, idHash string, now time.Time, idle time.Duration) (Session, error)
	// DeleteSession ends a session (a logout); an unknown one is not an
	// error.
	DeleteSession(ctx context.Context, idHash string) error
	// PurgeSessions drops the sessions expired by now and returns how many.
	PurgeSessions(ctx context.Context, now time.Time) (int64, error)
}

// Session is one dashboard login.
type Session struct {
	IDHash string
	// CSRF is the token every form and fetch of the session carries.
	CSRF      string
	CreatedAt time.Time
	// ExpiresAt is the idle expiry, AbsoluteAt the one use does not move.
	ExpiresAt  time.Time
	AbsoluteAt time.Time
}
