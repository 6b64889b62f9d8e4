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
	"time"
)

// ErrNotFound is returned (wrapped) when a worker, exec or token does not exist.
var ErrNotFound = errors.New("store: not found")

// Worker states are operatorapi's State* (all but StateStale, which
// readers derive and nothing stores); exec states are its Exec*.

// Command states, as listed for inspection.
const (
	CommandQueued    = "queued"
	CommandDelivered = "delivered"
	CommandAcked     = "acked"
)

// Command kinds the store treats specially. They match the wire names.
const (
	KindSetup     = "setup"
	KindHibernate = "hibernate"
)

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
	Close() error
}

// Nonces records the signature nonces replicas share, so a signed request
// replayed to another replica is refused.
type Nonces interface {
	// UseNonce records (keyID, nonce) until expires and reports whether
	// the pair was new; of concurrent calls for one pair, on any number of
	// stores sharing the database, exactly one reports it new. Pairs that
	// expired by now are dropped from time to time.
	UseNonce(ctx context.Context, keyID, nonce string, expires, now time.Time) (bool, error)
}

// Workers holds worker rows.
type Workers interface {
	// Hello creates the worker identified by (Namespace, MachineID, Label)
	// with id NewID, or refreshes the existing one and returns it unchanged
	// in identity. created reports which happened.
	Hello(ctx context.Context, h Hello) (w Worker, created bool, err error)
	// Worker returns one worker; namespace "" matches any namespace.
	Worker(ctx context.Context, namespace, id string) (Worker, error)
	// ListWorkers returns the namespace's workers ordered by label, then id.
	ListWorkers(ctx context.Context, namespace string) ([]Worker, error)
	// RecordPoll notes a poll: last seen, poll queue, running invocations,
	// merged capabilities. A non-nil Cursor acknowledges every command with
	// seq <= Cursor (clamped to what was ever delivered). Afterwards a
	// joining worker, or a setting_up one with no setup awaiting
	// acknowledgement, becomes active.
	RecordPoll(ctx context.Context, p Poll) (Worker, error)
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
	// joining worker into setting_up; a hibernate records HibernatingUntil.
	Enqueue(ctx context.Context, c NewCommand, e *NewExec) (Command, error)
	// Take returns up to limit unacknowledged commands of a worker with
	// seq > after, in order, ending early after a hibernate (the daemon
	// drops whatever follows one in a batch). They are marked delivered and
	// their execs running; with ackNow they are acknowledged at once (the
	// legacy delete-on-delivery). An unknown worker is ErrNotFound.
	Take(ctx context.Context, workerID string, after int64, limit int, ackNow bool, now time.Time) ([]Command, error)
	// ListCommands returns a worker's commands in sequence order.
	ListCommands(ctx context.Context, workerID string) ([]Command, error)
	// Command returns one command by id, whatever its worker and state.
	Command(ctx context.Context, id string) (Command, error)
}

// Execs holds shell execs, their streamed output and their results.
type Execs interface {
	Exec(ctx context.Context, id string) (Exec, error)
	// AppendOutput appends data to an exec's streamed output and returns the
	// new total length.
	AppendOutput(ctx context.Context, id string, data []byte) (int64, error)
	// Output returns up to max bytes of streamed output starting at offset.
	Output(ctx context.Context, id string, offset int64, max int) ([]byte, error)
	// FinishExec records the result of an exec. A second result for the same
	// exec changes nothing and reports applied false.
	FinishExec(ctx context.Context, id string, result []byte, now time.Time) (applied bool, err error)
	// OpenExecs counts queued and running execs per worker of a namespace.
	OpenExecs(ctx context.Context, namespace string) (map[string]int, error)
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
	// SetupPending counts setup commands not yet acknowledged.
	SetupPending int
	// Queues above is the effective membership: Lanes plus QueuesAdded,
	// minus QueuesRemoved (see EffectiveQueues). Lanes are what the daemon
	// named on its last hello; the other two are the operator's edits,
	// which a re-hello keeps.
	Lanes         []string
	QueuesAdded   []string
	QueuesRemoved []string
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
	Now          time.Time
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

// NewCommand is a command to enqueue. Body is the msgpack body as sent.
type NewCommand struct {
	ID       string
	WorkerID string
	Kind     string
	Body     []byte
	Now      time.Time
	// HibernateUntil is recorded on the worker for a hibernate command.
	HibernateUntil *time.Time
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
