package messages

import (
	"strconv"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Kinds of the events this daemon posts to /v1/daemon/event. A log event
// belongs to a run (InvocationID is the invocation); an outcome belongs to
// the command it reports (InvocationID is the command id of the setup or
// the ota_update), or, for an update the daemon started on its own
// (auto_update), to AutoUpdateEventID.
const (
	EventInvocationLog = "invocation.log"
	EventSetupFinished = "setup.finished"
	EventOtaFinished   = "ota.finished"
)

// MaxLogPiece is the most output one invocation.log event carries.
const MaxLogPiece = 1 << 20

// Streams of a log event.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// LogData is the data of an invocation.log event: one piece of one stream
// of a run's output. Seq numbers the pieces of a run from 1, across both
// streams, in the order they were produced; the control plane keeps the
// first copy of each seq, so a repeated post is harmless. Dropped counts the
// bytes that were lost right before this piece, because the daemon could
// not post them for long enough that its buffer overflowed (the oldest go
// first).
type LogData struct {
	Stream  string `msgpack:"stream" json:"stream"`
	Seq     uint64 `msgpack:"seq" json:"seq"`
	Data    Bytes  `msgpack:"data" json:"data"`
	Dropped uint64 `msgpack:"dropped,omitempty" json:"dropped,omitempty"`
}

func (l *LogData) normalize() {
	if l.Data == nil {
		l.Data = Bytes{}
	}
}

// SetupOutcomeTail bounds SetupOutcome.OutputTail.
const SetupOutcomeTail = 4 << 10

// SetupOutcome is the data of a setup.finished event: how one setup script
// ended. State is succeeded or failed; ExitCode is the script's exit code,
// or ExitFailed when it could not be run (Error says why) or was killed.
// OutputTail is the last few KiB of its stdout and stderr together.
type SetupOutcome struct {
	Name       string  `msgpack:"name" json:"name"`
	State      string  `msgpack:"state" json:"state"`
	ExitCode   int32   `msgpack:"exit_code" json:"exit_code"`
	DurationMs uint64  `msgpack:"duration_ms" json:"duration_ms"`
	OutputTail string  `msgpack:"output_tail" json:"output_tail"`
	Error      *string `msgpack:"error" json:"error,omitempty"`
}

// OTA outcomes.
const (
	// OtaInstalled: the new binary is in place; Applies says when it runs.
	OtaInstalled = "installed"
	// OtaAlreadyRunning: this binary already is that release.
	OtaAlreadyRunning = "already_running"
	// OtaRefused: nothing was installed; Code and Reason say why, and the
	// running binary is untouched.
	OtaRefused = "refused"
)

// Codes of a refused OTA.
const (
	OtaCodeChecksumMismatch = "checksum_mismatch"
	OtaCodeInvalidCommand   = "invalid_command"
	OtaCodeNotExecutable    = "not_executable"
	OtaCodeBusy             = "busy"
	OtaCodeStopping         = "stopping"
	OtaCodeFailed           = "failed" // a download, a write, a rename
)

// When an installed binary runs.
const (
	OtaAppliesNow         = "now"          // the daemon drains and execs it
	OtaAppliesNextRestart = "next_restart" // self-exec is off
)

// OtaOutcome is the data of an ota.finished event: how one update ended.
// Source is ota_update (a command) or auto_update (the daemon followed the
// control plane's target version).
type OtaOutcome struct {
	Source  string  `msgpack:"source" json:"source"`
	Version string  `msgpack:"version" json:"version"`
	Outcome string  `msgpack:"outcome" json:"outcome"`
	Code    string  `msgpack:"code,omitempty" json:"code,omitempty"`
	Reason  *string `msgpack:"reason" json:"reason,omitempty"`
	SHA256  string  `msgpack:"sha256" json:"sha256,omitempty"`
	Applies string  `msgpack:"applies,omitempty" json:"applies,omitempty"`
}

// Sources of an OTA.
const (
	OtaSourceCommand = KindOtaUpdate
	OtaSourceAuto    = "auto_update"
)

// AutoUpdateEventPrefix starts the InvocationID of the outcome of an update
// the daemon started on its own: no command names it.
const AutoUpdateEventPrefix = "auto-update-"

// AutoUpdateEventID is the InvocationID of the outcome of one auto-update
// attempt: the version and the attempt's start in unix milliseconds, stable
// across the retries of one post and distinct between attempts.
func AutoUpdateEventID(version string, started time.Time) string {
	return AutoUpdateEventPrefix + version + "-" + strconv.FormatInt(started.UnixMilli(), 10)
}

// IsAutoUpdateEventID reports whether id names an auto-update outcome.
func IsAutoUpdateEventID(id string) bool {
	return strings.HasPrefix(id, AutoUpdateEventPrefix) && len(id) > len(AutoUpdateEventPrefix)
}

// NewEvent builds an event whose data is v encoded; the caller posts it.
func NewEvent(invocationID, kind, workerID string, v any, ts time.Time) (*Event, error) {
	data, err := Marshal(v)
	if err != nil {
		return nil, err
	}
	return &Event{InvocationID: invocationID, Kind: kind, Data: msgpack.RawMessage(data), TS: Epoch(ts.Unix()), WorkerID: workerID}, nil
}
