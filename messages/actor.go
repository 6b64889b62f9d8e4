package messages

import "time"

// Actor messages of the daemon. They never cross the wire.

// Wake tells the poller to abandon its in-flight long-poll and poll at once,
// because capacity was freed or a result is ready to be acknowledged.
type Wake struct{}

// ExecStarted is sent by an exec child to the root once the exec's
// process exists; the root passes it to the poller.
type ExecStarted struct {
	ExecID string
}

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

// Dispatch carries one decoded command from the poller to the root
// supervisor, which routes it by the type of Body (the values DecodeCommand
// returns). Hibernate and reset_backoff never leave the poller.
type Dispatch struct {
	CommandID string
	Kind      string
	Body      any
	// Refused, for an exec or a run, is why the daemon will not run it
	// (a single-job daemon that already has its job): the job is in the
	// ledger marked refused, and its parent reports the refusal instead of
	// running it.
	Refused string
}

// Queued tells the execs, invocations or setup-queue actor that new work is
// waiting in its store (the ledger or the setup FIFO). The store, not the
// message, is the truth, so a lost Queued loses nothing.
type Queued struct{}

// SetupFinished is sent to the root when a setup script ended, so idle and
// shutdown bookkeeping see it.
type SetupFinished struct {
	CommandID string
}

// Registered tells the root that hello succeeded.
type Registered struct {
	WorkerID    string
	Provisional bool
}

// HelloRejected tells the root that the control plane refused this daemon:
// start-up is aborted.
type HelloRejected struct {
	Code    string
	Message string
}

// IdleExit tells the root that the idle policy (keep_alive_s) says stop.
type IdleExit struct {
	Reason string
}

// Abort stops one exec or run child now: its process group is killed (Hard)
// or terminated with the kill grace, and the job is reported with Reason.
type Abort struct {
	Reason string
	Hard   bool
}
