package messages

import "time"

// Actor messages of the daemon. They never cross the wire.

// Wake tells the poller to abandon its in-flight long-poll and poll at once,
// because capacity was freed or a result is ready to be acknowledged.
type Wake struct{}

// ExecFinished is sent by an exec child to its parent once its result has
// been handed over for posting.
type ExecFinished struct {
	ExecID string
}

// RunFinished is the invocation counterpart of ExecFinished.
type RunFinished struct {
	InvocationID string
}

// Shutdown starts a graceful stop: no new polls, running work gets Grace.
type Shutdown struct {
	Grace time.Duration
}

// GraceExpired ends the shutdown grace: running work is killed and reported.
type GraceExpired struct{}
