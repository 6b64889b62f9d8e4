// Package store owns the control plane's durable state: worker rows, the
// per-worker command queue with its cursor, execs and their streamed output,
// tokens, and what daemons report about invocations. It declares the Store
// contract and the domain types; implementations live in subpackages
// (sqlite, the embedded default, and postgres, both running the SQL of
// sqlstore).
//
// Times are passed in by the caller, never read from a clock here, so that
// the control plane's injected clock decides what "now" is. Every method is
// safe for concurrent use and either commits entirely or not at all.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrNotFound is returned (wrapped) when a worker, exec or token does not exist.
var ErrNotFound = errors.New("store: not found")

// Refusals of what a worker reports for an exec that is not running
// (AppendOutput, FinishRunningExec), wrapped; nothing was stored.
var (
	// ErrExecNotDelivered: the exec is queued, not handed to its worker yet.
	ErrExecNotDelivered = errors.New("store: exec not delivered to its worker yet")
	// ErrExecFinished: the exec has its result already.
	ErrExecFinished = errors.New("store: exec already finished")
)

// Refusals of Hello by the token rules (see Hello.TokenID), wrapped;
// nothing was written.
var (
	// ErrTokenBound: the hello's token is bound to another worker, which
	// still exists.
	ErrTokenBound = errors.New("store: token bound to another worker")
	// ErrWorkerOwned: the worker the hello names is bound to another
	// token, neither revoked nor expired.
	ErrWorkerOwned = errors.New("store: worker bound to another token")
)

// SingleJobError refuses a job (an exec or a run command) for a single-job
// worker that already has its job: handed over to it (Delivered), or queued
// for it and not delivered yet. Nothing was stored.
type SingleJobError struct {
	WorkerID string
	// Job names the job it has: "exec <exec id>", "run <invocation id>",
	// or "command <command id>".
	Job       string
	Delivered bool
}

func (e *SingleJobError) Error() string {
	verb := "has its job queued"
	if e.Delivered {
		verb = "already took its job"
	}
	return fmt.Sprintf("store: worker %s is single-job and %s (%s)", e.WorkerID, verb, e.Job)
}

// Worker states are operatorapi's State* (all but StateStale, which
// readers derive and nothing stores); exec states are its Exec*.

// Command states, as listed for inspection.
const (
	CommandQueued    = "queued"
	CommandDelivered = "delivered"
	CommandAcked     = "acked"
)

// Command kinds the store treats specially. They match the wire names.
// Exec and run commands (KindExec, KindRun) are jobs: a single-job worker
// is handed one at most.
const (
	KindSetup     = "setup"
	KindHibernate = "hibernate"
	KindExec      = "exec"
)

// IsJob reports whether a command of kind is a job.
func IsJob(kind string) bool { return kind == KindExec || kind == KindRun }

// Token kinds.
const (
	TokenDaemon = "daemon"
	TokenEnroll = "enroll"
)

// Store is everything the control plane keeps.
type Store interface {
	Workers
	Commands
	Execs
	Tokens
	Reports
	Queues
	TargetVersions
	Keys
	Invocations
	Nonces
	Events
	Providers
	Payloads
	Sessions
	Counts
	// Ready reports whether the store answers and its schema has every
	// migration this binary embeds (an error naming what is wrong if not),
	// for a readiness probe: cheap, and it writes nothing.
	Ready(ctx context.Context) error
	Close() error
}

// Nonces records the signature nonces of accepted requests, so a signed
// request replayed after a restart, or to another replica, is refused.
type Nonces interface {
	// UseNonces records every pair in one transaction and reports, for
	// each, whether it was new: fresh[i] answers uses[i]. Of concurrent
	// calls recording one pair, on any number of stores sharing the
	// database, exactly one reports it new; a pair listed twice in one
	// call is new at most at its first place. The pairs are durable once
	// it returns.
	UseNonces(ctx context.Context, uses []NonceUse) (fresh []bool, err error)
	// PurgeNonces drops the pairs that expired by now and returns how
	// many it dropped.
	PurgeNonces(ctx context.Context, now time.Time) (int64, error)
}

// NonceUse is one (key, nonce) pair to record, kept until Expires.
type NonceUse struct {
	KeyID, Nonce string
	Expires      time.Time
}

