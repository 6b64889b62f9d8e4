package operatorapi

import "nymph/messages"

// What a daemon reports in its own wire form (msgpack with the spec's
// snake_case names) is copied into these types for the operator, under this
// API's camelCase keys, rather than embedded as received. Their meaning is
// the wire type's named in each.

// ExecResult is how an exec ended (messages.ExecResult). ExitCode is the
// command's exit status, or messages.ExitTimeout / ExitFailed.
type ExecResult struct {
	ExitCode     int32       `json:"exitCode"`
	Stdout       string      `json:"stdout"`
	Stderr       string      `json:"stderr"`
	DurationMs   uint64      `json:"durationMs"`
	Error        *string     `json:"error"`
	ResultInline []byte      `json:"resultInline"`
	ResultRef    *PayloadRef `json:"resultRef"`
}

// ExecResultOf copies a daemon's exec result.
func ExecResultOf(r messages.ExecResult) ExecResult {
	out := ExecResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, DurationMs: r.DurationMs,
		Error: r.Error, ResultInline: []byte(r.ResultInline)}
	if r.ResultRef != nil {
		ref := PayloadRefOf(*r.ResultRef)
		out.ResultRef = &ref
	}
	return out
}

// PayloadRef names a blob in a payload store (messages.PayloadRef).
type PayloadRef struct {
	Bucket      string  `json:"bucket"`
	Key         string  `json:"key"`
	Size        uint64  `json:"size"`
	ContentType string  `json:"contentType"`
	SHA256      *string `json:"sha256"`
}

// PayloadRefOf copies a wire payload ref.
func PayloadRefOf(p messages.PayloadRef) PayloadRef {
	return PayloadRef{Bucket: p.Bucket, Key: p.Key, Size: p.Size, ContentType: p.ContentType, SHA256: p.SHA256}
}

// SetupOutcome is how a setup script ended (messages.SetupOutcome).
type SetupOutcome struct {
	Name       string  `json:"name"`
	State      string  `json:"state"`
	ExitCode   int32   `json:"exitCode"`
	DurationMs uint64  `json:"durationMs"`
	OutputTail string  `json:"outputTail"`
	Error      *string `json:"error,omitempty"`
}

// SetupOutcomeOf copies a daemon's setup outcome.
func SetupOutcomeOf(s messages.SetupOutcome) SetupOutcome {
	return SetupOutcome{Name: s.Name, State: s.State, ExitCode: s.ExitCode, DurationMs: s.DurationMs,
		OutputTail: s.OutputTail, Error: s.Error}
}

// OtaOutcome is how an update ended (messages.OtaOutcome); Outcome is one
// of messages.OtaInstalled, OtaAlreadyRunning, OtaRefused, and Code one of
// the messages.OtaCode* values.
type OtaOutcome struct {
	Source  string  `json:"source"`
	Version string  `json:"version"`
	Outcome string  `json:"outcome"`
	Code    string  `json:"code,omitempty"`
	Reason  *string `json:"reason,omitempty"`
	SHA256  string  `json:"sha256,omitempty"`
	Applies string  `json:"applies,omitempty"`
}

// OtaOutcomeOf copies a daemon's update outcome.
func OtaOutcomeOf(o messages.OtaOutcome) OtaOutcome {
	return OtaOutcome{Source: o.Source, Version: o.Version, Outcome: o.Outcome, Code: o.Code,
		Reason: o.Reason, SHA256: o.SHA256, Applies: o.Applies}
}
