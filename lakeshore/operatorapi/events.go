package operatorapi

import (
	"time"
)

// RouteInvocationLogs reads the output a run streamed (its invocation.log
// events), in order, from a cursor. Query parameters: after=<seq> (the
// Next of the previous page; default 0, the start), max_bytes=<n> (the
// most output data in one answer, default DefaultLogBytes, at most
// MaxLogBytes; one event always fits), and wait=<seconds> (at most
// MaxWait: long-poll until there is output after the cursor or the
// invocation's state changes).
const RouteInvocationLogs = "GET /v1/namespaces/{ns}/invocations/{inv_id}/logs"

// Limits of RouteInvocationLogs.
const (
	DefaultLogBytes = 64 << 10
	MaxLogBytes     = 4 << 20
	// MaxLogEvents bounds the events of one answer, whatever their size.
	MaxLogEvents = 1000
)

// InvocationLogs is one page of an invocation's output. State is the
// invocation's state when the page was read: once it is terminal and More
// is false, the output is complete (unless the daemon still posts what it
// could not post in time: it keeps that on disk and posts it later). Next
// is the cursor to continue from; More says further output is there
// already.
type InvocationLogs struct {
	InvocationID string     `json:"invocationId"`
	State        string     `json:"state"`
	Events       []LogEvent `json:"events"`
	Next         int64      `json:"next"`
	More         bool       `json:"more"`
}

// LogEvent is one piece of a run's output, of one stream. Data is the raw
// bytes (base64 in JSON). Dropped counts the bytes lost right before it:
// the daemon's buffer overflowed while the control plane could not be
// reached.
type LogEvent struct {
	Seq     int64     `json:"seq"`
	Stream  string    `json:"stream"`
	Data    []byte    `json:"data"`
	TS      time.Time `json:"ts"`
	Dropped uint64    `json:"dropped,omitempty"`
}

// WorkerOutcomesShown is how many recent outcomes RouteGetWorker lists.
const WorkerOutcomesShown = 10

// WorkerOutcome is how one setup or update of a worker ended, as its daemon
// reported it. Kind is messages.EventSetupFinished or EventOtaFinished;
// CommandID is the setup's or the ota_update's command id (for an update
// the daemon started itself, messages.AutoUpdateEventID); At is when the
// daemon finished it; exactly one of Setup and Ota is set.
type WorkerOutcome struct {
	Kind       string        `json:"kind"`
	CommandID  string        `json:"commandId"`
	At         time.Time     `json:"at"`
	ReceivedAt time.Time     `json:"receivedAt"`
	Setup      *SetupOutcome `json:"setup,omitempty"`
	Ota        *OtaOutcome   `json:"ota,omitempty"`
}
