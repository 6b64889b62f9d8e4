package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// wakeChannel is the one LISTEN/NOTIFY channel wake-ups travel on.
const wakeChannel = "lakeshore_wake"

// Notifier carries wake-up keys between the control-plane replicas that
// share this database: Publish sends a NOTIFY, Listen holds a connection of
// its own in LISTEN. Each Notifier tags what it publishes with a random
// origin and skips its own keys when they come back, since the replica
// that published a key has already woken its own waiters.
type Notifier struct {
	db     *DB
	origin string
}

// Notifier returns a Notifier on the database; one per replica.
func (db *DB) Notifier() *Notifier {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return &Notifier{db: db, origin: hex.EncodeToString(b)}
}

// Publish tells every other replica that key changed. PostgreSQL delivers a
// NOTIFY only after the sender commits, and this one runs after the change
// it announces committed, so a listener woken by it reads that change.
func (n *Notifier) Publish(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish wake-up %s: %w", key, err)
	}
	dctx, cancel := detach(ctx)
	defer cancel()
	if _, err := n.db.pool.Exec(dctx, `SELECT pg_notify($1, $2)`, wakeChannel, n.origin+" "+key); err != nil {
		return fmt.Errorf("publish wake-up %s: %w", key, err)
	}
	return nil
}

// Listen calls deliver with each key another replica publishes, until ctx is
// done (it then returns ctx's error) or the connection fails. Once it is
// listening it calls deliver("") first: a key published while nobody was
// listening is lost, so everything must be taken to have changed.
func (n *Notifier) Listen(ctx context.Context, deliver func(key string)) error {
	cfg := n.db.pool.Config().ConnConfig.Copy()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("listen: connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, `LISTEN `+wakeChannel); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	deliver("")
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("listen: %w", err)
		}
		origin, key, ok := strings.Cut(msg.Payload, " ")
		if !ok || origin == n.origin {
			continue
		}
		deliver(key)
	}
}
