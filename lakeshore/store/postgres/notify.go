package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"nymph/batch"
)

// wakeChannel is the one LISTEN/NOTIFY channel wake-ups travel on.
const wakeChannel = "lakeshore_wake"

// Publishing. PostgreSQL serialises every transaction that notifies (a
// database-wide lock from its NOTIFY to the end of its commit), and a
// replica publishes several keys per exec (the queued command, its
// delivery, its result), so one pg_notify per key, each its own
// transaction on a pool connection, queued them behind one another with a
// connection held each: under load the pool went to the notifiers while
// polls and execs waited for it. A Notifier instead publishes on a
// connection of its own, one statement at a time: the keys that arrive
// while one is out go together in the next (each still its own
// notification, in order, the payload as before).
const (
	// publishMax bounds the keys of one statement.
	publishMax = 256
	// publishTimeout bounds one statement, connecting included.
	publishTimeout = 5 * time.Second
)

// Notifier carries wake-up keys between the control-plane replicas that
// share this database: Publish sends a NOTIFY, Listen holds a connection of
// its own in LISTEN. Each Notifier tags what it publishes with a random
// origin and skips its own keys when they come back, since the replica
// that published a key has already woken its own waiters.
type Notifier struct {
	db     *DB
	origin string
	q      *batch.Queue[*publication]

	// mu guards conn, the publishing connection (nil until the first
	// publish and after a failed one), and closed.
	mu     sync.Mutex
	conn   *pgx.Conn
	closed bool
}

// publication is one Publish waiting for the statement that carries it.
type publication struct {
	key  string
	err  error
	done chan struct{}
}

// Notifier returns a Notifier on the database; one per replica. Closing
// the database closes its publishing connection.
func (db *DB) Notifier() *Notifier {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	n := &Notifier{db: db, origin: hex.EncodeToString(b)}
	n.q = batch.New(publishMax, n.send)
	db.mu.Lock()
	db.notifiers = append(db.notifiers, n)
	db.mu.Unlock()
	return n
}

// Publish tells every other replica that key changed, and returns once the
// NOTIFY carrying it is sent. PostgreSQL delivers a NOTIFY only after the
// sender commits, and this one runs after the change it announces
// committed, so a listener woken by it reads that change.
func (n *Notifier) Publish(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish wake-up %s: %w", key, err)
	}
	p := &publication{key: key, done: make(chan struct{})}
	n.q.Add(p)
	select {
	case <-p.done:
	case <-ctx.Done():
		// It goes out all the same, with the others of its statement.
		return fmt.Errorf("publish wake-up %s: %w", key, ctx.Err())
	}
	if p.err != nil {
		return fmt.Errorf("publish wake-up %s: %w", key, p.err)
	}
	return nil
}

// send publishes a batch of keys in one statement and tells their callers.
func (n *Notifier) send(ps []*publication) {
	keys := make([]string, 0, len(ps))
	seen := make(map[string]bool, len(ps))
	for _, p := range ps {
		// PostgreSQL folds identical notifications of one transaction
		// into one anyway.
		if !seen[p.key] {
			seen[p.key] = true
			keys = append(keys, p.key)
		}
	}
	err := n.notify(keys)
	for _, p := range ps {
		p.err = err
		close(p.done)
	}
}

// notify sends keys as one notification each, in order, in one statement
// (one transaction) on the publishing connection.
func (n *Notifier) notify(keys []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	defer cancel()
	conn, err := n.connection(ctx)
	if err != nil {
		return err
	}
	_, err = conn.Exec(ctx, `SELECT pg_notify($1, $2 || k.key) FROM unnest($3::text[]) WITH ORDINALITY AS k(key, i) ORDER BY k.i`,
		wakeChannel, n.origin+sentMark+strconv.FormatInt(time.Now().UnixMicro(), 10)+" ", keys)
	if err != nil {
		// Whatever state the connection is in, the next batch starts
		// on a fresh one.
		n.mu.Lock()
		if n.conn == conn {
			n.conn = nil
		}
		n.mu.Unlock()
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		defer ccancel()
		_ = conn.Close(cctx)
		return err
	}
	return nil
}

// errNotifierClosed is a publish after the database was closed.
var errNotifierClosed = errors.New("the database is closed")

// connection is the publishing connection, connected if need be. Only
// send uses it, and batch runs one send at a time.
func (n *Notifier) connection(ctx context.Context) (*pgx.Conn, error) {
	n.mu.Lock()
	c, closed := n.conn, n.closed
	n.mu.Unlock()
	if closed {
		return nil, errNotifierClosed
	}
	if c != nil {
		return c, nil
	}
	c, err := pgx.ConnectConfig(ctx, n.db.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.Close(cctx)
		return nil, errNotifierClosed
	}
	n.conn = c
	return c, nil
}

// close closes the publishing connection; later publishes fail.
func (n *Notifier) close() {
	n.mu.Lock()
	c := n.conn
	n.conn, n.closed = nil, true
	n.mu.Unlock()
	if c != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}
}

// A payload is "ORIGIN KEY". Since the send time was added it is
// "ORIGIN@MICROS KEY", MICROS the publisher's clock in unix microseconds
// when the statement went out: a listener of before reads "ORIGIN@MICROS"
// as an origin that is never its own, which it is not, and delivers the
// key as ever; a listener of now reads a payload of before as one without
// a send time.
const sentMark = "@"

// Listen calls deliver with each key another replica publishes, until ctx is
// done (it then returns ctx's error) or the connection fails. Once it is
// listening it calls deliver("") first: a key published while nobody was
// listening is lost, so everything must be taken to have changed.
func (n *Notifier) Listen(ctx context.Context, deliver func(key string)) error {
	return n.ListenSent(ctx, func(key string, _ time.Time) { deliver(key) })
}

// ListenSent is Listen, telling deliver also when the key was sent, by the
// publisher's clock (zero for a publisher that does not say, and for the
// first ""), so the listener can tell how late notifications arrive.
func (n *Notifier) ListenSent(ctx context.Context, deliver func(key string, sent time.Time)) error {
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
	deliver("", time.Time{})
	for {
		msg, err := conn.WaitForNotification(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("listen: %w", err)
		}
		origin, key, ok := strings.Cut(msg.Payload, " ")
		var sent time.Time
		if o, micros, timed := strings.Cut(origin, sentMark); timed {
			origin = o
			if us, err := strconv.ParseInt(micros, 10, 64); err == nil {
				sent = time.UnixMicro(us)
			}
		}
		if !ok || origin == n.origin {
			continue
		}
		deliver(key, sent)
	}
}
