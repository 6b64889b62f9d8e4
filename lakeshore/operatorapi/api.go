package operatorapi

import (
	"encoding/json"
	"time"
)

// DefaultNamespace is used when none is given.
const DefaultNamespace = "default"

// Routes, as net/http method+path patterns. {ns} is the namespace, {id} a
// worker id, {exec_id} an exec id, {inv_id} an invocation id.
const (
	RouteListWorkers = "GET /v1/namespaces/{ns}/workers"
	RouteGetWorker   = "GET /v1/namespaces/{ns}/workers/{id}"
	RouteKillWorker  = "DELETE /v1/namespaces/{ns}/workers/{id}"
	RouteCleanup     = "POST /v1/namespaces/{ns}/workers/cleanup"
	RouteWorkerExec  = "POST /v1/namespaces/{ns}/workers/{id}/exec"
	RouteQueueExec   = "POST /v1/namespaces/{ns}/exec"
	RouteGetExec     = "GET /v1/namespaces/{ns}/execs/{exec_id}"
	// RouteListExecs lists execs, newest first (ExecList).
	RouteListExecs    = "GET /v1/namespaces/{ns}/execs"
	RouteSetup        = "POST /v1/namespaces/{ns}/workers/{id}/setup"
	RouteHibernate    = "POST /v1/namespaces/{ns}/workers/{id}/hibernate"
	RouteWake         = "POST /v1/namespaces/{ns}/workers/{id}/wake"
	RouteReset        = "POST /v1/namespaces/{ns}/workers/{id}/reset"
	RouteCancel       = "POST /v1/namespaces/{ns}/workers/{id}/cancel"
	RouteCreateToken  = "POST /v1/tokens"
	RouteListTokens   = "GET /v1/tokens"
	RouteRevokeToken  = "DELETE /v1/tokens/{token_id}"
	RouteListCommands = "GET /v1/namespaces/{ns}/workers/{id}/commands"
)

// Error is the body of every non-2xx operator response.
type Error struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// Worker states. Stale is derived at read time, never stored.
const (
	StatePending   = "pending"
	StateSettingUp = "setting_up"
	StateJoining   = "joining"
	StateActive    = "active"
	StateGone      = "gone"
	StateStale     = "stale"
)

// StaleAfter is how old lastSeenAt may be before a worker reads back stale.
const StaleAfter = 60 * time.Second

// Worker is one daemon as the operator sees it.
type Worker struct {
	ID           string             `json:"id"`
	Namespace    string             `json:"namespace"`
	MachineID    string             `json:"machineId"`
	Label        string             `json:"label"`
	State        string             `json:"state"`
	StoredState  string             `json:"storedState"`
	Tags         []string           `json:"tags"`
	Queues       []string           `json:"queues"`
	Runners      []string           `json:"runners"`
	Capabilities Capabilities       `json:"capabilities"`
	Versions     json.RawMessage    `json:"versions"`
	PollQueue    string             `json:"pollQueue"`
	CreatedAt    time.Time          `json:"createdAt"`
	LastSeenAt   time.Time          `json:"lastSeenAt"`
	Hibernating  *time.Time         `json:"hibernatingUntil,omitempty"`
	SetupPending int                `json:"setupPending"`
	Running      []InvocationStatus `json:"running"`
	// OpenExecs counts the shell execs queued for or running on it.
	OpenExecs int       `json:"openExecs"`
	Keys      []KeyInfo `json:"keys"`
	// SingleJob: the daemon said in hello that it takes one job and exits
	// (keep_alive_s = 0). SingleJobTaken: it has that job, handed over or
	// queued for it, and is given no other; once handed over it polls no
	// more, so it reads stale until its job ends and it exits.
	SingleJob      bool `json:"singleJob"`
	SingleJobTaken bool `json:"singleJobTaken"`
	// LastSetup is how the newest setup the daemon ran ended (nil: none
	// reported); Outcomes, in RouteGetWorker only, lists the recent setup
	// and update outcomes, newest first (at most WorkerOutcomesShown).
	LastSetup *WorkerOutcome  `json:"lastSetup,omitempty"`
	Outcomes  []WorkerOutcome `json:"outcomes,omitempty"`
	// Provider and InstanceID name what launched the daemon (a registered
	// provider, its id for the instance); empty for one started otherwise.
	Provider   string `json:"provider,omitempty"`
	InstanceID string `json:"instanceId,omitempty"`
}

// Capabilities is what a daemon last said it can run, with the operator
// API's camelCase keys (the daemon's wire form is messages.Capabilities).
type Capabilities struct {
	Runners        []string `json:"runners"`
	MaxInvocations uint32   `json:"maxInvocations"`
	Workdir        string   `json:"workdir"`
}

// InvocationStatus mirrors what the daemon last reported on poll.
type InvocationStatus struct {
	InvocationID string    `json:"invocationId"`
	State        string    `json:"state"`
	StartedAt    time.Time `json:"startedAt"`
	StdoutTail   string    `json:"stdoutTail,omitempty"`
}

