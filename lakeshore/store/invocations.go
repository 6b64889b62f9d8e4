package store

import (
	"context"
	"time"
)

// Invocation states are operatorapi's Invocation*: queued waits for a
// daemon; running has been claimed by one (its run command is in that
// worker's queue); the rest are terminal.

// KindRun is the command kind an invocation is delivered as.
const KindRun = "run"

// Why a job's worker counts as lost.
const (
	LostRemoved   = "removed"   // the worker row was deleted (killed, cleaned up)
	LostGone      = "gone"      // the worker is in state gone
	LostStale     = "stale"     // not seen since before the deadline
	LostMissing   = "missing"   // it polls but stopped listing the invocation
	LostRestarted = "restarted" // a new process of the worker said hello after the old one received the job
)

// Invocations holds function invocations and hands them to daemons.
type Invocations interface {
	// CreateInvocation stores a queued invocation.
	CreateInvocation(ctx context.Context, n NewInvocation) (Invocation, error)
	// Invocation returns one invocation; namespace "" matches any.
	Invocation(ctx context.Context, namespace, id string) (Invocation, error)
	// ListInvocations returns a namespace's invocations, newest first,
	// without their args and result bytes.
	ListInvocations(ctx context.Context, f InvocationFilter) ([]Invocation, error)
	// ClaimInvocations moves the oldest queued invocations the worker can
	// take into running on it and appends their run commands to its
	// command queue, in one transaction: a given invocation is claimed by
	// one worker only. The worker must be active and awake; it takes
	// invocations of its namespace in one of its queues (Worker.InQueue:
	// its effective membership and its poll queue, the rule an exec routed
	// to a queue follows too) and whose runner it
	// advertises (no runner: any worker with at least one), up to its free
	// capacity (max_invocations minus its running invocations; 0 is
	// unbounded) and at most c.Limit. A single-job worker claims one at
	// most, and none once it has its job (Worker.HasJob).
	ClaimInvocations(ctx context.Context, c Claim) ([]Invocation, error)
	// FinishInvocation moves an invocation into a terminal state, but only
	// from one of f.From (and, when f.WorkerID is set, only while it is on
	// that worker); applied is false when it was not in such a state. A
	// run command not yet delivered is withdrawn. Unknown is ErrNotFound.
	FinishInvocation(ctx context.Context, f Finish) (inv Invocation, applied bool, err error)
	// ReportRunning records what a worker said on poll about its running
	// invocations (stdout tails) and returns those of its running
	// invocations it received (their command acknowledged) yet has left
	// out of its reports for longer than r.MissingGrace, and how many of
	// its invocations are running (lost ones included: they are resolved
	// through FinishInvocation). With none running, an empty report only
	// reads.
	ReportRunning(ctx context.Context, r RunningReport) (lost []LostInvocation, running int, err error)
	// LostInvocations returns running invocations whose worker was
	// removed, is gone, restarted (the run command was acknowledged by a
	// non-empty incarnation other than the worker's current non-empty one:
	// a command delivered but not acknowledged is delivered again to the
	// new process instead), or was last seen before staleBefore (a worker
	// hibernating until after staleBefore is not stale, nor is a single-job
	// worker that took its job: it polls no more, by design, until it
	// exits), in that order of
	// reasons. It only reads; FinishInvocation resolves them.
	LostInvocations(ctx context.Context, staleBefore time.Time) ([]LostInvocation, error)
	// CancelInvocation cancels a queued invocation, or a running one whose
	// run command was not delivered yet (the command is withdrawn). It
	// returns the invocation as it reads afterwards and whether it was
	// cancelled; a running invocation already delivered is returned
	// unchanged with cancelled false.
	CancelInvocation(ctx context.Context, namespace, id string, errJSON []byte, now time.Time) (inv Invocation, cancelled bool, err error)
}

// NewInvocation is an invocation to queue. RunBody is the msgpack body of
// the run command, as it will be delivered.
type NewInvocation struct {
	ID                 string
	Namespace          string
	Queue              string
	Module             string
	Qualname           string
	Runner             string // "" means the daemon's default
	RunConfig          []byte // JSON object
	Args               []byte // inline args, nil when ArgsKey is set
	ArgsKey            string // payload-store key of large args
	ArgsSize           int64
	Script             *string
	AsUser             *string
	ParentInvocationID *string
	RootInvocationID   *string
	RunBody            []byte
	Now                time.Time
}

// Invocation is one invocation's row.
type Invocation struct {
	ID                 string
	Namespace          string
	Queue              string
	Module             string
	Qualname           string
	Runner             string
	RunConfig          []byte
	Args               []byte
	ArgsKey            string
	ArgsSize           int64
	Script             *string
	AsUser             *string
	ParentInvocationID *string
	RootInvocationID   *string
	RunBody            []byte
	State              string
	WorkerID           string
	WorkerLabel        string
	CommandID          string
	CreatedAt          time.Time
	StartedAt          *time.Time
	FinishedAt         *time.Time
	Result             []byte
	ResultSize         int64
	Error              []byte // JSON object, nil when none
	StdoutTail         string
	ReportedAt         *time.Time
}

// InvocationFilter selects invocations to list. Empty fields match all.
type InvocationFilter struct {
	Namespace string
	State     string
	Queue     string
	Limit     int
}

// Claim is one worker asking for work.
type Claim struct {
	WorkerID string
	Limit    int
	Now      time.Time
	// NewID names each run command created.
	NewID func() string
}

// Finish is a terminal outcome.
type Finish struct {
	ID       string
	State    string
	From     []string
	WorkerID string
	Result   []byte
	Error    []byte // JSON object or nil
	Now      time.Time
}

// RunningReport is one poll's statuses.
type RunningReport struct {
	WorkerID     string
	Statuses     []InvocationStatus
	Now          time.Time
	MissingGrace time.Duration
}

// LostInvocation is a running invocation whose worker is lost, and why.
type LostInvocation struct {
	ID          string
	Namespace   string
	WorkerID    string
	WorkerLabel string
	Reason      string
}

// LostExec is an exec whose worker is lost, and why. WorkerLabel is ""
// once the worker was removed.
type LostExec struct {
	ID          string
	Namespace   string
	WorkerID    string
	WorkerLabel string
	State       string // queued or running
	Reason      string
}
