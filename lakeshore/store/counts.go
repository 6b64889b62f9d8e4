package store

import (
	"context"
	"time"
)

// Counts are the aggregates a metrics scrape reads: one grouped query
// each, whatever the size of the fleet, so a scrape costs the database a
// scan of an index rather than a row per worker sent over the wire.
type Counts interface {
	// CountWorkers counts the workers by stored state, telling apart
	// those last seen before staleBefore (which read back stale unless
	// pending or gone: the caller derives that, as reads do).
	CountWorkers(ctx context.Context, staleBefore time.Time) ([]WorkerCount, error)
	// CountQueued counts the commands not yet delivered, by kind and the
	// queue their worker polls, and the invocations waiting for a worker
	// (Kind KindInvocation), by their queue.
	CountQueued(ctx context.Context) ([]QueuedCount, error)
}

// KindInvocation is the kind CountQueued gives the invocations still
// queued: they become run commands once a worker claims them.
const KindInvocation = "invocation"

// WorkerCount is one group of CountWorkers.
type WorkerCount struct {
	State string
	// SeenBefore: last seen before the staleBefore of the call.
	SeenBefore bool
	N          int64
}

// QueuedCount is one group of CountQueued.
type QueuedCount struct {
	Kind, Queue string
	N           int64
}
