package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
)

// A checkpoint comes once checkpointCommits transactions have been
// committed since the last, or checkpointDelay after the first of them,
// whichever is sooner: a busy control plane moves its log some thousand
// pages at a time, as SQLite's own default would, and a quiet one within
// a second of its last write, without a checkpoint (two fsyncs) for each.
const (
	checkpointCommits = 300
	checkpointDelay   = time.Second
)

// checkpointer moves the write-ahead log into the database file on a
// connection of its own. SQLite's automatic checkpoint runs inside the
// commit that takes the log past 1,000 pages, its two fsyncs included, so
// every hundredth exec or so waited milliseconds for the disk in front of
// its answer (seen as that commit blocked in fsync). A passive checkpoint
// beside the writer blocks neither it nor the readers; the writer still
// starts the log over once a checkpoint has moved all of it.
//
// kick is safe to call from any goroutine and never blocks; run is the
// one goroutine that checkpoints, and stop ends it.
type checkpointer struct {
	db       *sql.DB
	log      zerolog.Logger
	pending  atomic.Int64 // commits since the last checkpoint began
	kicks    chan struct{}
	done     chan struct{}
	ended    chan struct{}
	once     sync.Once
	closeErr error
	// observe, when set (tests), is told the log's frames and how many of
	// them each checkpoint moved.
	observe func(frames, moved int)
}

func newCheckpointer(db *sql.DB, log zerolog.Logger, observe func(frames, moved int)) *checkpointer {
	c := &checkpointer{db: db, log: log, kicks: make(chan struct{}, 1), done: make(chan struct{}), ended: make(chan struct{}),
		observe: observe}
	go c.run()
	return c
}

// kick counts a committed transaction. Only the first after a checkpoint
// and the one that fills the batch wake run.
func (c *checkpointer) kick() {
	if n := c.pending.Add(1); n == 1 || n == checkpointCommits {
		select {
		case c.kicks <- struct{}{}:
		default:
		}
	}
}

func (c *checkpointer) run() {
	defer close(c.ended)
	delay := time.NewTimer(checkpointDelay)
	delay.Stop()
	for {
		select {
		case <-c.kicks:
		case <-c.done:
			return
		}
		if c.pending.Load() < checkpointCommits {
			delay.Reset(checkpointDelay)
			for waiting := true; waiting && c.pending.Load() < checkpointCommits; {
				select {
				case <-c.kicks:
				case <-delay.C:
					waiting = false
				case <-c.done:
					return
				}
			}
			delay.Stop()
		}
		c.pending.Store(0)
		if err := c.checkpoint(); err != nil {
			// The log only grows until the next one succeeds; what is
			// in it is as safe as what is in the database file.
			c.log.Warn().Err(err).Msg("sqlite checkpoint failed; the write-ahead log grows until one succeeds")
		}
	}
}

// checkpoint moves what it can of the log without waiting for anyone.
func (c *checkpointer) checkpoint() error {
	var busy, frames, moved int // busy: 1 when a reader kept some frames back
	err := c.db.QueryRowContext(context.Background(), `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &moved)
	if err != nil {
		return fmt.Errorf("wal_checkpoint: %w", err)
	}
	if c.observe != nil {
		c.observe(frames, moved)
	}
	return nil
}

// stop ends run and closes the checkpoints' connection; called again, it
// only says how that went.
func (c *checkpointer) stop() error {
	c.once.Do(func() {
		close(c.done)
		<-c.ended
		c.closeErr = c.db.Close()
	})
	return c.closeErr
}