// Workers holds worker rows.
type Workers interface {
	// Hello creates the worker identified by (Namespace, MachineID, Label)
	// with id NewID, or refreshes the existing one and returns it unchanged
	// in identity. created reports which happened. The token rules of
	// Hello.TokenID and Hello.Fleet, and the key of Hello.AddKey or
	// Hello.RebindKey, are applied in the same transaction: a hello they
	// refuse (ErrTokenBound, ErrWorkerOwned, ErrKeyExists,
	// ErrKeyNotCurrent) writes nothing, not even the incarnation. The worker's incarnation
	// becomes h.Incarnation (also when that is ""): from then on a running
	// job whose command another non-empty incarnation acknowledged is lost
	// (LostRestarted, see LostInvocations and LostExecs).
	// SingleJob is stored as
	// said. A single-job daemon sends nothing but its outcome once it has its
	// job, so a hello from a worker whose job has ended (its exec finished,
	// its invocation in a final state) comes from a new daemon process: every
	// command delivered to the old one is acknowledged (it will not be
	// delivered again) and the worker may be handed one job again. A job not
	// ended stays the worker's job, to be delivered again while not
	// acknowledged. A hello without SingleJob clears the worker's job.
	Hello(ctx context.Context, h Hello) (w Worker, created bool, err error)
	// Worker returns one worker; namespace "" matches any namespace.
	Worker(ctx context.Context, namespace, id string) (Worker, error)
	// ListWorkers returns the namespace's workers ordered by label, then id.
	ListWorkers(ctx context.Context, namespace string) ([]Worker, error)
	// WorkersByLabel returns the namespace's workers whose label is label,
	// ordered by id (an empty list when none is).
	WorkersByLabel(ctx context.Context, namespace, label string) ([]Worker, error)
	// RecordPoll notes a poll: last seen, poll queue, running invocations,
	// merged capabilities. A non-nil Cursor acknowledges every command with
	// seq <= Cursor (clamped to what was ever delivered), on behalf of the
	// worker's current incarnation. Afterwards a
	// joining worker, or a setting_up one with no setup awaiting
	// acknowledgement, becomes active.
	RecordPoll(ctx context.Context, p Poll) (Worker, error)
	// AckThrough notes a poll whose only news is its cursor: every command
	// with seq <= cursor (clamped to what was ever delivered) is
	// acknowledged on behalf of the worker's current incarnation, as
	// RecordPoll acknowledges, and nothing else of the worker is written
	// (its last seen is the caller's to note, with TouchWorkers). It
	// returns the worker's acknowledged seq afterwards.
	AckThrough(ctx context.Context, workerID string, cursor int64, now time.Time) (int64, error)
	// TouchWorkers records that each worker was seen at its time (polls
	// that changed nothing else, noted in memory and written in batches):
	// a worker's last seen becomes the later of the stored time and the
	// given one. It commits in chunks, each on its own (a failure may
	// leave the earlier ones written), and returns the ids no worker row
	// has.
	TouchWorkers(ctx context.Context, seen []Seen) (missing []string, err error)
	// DeleteWorker removes one worker and its command queue; its execs stay
	// readable.
	DeleteWorker(ctx context.Context, namespace, id string) error
	// DeleteWorkersSeenBefore removes the namespace's workers last seen
	// before t and returns their ids.
	DeleteWorkersSeenBefore(ctx context.Context, namespace string, t time.Time) ([]string, error)
}

