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

// restartFrames is how long the log may grow before the checkpointer
// makes room for the writer to start it over (16 MB of 4 KB pages).
const restartFrames = 4096

// checkpointer moves the write-ahead log into the database file on a
// connection of its own. SQLite's automatic checkpoint runs inside the
// commit that takes the log past 1,000 pages, its two fsyncs included, so
// every hundredth exec or so waited milliseconds for the disk in front of
// its answer (seen as that commit blocked in fsync). A passive checkpoint
// beside the writer blocks neither it nor the readers.
//
// The writer starts the log over only in a transaction that begins once a
// checkpoint has moved all of it, and under sustained writes none does:
// commits land while the passive checkpoint runs, so it always leaves the
// newest frames behind. The log then grew without end (6 GB in six
// minutes of back-to-back execs, and every page read slower as its index
// grew). So when the log holds more than restartFrames frames after a
// passive checkpoint, a second one runs on the writer's own connection,
// between two write transactions: it moves the few frames the first
// left, and the next transaction starts the log over. Only that second
// one holds the writes up (its two fsyncs, well under a millisecond here).
//
// kick is safe to call from any goroutine and never blocks; run is the
// one goroutine that checkpoints, and stop ends it.
type checkpointer struct {
	db     *sql.DB // the checkpoints' own connection
	writer *sql.DB // the writer's pool of one connection
	log    zerolog.Logger
	// commits and restart are checkpointCommits and restartFrames,
	// smaller in tests.
	commits  int64
	restart  int
	pending  atomic.Int64 // commits since the last checkpoint began
	kicks    chan struct{}
	done     chan struct{}
	ended    chan struct{}
	once     sync.Once
	closeErr error
	observe  func(frames, moved int) // checkpointTuning.observe
}

func newCheckpointer(db, writer *sql.DB, log zerolog.Logger, tune checkpointTuning) *checkpointer {
	c := &checkpointer{db: db, writer: writer, log: log, commits: tune.commits, restart: tune.restart, kicks: make(chan struct{}, 1),
		done: make(chan struct{}), ended: make(chan struct{}), observe: tune.observe}
	go c.run()
	return c
}

// kick counts a committed transaction. Only the first after a checkpoint
// and the one that fills the batch wake run.
func (c *checkpointer) kick() {
	if n := c.pending.Add(1); n == 1 || n == c.commits {
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
		if c.pending.Load() < c.commits {
			delay.Reset(checkpointDelay)
			for waiting := true; waiting && c.pending.Load() < c.commits; {
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

// checkpoint moves what it can of the log without waiting for anyone,
// then, if the log is long, what is left on the writer's connection.
func (c *checkpointer) checkpoint() error {
	frames, err := c.passive(c.db)
	if err != nil || frames <= c.restart {
		return err
	}
	// The writer's pool has one connection: this waits for the
	// transaction in progress, and the next waits for this.
	_, err = c.passive(c.writer)
	return err
}

// passive runs a passive checkpoint on db and returns the log's frames.
func (c *checkpointer) passive(db *sql.DB) (int, error) {
	var busy, frames, moved int // busy: 1 when a reader kept some frames back
	err := db.QueryRowContext(context.Background(), `PRAGMA wal_checkpoint(PASSIVE)`).Scan(&busy, &frames, &moved)
	if err != nil {
		return 0, fmt.Errorf("wal_checkpoint: %w", err)
	}
	if c.observe != nil {
		c.observe(frames, moved)
	}
	return frames, nil
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
