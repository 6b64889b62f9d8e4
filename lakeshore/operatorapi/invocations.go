package operatorapi

import (
	"time"

	"nymph/messages"
)

// Routes of function invocations and of the payload store.
//
// The invocation bodies mirror the wire's `run` body, so their fields are
// snake_case like it (run_config.image, as_user, ...), unlike the rest of
// this API; the presign body is camelCase because the protocol spells it so.
//
// RoutePresign accepts msgpack from daemons (daemon bearer) and JSON from
// operators (admin token), chosen by Content-Type, and answers in kind.
// RoutePayload is a capability URL handed out by RoutePresign: the token in
// the path is unguessable and expires, and it is the only credential GET
// and PUT need there.
const (
	RouteSubmitInvocation = "POST /v1/namespaces/{ns}/invocations"
	RouteListInvocations  = "GET /v1/namespaces/{ns}/invocations"
	RouteGetInvocation    = "GET /v1/namespaces/{ns}/invocations/{inv_id}"
	RouteCancelInvocation = "POST /v1/namespaces/{ns}/invocations/{inv_id}/cancel"
	RoutePresign          = "POST /v1/namespaces/{ns}/payloads/presign"
	RoutePayloadGet       = "GET /v1/payloads/{token}"
	RoutePayloadPut       = "PUT /v1/payloads/{token}"
)

// Invocation states. Queued waits for a daemon; running has been handed to
// one; the other four are terminal. Cancelled means an operator cancelled it
// before any daemon received it; a running invocation that is cancelled
// ends killed (the daemon stops it and acks).
const (
	InvocationQueued    = "queued"
	InvocationRunning   = "running"
	InvocationSucceeded = "succeeded"
	InvocationFailed    = "failed"
	InvocationKilled    = "killed"
	InvocationCancelled = "cancelled"
)

// InvocationTerminal reports whether state is final.
func InvocationTerminal(state string) bool {
	switch state {
	case InvocationSucceeded, InvocationFailed, InvocationKilled, InvocationCancelled:
		return true
	}
	return false
}

// Error types the control plane itself puts on an invocation.
const (
	// ErrorTypeWorkerLost: the daemon running it restarted without it,
	// went stale past the lost deadline, was removed, or stopped reporting
	// it.
	ErrorTypeWorkerLost = "WorkerLost"
	// ErrorTypeCancelled: cancelled by an operator before dispatch.
	ErrorTypeCancelled = messages.ErrorTypeCancelled
)

// DefaultQueue is the queue of an invocation submitted without one, and
// the queue of a daemon that polls without one.
const DefaultQueue = "default"

// Limits of the invocation routes.
const (
	// MaxWait caps the wait query parameter of RouteGetInvocation.
	MaxWait = 20 * time.Second
	// DefaultListLimit and MaxListLimit bound RouteListInvocations.
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// InvocationRequest submits one function invocation (RouteSubmitInvocation).
//
// Exactly one of Function ("module:qualname"; for the process, docker,
// gvisor and slurm runners the module is the command and the qualname its
// argument, and a bare "module" is accepted) and Script (bash script text)
// is required. Queue defaults to DefaultQueue. RunConfig.Runner absent
// means the daemon's default runner; "docker" needs RunConfig.Image. Args
// are raw bytes (base64 in JSON), at most messages.MaxPayload; above
// messages.InlineThreshold the control plane keeps them in its payload
// store and the daemon fetches them by reference. ArgsKey instead names a
// blob already uploaded through RoutePresign (then Args must be empty).
type InvocationRequest struct {
	Queue              string             `json:"queue,omitempty"`
	Function           string             `json:"function,omitempty"`
	Script             string             `json:"script,omitempty"`
	RunConfig          messages.RunConfig `json:"run_config"`
	Args               []byte             `json:"args,omitempty"`
	ArgsKey            string             `json:"args_key,omitempty"`
	AsUser             string             `json:"as_user,omitempty"`
	ParentInvocationID string             `json:"parent_invocation_id,omitempty"`
	RootInvocationID   string             `json:"root_invocation_id,omitempty"`
}

// InvocationSubmitted answers RouteSubmitInvocation (201). EligibleWorkers
// counts the daemons that, right now, poll a matching queue and advertise
// the runner; zero means the invocation waits until one turns up.
type InvocationSubmitted struct {
	Invocation      Invocation `json:"invocation"`
	EligibleWorkers int        `json:"eligible_workers"`
}

// Invocation is one function invocation as the operator sees it
// (RouteGetInvocation). Query parameter wait=<seconds> (at most MaxWait)
// long-polls until the state changes or is terminal. Result is the raw
// result bytes (base64 in JSON), set only when succeeded; Error is set when
// failed, killed or cancelled. StdoutTail is the last output the daemon
// reported while it ran. List views leave Result out.
type Invocation struct {
	ID                 string               `json:"id"`
	Namespace          string               `json:"namespace"`
	Queue              string               `json:"queue"`
	Function           messages.FunctionRef `json:"function"`
	Script             string               `json:"script,omitempty"`
	RunConfig          messages.RunConfig   `json:"run_config"`
	ArgsSize           int64                `json:"args_size"`
	ArgsKey            string               `json:"args_key,omitempty"`
	AsUser             string               `json:"as_user,omitempty"`
	ParentInvocationID string               `json:"parent_invocation_id,omitempty"`
	RootInvocationID   string               `json:"root_invocation_id,omitempty"`
	State              string               `json:"state"`
	WorkerID           string               `json:"worker_id,omitempty"`
	WorkerLabel        string               `json:"worker_label,omitempty"`
	CreatedAt          time.Time            `json:"created_at"`
	StartedAt          *time.Time           `json:"started_at,omitempty"`
	FinishedAt         *time.Time           `json:"finished_at,omitempty"`
	Result             []byte               `json:"result,omitempty"`
	ResultSize         int64                `json:"result_size"`
	Error              *messages.AckError   `json:"error,omitempty"`
	StdoutTail         string               `json:"stdout_tail,omitempty"`
}

// InvocationList is the body of RouteListInvocations, newest first. Query
// parameters: state (one of the Invocation* states), queue (exact name),
// limit (1..MaxListLimit, default DefaultListLimit).
type InvocationList struct {
	Invocations []Invocation `json:"invocations"`
}

// CancelInvocationResponse answers RouteCancelInvocation. Queued (and
// dispatched but not yet received) invocations are cancelled at once
// (Cancelled true, 200); a running one gets a cancel command queued to its
// daemon (CommandID set, 202) and ends killed when the daemon acks.
type CancelInvocationResponse struct {
	Invocation Invocation `json:"invocation"`
	Cancelled  bool       `json:"cancelled"`
	CommandID  string     `json:"command_id,omitempty"`
}

// PayloadBucket is the bucket name in the payload refs this control plane
// hands out; there is one store per control plane.
const PayloadBucket = "lakeshore"

// PayloadTTL is how long a presigned payload URL stays valid.
const PayloadTTL = 10 * time.Minute

// PayloadStored answers a PUT to a presigned URL (JSON, or msgpack when the
// request accepts it): the ref to hand to whoever reads the blob.
type PayloadStored = messages.PayloadRef