// Commands is the per-worker command queue. Each command gets the next
// per-worker sequence number; delivery and acknowledgement follow it.
type Commands interface {
	// Enqueue appends a command to a worker's queue, and with it the exec row
	// when e is non-nil (atomically). A setup command puts an active or
	// joining worker into setting_up. A hibernate records HibernatingUntil
	// on a worker that is not hibernating; one queued behind the
	// hibernation in force is recorded when Take delivers it, so the worker
	// shows the deadline it serves. A wake (a hibernate whose HibernateUntil
	// is not after Now) withdraws the hibernates not yet delivered.
	// A job for a single-job worker that already has its job (Worker.HasJob)
	// is refused with a *SingleJobError. With c.Namespace set, a worker of
	// another namespace is not found, and nothing is queued. The command
	// returned tells of the worker as the enqueue left it (Command.Worker).
	// With c.DeliverAfter set, an exec command is also delivered in the
	// same transaction, as Take would (its exec running), when that poll
	// would take it alone: nothing else undelivered, everything delivered
	// up to *c.DeliverAfter, and not a single-job worker. The command
	// returned then has DeliveredAt set.
	Enqueue(ctx context.Context, c NewCommand, e *NewExec) (Command, error)
	// Take returns up to limit unacknowledged commands of a worker with
	// seq > after, in order, ending early after a hibernate (the daemon
	// drops whatever follows one in a batch), whose deadline becomes the
	// worker's HibernatingUntil. They are marked delivered and
	// their execs running; with ackNow they are acknowledged at once (the
	// legacy delete-on-delivery), on behalf of the worker's current
	// incarnation. A single-job worker is handed one job at
	// most: the first job command taken becomes its job (JobSeq), and a
	// batch ends before any other job command, which stays queued and is
	// never delivered to it while it has that job; the job itself is
	// delivered again as long as it is not acknowledged (an answer lost on
	// the way). An unknown worker is ErrNotFound.
	Take(ctx context.Context, workerID string, after int64, limit int, ackNow bool, now time.Time) ([]Command, error)
	// WakePending reports whether a wake waits unacknowledged after seq
	// after: what a hibernating daemon's watch poll waits for.
	WakePending(ctx context.Context, workerID string, after int64) (bool, error)
	// ListCommands returns a worker's commands in sequence order.
	ListCommands(ctx context.Context, workerID string) ([]Command, error)
	// Command returns one command by id, whatever its worker and state.
	Command(ctx context.Context, id string) (Command, error)
}

// Execs holds shell execs, their streamed output and their results.
type Execs interface {
	Exec(ctx context.Context, id string) (Exec, error)
	// AppendOutput appends data to a running exec's streamed output and
	// returns the new total length. An exec not running is refused with
	// ErrExecNotDelivered or ErrExecFinished, its output unchanged.
	AppendOutput(ctx context.Context, id string, data []byte) (int64, error)
	// Output returns up to max bytes of streamed output starting at offset.
	Output(ctx context.Context, id string, offset int64, max int) ([]byte, error)
	// FinishExec records the result of an exec. A second result for the same
	// exec changes nothing and reports applied false.
	FinishExec(ctx context.Context, id string, result []byte, now time.Time) (applied bool, err error)
	// FinishRunningExec records the result its worker posts for an exec:
	// only while the exec is running (delivered, not finished), checked
	// and applied in one transaction, so of a result and the lost sweep's
	// FinishExec exactly one wins. Otherwise it is ErrExecNotDelivered or
	// ErrExecFinished and nothing changes. It returns the exec as it
	// finished.
	FinishRunningExec(ctx context.Context, id string, result []byte, now time.Time) (Exec, error)
	// OpenExecs counts queued and running execs per worker of a namespace.
	OpenExecs(ctx context.Context, namespace string) (map[string]int, error)
	// LostExecs returns the execs, of every namespace, that will never get
	// a result from their worker, oldest first: queued or running ones
	// whose worker was removed (LostRemoved) or is gone (LostGone), and
	// running ones whose command was acknowledged by a non-empty
	// incarnation other than the worker's current non-empty one
	// (LostRestarted) or whose worker was last seen before staleBefore and
	// is not hibernating past it (LostStale). It only reads: resolving
	// them goes through FinishExec, so a real result that comes first wins.
	LostExecs(ctx context.Context, staleBefore time.Time) ([]LostExec, error)
	// ListExecs returns a namespace's execs (one worker's, with
	// f.WorkerID), newest first, at most f.Limit; Result is read, the
	// streamed output is not.
	ListExecs(ctx context.Context, f ExecFilter) ([]Exec, error)
}

// ExecFilter narrows ListExecs.
type ExecFilter struct {
	Namespace string
	// WorkerID "" is every worker's.
	WorkerID string
	Limit    int
}

// Tokens holds minted tokens, by the sha256 of their secret.
type Tokens interface {
	CreateToken(ctx context.Context, t Token) error
	TokenByHash(ctx context.Context, hash string) (Token, error)
	// ListTokens returns every token, oldest first.
	ListTokens(ctx context.Context) ([]Token, error)
	// RevokeToken marks token id revoked at at and returns it; a token
	// already revoked keeps its first time. ErrNotFound when there is none.
	RevokeToken(ctx context.Context, id string, at time.Time) (Token, error)
}

// Reports keeps what daemons post about invocations. Each is idempotent:
// a repeat of an already stored ack or chunk changes nothing.
type Reports interface {
	SaveAck(ctx context.Context, a Ack) (applied bool, err error)
	SaveResultChunk(ctx context.Context, c ResultChunk) (applied bool, err error)
}