// KeyInfo describes one enrolled key; never a secret.
type KeyInfo struct {
	KeyID     string     `json:"keyId"`
	CreatedAt time.Time  `json:"createdAt"`
	RevokedAt *time.Time `json:"revokedAt,omitempty"`
}

// WorkerList is the body of RouteListWorkers. Its query parameters
// (the Worker* names below) filter and page it on the server: state (the
// derived one, stale included), queue (a queue the worker is a member
// of), labelPrefix, and limit/offset over the matching workers in label
// order. Without them every worker is listed.
type WorkerList struct {
	Workers []Worker `json:"workers"`
	// Total is how many workers match the filter, paged or not.
	Total int `json:"total"`
	// Counts is how many of the namespace's workers are in each state,
	// whatever the filter, in the order of States.
	Counts []StateCount `json:"counts"`
}

// StateCount is how many workers are in one state.
type StateCount struct {
	State string `json:"state"`
	Count int    `json:"count"`
}

// States lists every state a worker reads back in, stale included.
var States = []string{StateActive, StateStale, StateJoining, StateSettingUp, StatePending, StateGone}

// Query parameters of RouteListWorkers.
const (
	WorkerQueryState       = "state"
	WorkerQueryQueue       = "queue"
	WorkerQueryLabelPrefix = "labelPrefix"
	WorkerQueryLimit       = "limit"
	WorkerQueryOffset      = "offset"
	// MaxWorkerPage is the largest limit; MaxWorkerFilter the longest
	// queue or label prefix.
	MaxWorkerPage   = 1000
	MaxWorkerFilter = 256
)

// ExecRequest submits a shell command to one worker (RouteWorkerExec) or to
// any eligible member of Queue (RouteQueueExec). Stdin is raw bytes (base64
// in JSON). Stream asks the daemon to stream output as it is produced.
type ExecRequest struct {
	Command  string            `json:"command"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
	Stdin    []byte            `json:"stdin,omitempty"`
	TimeoutS float64           `json:"timeoutS,omitempty"`
	Stream   bool              `json:"stream"`
	Queue    string            `json:"queue,omitempty"`
}

// ExecAccepted answers an ExecRequest.
//
// With the query parameter wait=<seconds> (at most 20) the answer is two
// JSON documents, one per line (application/x-ndjson): this one, flushed as
// soon as the command is queued, then an Exec as RouteGetExec with offset 0
// returns it, once the exec has finished or has output, or the wait has
// passed (a state change alone does not end this wait). A client that loses the
// connection after the first line knows the exec id and carries on with
// RouteGetExec; a short command costs one request instead of two.
type ExecAccepted struct {
	ExecID   string `json:"execId"`
	WorkerID string `json:"workerId"`
	// Label is the worker's label, for messages about where the exec went.
	Label string `json:"label,omitempty"`
	// WorkerState is the worker's state as the exec was queued (stale
	// derived, as in Worker.State), HibernatingUntil its hibernation
	// deadline when that is still ahead, and LastSeenAt when it last spoke:
	// what tells the operator that the exec may wait before anything runs.
	WorkerState      string     `json:"workerState,omitempty"`
	HibernatingUntil *time.Time `json:"hibernatingUntil,omitempty"`
	LastSeenAt       *time.Time `json:"lastSeenAt,omitempty"`
}

// ContentTypeNDJSON is the content type of an exec submission with wait.
const ContentTypeNDJSON = "application/x-ndjson"

// Exec states.
const (
	ExecQueued   = "queued"
	ExecRunning  = "running"
	ExecFinished = "finished"
)

// Exec is the body of RouteGetExec. Query parameters: wait=<seconds> (long
// poll until something changes, at most 20) and offset=<n> (Output starts
// at byte n of the streamed output). Output holds streamed bytes from
// Offset; NextOffset is where the next call continues.
type Exec struct {
	ExecID     string      `json:"execId"`
	WorkerID   string      `json:"workerId"`
	Command    string      `json:"command"`
	State      string      `json:"state"`
	CreatedAt  time.Time   `json:"createdAt"`
	Output     []byte      `json:"output,omitempty"`
	Offset     int64       `json:"offset"`
	NextOffset int64       `json:"nextOffset"`
	Result     *ExecResult `json:"result,omitempty"`
}

// ExecList is the body of RouteListExecs, newest first. Query
// parameters: worker (a worker id: only its execs), limit
// (1..MaxListLimit, default DefaultListLimit).
type ExecList struct {
	Execs []ExecSummary `json:"execs"`
}

// ExecSummary is one exec in a list: where it is and how it ended,
// without its output.
type ExecSummary struct {
	ExecID     string     `json:"execId"`
	WorkerID   string     `json:"workerId"`
	Command    string     `json:"command"`
	State      string     `json:"state"`
	CreatedAt  time.Time  `json:"createdAt"`
	StartedAt  *time.Time `json:"startedAt,omitempty"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
	// ExitCode and Error, once finished, are its result's.
	ExitCode *int32  `json:"exitCode,omitempty"`
	Error    *string `json:"error,omitempty"`
}

