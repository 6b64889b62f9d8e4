package operatorapi

import (
	"encoding/json"
	"time"

	"nymph/messages"
)

// Routes of function invocations and of the payload store.
//
// The invocation bodies carry what the wire's `run` body carries, under
// this API's camelCase keys (runConfig.image, asUser, ...); a submit body
// may still use the wire's snake_case names (see InvocationRequest).
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
	Queue              string    `json:"queue,omitempty"`
	Function           string    `json:"function,omitempty"`
	Script             string    `json:"script,omitempty"`
	RunConfig          RunConfig `json:"runConfig"`
	Args               []byte    `json:"args,omitempty"`
	ArgsKey            string    `json:"argsKey,omitempty"`
	AsUser             string    `json:"asUser,omitempty"`
	ParentInvocationID string    `json:"parentInvocationId,omitempty"`
	RootInvocationID   string    `json:"rootInvocationId,omitempty"`
}

// UnmarshalJSON reads the camelCase keys and, so that a CLI from before
// they were camelCase keeps working, the snake_case ones it sent
// (run_config, run_config.timeout_s, args_key, as_user,
// parent_invocation_id, root_invocation_id). Where a body has both, the
// camelCase one wins.
func (r *InvocationRequest) UnmarshalJSON(b []byte) error {
	type plain InvocationRequest
	var old struct {
		plain
		OldRunConfig *struct {
			RunConfig
			OldTimeoutS *float64 `json:"timeout_s"`
		} `json:"run_config"`
		OldArgsKey            *string `json:"args_key"`
		OldAsUser             *string `json:"as_user"`
		OldParentInvocationID *string `json:"parent_invocation_id"`
		OldRootInvocationID   *string `json:"root_invocation_id"`
	}
	if err := json.Unmarshal(b, &old); err != nil {
		return err
	}
	// Which camelCase keys were present, so that an explicit empty one
	// still wins over its snake_case twin.
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	*r = InvocationRequest(old.plain)
	if rc := old.OldRunConfig; rc != nil {
		if _, ok := keys["runConfig"]; !ok {
			r.RunConfig = rc.RunConfig
			if rc.OldTimeoutS != nil && rc.TimeoutS == 0 {
				r.RunConfig.TimeoutS = *rc.OldTimeoutS
			}
		}
	}
	for _, f := range []struct {
		key string
		old *string
		dst *string
	}{
		{"argsKey", old.OldArgsKey, &r.ArgsKey},
		{"asUser", old.OldAsUser, &r.AsUser},
		{"parentInvocationId", old.OldParentInvocationID, &r.ParentInvocationID},
		{"rootInvocationId", old.OldRootInvocationID, &r.RootInvocationID},
	} {
		if _, ok := keys[f.key]; !ok && f.old != nil {
			*f.dst = *f.old
		}
	}
	return nil
}

// RunConfig is how to run an invocation: the wire's messages.RunConfig
// under this API's camelCase keys (timeoutS). Runner nil means the
// daemon's default runner.
type RunConfig struct {
	Runner   *string           `json:"runner,omitempty"`
	Image    string            `json:"image,omitempty"`
	TimeoutS float64           `json:"timeoutS,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Workdir  string            `json:"workdir,omitempty"`
}

// RunConfigOf copies the wire's run config into the operator's.
func RunConfigOf(c messages.RunConfig) RunConfig {
	return RunConfig{Runner: c.Runner, Image: c.Image, TimeoutS: c.TimeoutS, Env: c.Env, Workdir: c.Workdir}
}

// Wire is c as the daemon wire's run config.
func (c RunConfig) Wire() messages.RunConfig {
	return messages.RunConfig{Runner: c.Runner, Image: c.Image, TimeoutS: c.TimeoutS, Env: c.Env, Workdir: c.Workdir}
}

// InvocationSubmitted answers RouteSubmitInvocation (201). EligibleWorkers
// counts the daemons that, right now, poll a matching queue and advertise
// the runner; zero means the invocation waits until one turns up.
type InvocationSubmitted struct {
	Invocation      Invocation `json:"invocation"`
	EligibleWorkers int        `json:"eligibleWorkers"`
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
	RunConfig          RunConfig            `json:"runConfig"`
	ArgsSize           int64                `json:"argsSize"`
	ArgsKey            string               `json:"argsKey,omitempty"`
	AsUser             string               `json:"asUser,omitempty"`
	ParentInvocationID string               `json:"parentInvocationId,omitempty"`
	RootInvocationID   string               `json:"rootInvocationId,omitempty"`
	State              string               `json:"state"`
	WorkerID           string               `json:"workerId,omitempty"`
	WorkerLabel        string               `json:"workerLabel,omitempty"`
	CreatedAt          time.Time            `json:"createdAt"`
	StartedAt          *time.Time           `json:"startedAt,omitempty"`
	FinishedAt         *time.Time           `json:"finishedAt,omitempty"`
	Result             []byte               `json:"result,omitempty"`
	ResultSize         int64                `json:"resultSize"`
	Error              *messages.AckError   `json:"error,omitempty"`
	StdoutTail         string               `json:"stdoutTail,omitempty"`
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
	CommandID  string     `json:"commandId,omitempty"`
}

// PayloadBucket is the bucket name in the payload refs this control plane
// hands out; there is one store per control plane.
const PayloadBucket = "lakeshore"

// PayloadTTL is how long a presigned payload URL stays valid.
const PayloadTTL = 10 * time.Minute

// PayloadStored answers a PUT to a presigned URL (JSON, or msgpack when the
// request accepts it): the ref to hand to whoever reads the blob.
type PayloadStored = messages.PayloadRef