// Capabilities is what a host says it can run.
type Capabilities struct {
	Runners        []string `json:"runners"`
	MaxInvocations uint32   `json:"max_invocations"`
	Workdir        string   `json:"workdir"`
}

// InvocationStatus is one running invocation as last reported on poll.
type InvocationStatus struct {
	InvocationID string    `json:"invocation_id"`
	State        string    `json:"state"`
	StartedAt    time.Time `json:"started_at"`
	ExitCode     *int32    `json:"exit_code,omitempty"`
	StdoutTail   string    `json:"stdout_tail,omitempty"`
}

// Worker is one daemon's row.
type Worker struct {
	ID               string
	Namespace        string
	MachineID        string
	HelloLabel       string // the label as the daemon said it; part of the identity
	Label            string // HelloLabel, or ID when that was empty
	State            string
	Tags             []string
	Queues           []string
	Capabilities     Capabilities
	Versions         json.RawMessage // a JSON object
	PollQueue        string
	Running          []InvocationStatus
	CreatedAt        time.Time
	LastSeenAt       time.Time
	HibernatingUntil *time.Time
	// LastSeq is the last sequence number given to one of its commands,
	// DeliveredSeq the highest ever delivered, AckedSeq the highest
	// acknowledged; every command up to AckedSeq is acknowledged.
	LastSeq      int64
	DeliveredSeq int64
	AckedSeq     int64
	// Incarnation is the process the last hello came from ("" when the
	// daemon names none).
	Incarnation string
	// SetupPending counts setup commands not yet acknowledged.
	SetupPending int
	// Queues above is the effective membership: Lanes plus QueuesAdded,
	// minus QueuesRemoved (see EffectiveQueues). Lanes are what the daemon
	// named on its last hello; the other two are the operator's edits,
	// which a re-hello keeps.
	Lanes         []string
	QueuesAdded   []string
	QueuesRemoved []string
	// SingleJob is what the daemon said on its last hello: it takes one job
	// (keep_alive_s = 0). JobSeq is the sequence number of the job command
	// handed to it (0: none yet); JobsQueued counts its job commands
	// queued and not delivered yet.
	SingleJob  bool
	JobSeq     int64
	JobsQueued int
	// Provider and InstanceID name what launched the worker (a registered
	// provider, and its id for the instance); both "" for a daemon started
	// any other way, InstanceID "" until the launcher has answered.
	Provider   string
	InstanceID string
}

// HasJob reports a single-job worker that has its job, handed over or
// queued for it: it is given no other.
func (w Worker) HasJob() bool {
	return w.SingleJob && (w.JobSeq > 0 || w.JobsQueued > 0)
}

// Hello is what a hello writes.
type Hello struct {
	NewID        string
	Namespace    string
	MachineID    string
	Label        string
	Tags         []string
	Queues       []string
	Capabilities Capabilities
	Versions     json.RawMessage
	// Incarnation names the daemon process saying hello: new with every
	// process start, the same on a re-hello of one process; "" when the
	// daemon does not say (the original one).
	Incarnation string
	// SingleJob is the daemon's single_job: it takes one job at most.
	SingleJob bool
	Now       time.Time

	// TokenID is the daemon token the hello came with when that token is
	// one worker's (not a fleet token): the hello binds the token to its
	// worker, or is refused with ErrTokenBound when the token is bound to
	// another worker that still exists (a token whose worker row was
	// deleted binds again), or with ErrWorkerOwned when the worker is
	// bound to another token that is neither revoked nor expired (a
	// worker whose token is, is taken over: that token is unbound).
	TokenID string
	// Adopt is the token (daemon or enrollment) the hello came with, when
	// the hello may adopt the pending row a launch made for that token's
	// worker (see LaunchWorker); "" adopts nothing.
	Adopt string
	// Fleet says the hello came with a fleet credential (a fleet token or
	// the shared bootstrap token): it is refused with ErrWorkerOwned by a
	// worker bound to a live token, and binds nothing. With neither TokenID
	// nor Fleet (a hello its key admitted) bindings are not looked at.
	Fleet bool
	// AddKey, when set, becomes the worker's current key (its WorkerID is
	// filled in), revoking the one it had; a stored key id is ErrKeyExists.
	AddKey *Key
	// RebindKey, when set, moves that key to the hello's worker if the
	// hello's worker is not RebindKey.From (see Keys.RebindKey).
	RebindKey *KeyRebind
}

// KeyRebind names a current key and the worker it belongs to.
type KeyRebind struct {
	KeyID string
	From  string
}