// SetupRequest queues a setup script on a worker.
type SetupRequest struct {
	Script              string `json:"script"`
	Sudo                bool   `json:"sudo"`
	RefreshCapabilities bool   `json:"refreshCapabilities"`
	Name                string `json:"name,omitempty"`
}

// Queued answers any request that queued a command.
type Queued struct {
	CommandID string `json:"commandId"`
	WorkerID  string `json:"workerId"`
	Kind      string `json:"kind"`
}

// Woken answers RouteWake. The wake is a hibernate whose deadline is the
// moment it was queued: every daemon understands it (an old one only once
// the hibernation it serves is over), and it withdraws the hibernates not
// yet delivered. HibernatingUntil is the hibernation in force when it was
// queued (absent: the daemon was awake). A daemon that keeps a watch poll
// open while it hibernates (nymph does, with this control plane) polls
// again at once; one that does not takes the wake at that deadline.
type Woken struct {
	Queued
	HibernatingUntil *time.Time `json:"hibernatingUntil,omitempty"`
}

// HibernateRequest: Until is unix seconds; a deadline in the past is a 400.
type HibernateRequest struct {
	UntilEpochS int64 `json:"untilEpochS"`
}

// CancelRequest stops a running exec or invocation on a worker.
type CancelRequest struct {
	ExecID       string `json:"execId,omitempty"`
	InvocationID string `json:"invocationId,omitempty"`
}

// CleanupRequest deletes workers whose lastSeenAt is older than
// OlderThanHours (0 < h <= 168).
type CleanupRequest struct {
	OlderThanHours float64 `json:"olderThanHours"`
	DryRun         bool    `json:"dryRun"`
}

// MaxCleanupHours is the server cap on CleanupRequest.OlderThanHours.
const MaxCleanupHours = 168

// CleanupResponse lists what was (or, dry, would be) deleted.
type CleanupResponse struct {
	Count   int      `json:"count"`
	DryRun  bool     `json:"dryRun"`
	Deleted []Worker `json:"deleted"`
}

// KillResponse answers RouteKillWorker.
// Query: terminate=false removes only the row. Terminated says the
// instance was terminated through its provider; Note says why not when
// it was not (no provider launched the daemon, or terminate=false).
type KillResponse struct {
	Deleted    string `json:"deleted"`
	Terminated bool   `json:"terminated"`
	Provider   string `json:"provider,omitempty"`
	InstanceID string `json:"instanceId,omitempty"`
	Note       string `json:"note,omitempty"`
}

// Token kinds.
const (
	TokenDaemon = "daemon"
	TokenEnroll = "enroll"
)

// TokenRequest mints a daemon bearer token or a one-shot enrollment token.
// A daemon token is bound to the worker of the first hello made with it;
// Fleet mints one that is never bound, for several daemons to share (their
// holders can act for each other's workers unless daemon identity is on).
type TokenRequest struct {
	Kind  string `json:"kind"`
	TTLS  int64  `json:"ttlS,omitempty"`
	Label string `json:"label,omitempty"`
	Fleet bool   `json:"fleet,omitempty"`
}

// TokenResponse carries the secret once; it is never shown again. ID
// names the token in RouteListTokens and RouteRevokeToken.
type TokenResponse struct {
	Token     string     `json:"token"`
	ID        string     `json:"id"`
	Kind      string     `json:"kind"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	Fleet     bool       `json:"fleet"`
}

// Token states, derived when a token is read.
const (
	TokenActive   = "active"
	TokenRevoked  = "revoked"
	TokenExpired  = "expired"
	TokenConsumed = "consumed"
)

// TokenInfo describes a minted token, never its secret.
type TokenInfo struct {
	ID         string     `json:"id"`
	Kind       string     `json:"kind"`
	Label      string     `json:"label,omitempty"`
	State      string     `json:"state"`
	CreatedAt  time.Time  `json:"createdAt"`
	ExpiresAt  *time.Time `json:"expiresAt,omitempty"`
	ConsumedAt *time.Time `json:"consumedAt,omitempty"`
	RevokedAt  *time.Time `json:"revokedAt,omitempty"`
	// Fleet marks a daemon token that is never bound to a worker.
	Fleet bool `json:"fleet"`
	// WorkerID is the worker a daemon token is bound to, "" while no
	// hello has used it (and always for a fleet or enrollment token).
	WorkerID string `json:"workerId"`
}

// TokenList is the body of RouteListTokens, oldest first.
type TokenList struct {
	Tokens []TokenInfo `json:"tokens"`
}

// CommandInfo is one queued or delivered command, for inspection.
type CommandInfo struct {
	ID        string    `json:"id"`
	Kind      string    `json:"kind"`
	State     string    `json:"state"`
	CreatedAt time.Time `json:"createdAt"`
}
