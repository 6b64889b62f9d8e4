package store

import "context"

// Events holds what daemons post to /v1/daemon/event: the output of runs
// (one row per piece, numbered by Seq) and the outcomes of setups and
// updates (one row per command, Seq 0). A row with a Seq is kept once per
// (invocation id, kind, seq, worker): a repeated post changes nothing.
type Events interface {
	// SaveEvent stores one event; applied is false when it repeats one
	// already stored.
	SaveEvent(ctx context.Context, e Event) (applied bool, err error)
	// InvocationLog returns an invocation's events of q.Kind with
	// seq > q.After, in seq order: at most q.MaxEvents of them, and no
	// more than q.MaxBytes of Size once the first is in (the first always
	// is, whatever its size). more reports whether others follow the last
	// one returned.
	InvocationLog(ctx context.Context, q LogQuery) (events []Event, more bool, err error)
	// WorkerEvents returns a worker's events of the given kinds, newest
	// first (by arrival), at most limit.
	WorkerEvents(ctx context.Context, workerID string, kinds []string, limit int) ([]Event, error)
	// LatestWorkerEvents returns, by worker id, the newest event of kind of
	// every worker of the namespace that has one.
	LatestWorkerEvents(ctx context.Context, namespace, kind string) (map[string]Event, error)
}

// LogQuery selects a page of an invocation's events.
type LogQuery struct {
	InvocationID string
	Kind         string
	After        int64
	MaxEvents    int
	MaxBytes     int
}
