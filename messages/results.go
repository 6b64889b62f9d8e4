package messages

import "github.com/vmihailenco/msgpack/v5"

// Exit-code sentinels of the exec result callback.
const (
	ExitFailed  int32 = -1 // spawn failure, wait error, cancellation at shutdown
	ExitTimeout int32 = -2 // killed after timeout_s
)

// OutputCap is the most stdout (and, separately, stderr) an exec result carries.
const OutputCap = 1 << 20

// Truncation values of ExecResult.Error.
const (
	ErrStdoutTruncated = "stdout truncated"
	ErrStderrTruncated = "stderr truncated"
	ErrBothTruncated   = "stdout truncated; stderr truncated"
)

// ExecResult is the body of POST /v1/daemon/exec/{exec_id}/result.
type ExecResult struct {
	ExitCode     int32       `msgpack:"exit_code" json:"exit_code"`
	Stdout       string      `msgpack:"stdout" json:"stdout"`
	Stderr       string      `msgpack:"stderr" json:"stderr"`
	DurationMs   uint64      `msgpack:"duration_ms" json:"duration_ms"`
	Error        *string     `msgpack:"error" json:"error"`
	ResultInline Bytes       `msgpack:"result_inline" json:"result_inline"`
	ResultRef    *PayloadRef `msgpack:"result_ref" json:"result_ref"`
}

// Invocation terminal states of an ack.
const (
	StateSucceeded = "succeeded"
	StateFailed    = "failed"
	StateKilled    = "killed"
	StateRunning   = "running"
)

// Ack is the body of POST /v1/daemon/ack, the terminal outcome of one run.
type Ack struct {
	InvocationID string    `msgpack:"invocation_id"`
	State        string    `msgpack:"state"`
	ResultBlob   Bytes     `msgpack:"result_blob"`
	Error        *AckError `msgpack:"error"`
	WorkerID     string    `msgpack:"worker_id,omitempty"`
}

func (a *Ack) normalize() {
	if a.ResultBlob == nil {
		a.ResultBlob = Bytes{}
	}
}

// AckError is the structured failure of a run. On the wire the field is
// "type", never a bare string.
type AckError struct {
	Type      string  `msgpack:"type" json:"type"`
	Message   string  `msgpack:"message" json:"message"`
	Traceback *string `msgpack:"traceback" json:"traceback,omitempty"`
}

// Error types the daemon itself produces.
const (
	ErrorTypeDaemon    = "DaemonError"
	ErrorTypeCancelled = "Cancelled"
	// ErrorTypeRefused is a run the daemon would not take: a single-job
	// daemon (keep_alive_s = 0) that already has its job refuses every
	// other one a control plane sends it, with an outcome, never silently.
	ErrorTypeRefused = "Refused"
	// ErrorTypeDaemonRestarted is a run the daemon was running when its
	// process died; the next start reports it, its outcome unknown.
	ErrorTypeDaemonRestarted = "DaemonRestarted"
	// CancelledShutdownMessage is the message of a run cancelled because the
	// daemon's shutdown grace ran out.
	CancelledShutdownMessage = "daemon shutdown grace expired"
)

// Event is the body of POST /v1/daemon/event: progress, log lines and other
// events of a running invocation, and the outcomes of setups and updates
// (see events.go). WorkerID is this project's extra, omitted when empty as
// the ack's is: it names the posting daemon when no signature does.
type Event struct {
	InvocationID string             `msgpack:"invocation_id"`
	Kind         string             `msgpack:"kind"`
	Data         msgpack.RawMessage `msgpack:"data"`
	TS           Epoch              `msgpack:"ts"`
	WorkerID     string             `msgpack:"worker_id,omitempty"`
}

// normalize sends missing data as nil: an empty raw message would write
// nothing at all and shift every key after it.
func (e *Event) normalize() {
	if len(e.Data) == 0 {
		e.Data = msgpack.RawMessage{0xc0}
	}
}

// ResultChunk is the body of POST /v1/daemon/result-chunk: one piece of a
// streamed result.
type ResultChunk struct {
	InvocationID string `msgpack:"invocation_id"`
	Seq          uint64 `msgpack:"seq"`
	Data         Bytes  `msgpack:"data"`
	Last         bool   `msgpack:"last"`
}

// normalize sends missing data as an empty bin, as a Vec<u8> always is.
func (r *ResultChunk) normalize() {
	if r.Data == nil {
		r.Data = Bytes{}
	}
}

// KeysRequest is the body of POST /v1/daemon/keys, signed by the outgoing
// key: the new public key (raw 32 bytes, base64url without padding) and the
// id derived from it.
type KeysRequest struct {
	WorkerID  string `msgpack:"worker_id"`
	PublicKey string `msgpack:"public_key"`
	KeyID     string `msgpack:"key_id"`
}

// KeysResponse accepts (KeyID set) or refuses (Reject set) a rotation.
type KeysResponse struct {
	KeyID  *string `msgpack:"key_id"`
	Reject *Reject `msgpack:"reject"`
}