// Poll is what a poll writes.
type Poll struct {
	WorkerID            string
	Queue               string
	Running             []InvocationStatus
	UpdatedCapabilities *Capabilities
	Cursor              *int64
	Now                 time.Time
}

// Seen is one worker seen at a time (TouchWorkers).
type Seen struct {
	WorkerID string
	At       time.Time
}

// NewCommand is a command to enqueue. Body is the msgpack body as sent.
type NewCommand struct {
	ID       string
	WorkerID string
	// Namespace, when set, is the worker's: a worker of another namespace
	// is not found.
	Namespace string
	Kind      string
	Body      []byte
	Now       time.Time
	// HibernateUntil is a hibernate command's deadline (see Enqueue); not
	// after Now, the command is a wake.
	HibernateUntil *time.Time
	// DeliverAfter, for an exec, is the cursor of a poll of the worker
	// waiting for its next command: see Enqueue.
	DeliverAfter *int64
}

// Command is a queued, delivered or acknowledged command.
type Command struct {
	ID          string
	WorkerID    string
	Seq         int64
	Kind        string
	Body        []byte
	CreatedAt   time.Time
	DeliveredAt *time.Time
	AckedAt     *time.Time
	// Ends, from Enqueue of a wake only, is the deadline of the hibernation
	// in force that the wake ends (nil: the worker was not hibernating).
	Ends *time.Time
	// Worker, from Enqueue only, is the worker as the enqueue left it.
	Worker EnqueuedWorker
}

// EnqueuedWorker is what Enqueue tells of the worker it queued for: what
// an operator's answer shows of it, so the caller that addressed the
// worker by id needs no read of its own.
type EnqueuedWorker struct {
	Namespace, Label, State string
	LastSeenAt              time.Time
	HibernatingUntil        *time.Time
}

// State is queued, delivered or acked.
func (c Command) State() string {
	switch {
	case c.AckedAt != nil:
		return CommandAcked
	case c.DeliveredAt != nil:
		return CommandDelivered
	default:
		return CommandQueued
	}
}

// NewExec is the exec row created with its command.
type NewExec struct {
	ID        string
	Namespace string
	Command   string
	Stream    bool
}

// Exec is one shell exec. Result is opaque to the store.
type Exec struct {
	ID         string
	Namespace  string
	WorkerID   string
	CommandID  string
	Command    string
	Stream     bool
	State      string
	CreatedAt  time.Time
	StartedAt  *time.Time
	FinishedAt *time.Time
	Result     []byte
	OutputLen  int64
}

// Token is a minted token; the secret itself is never stored.
type Token struct {
	ID         string
	Kind       string
	Namespace  string
	Label      string
	Hash       string // hex sha256 of the secret
	CreatedAt  time.Time
	ExpiresAt  *time.Time
	ConsumedAt *time.Time
	RevokedAt  *time.Time
	// Fleet marks a daemon token minted for a whole fleet: it is never
	// bound, so its holders can act for each other's workers.
	Fleet bool
	// WorkerID is the worker a daemon token is bound to (by the first
	// hello made with it), "" while it is not bound.
	WorkerID string
}

// Live reports whether the token is neither revoked nor expired at now.
func (t Token) Live(now time.Time) bool {
	return t.RevokedAt == nil && (t.ExpiresAt == nil || now.Before(*t.ExpiresAt))
}

// Ack is the terminal outcome of one invocation. Error is a JSON object or nil.
type Ack struct {
	InvocationID string
	WorkerID     string
	State        string
	ResultBlob   []byte
	Error        json.RawMessage
	ReceivedAt   time.Time
}

// Event is one record a daemon posted to /v1/daemon/event (see Events);
// Data is msgpack. InvocationID is an invocation's id, or the command id of
// the setup or update an outcome reports.
type Event struct {
	ID           string
	InvocationID string
	WorkerID     string
	Kind         string
	Data         []byte
	TS           time.Time
	ReceivedAt   time.Time
	// Seq orders an invocation's pieces of output and makes a repeat of
	// one a no-op; an outcome has Seq 0 (one per command). Nil: neither.
	Seq *int64
	// Size is how many bytes of output a piece carries (what pages of
	// output are capped by); 0 for other events.
	Size int64
}

// ResultChunk is one piece of a streamed invocation result.
type ResultChunk struct {
	InvocationID string
	Seq          uint64
	Data         []byte
	Last         bool
	ReceivedAt   time.Time
}
