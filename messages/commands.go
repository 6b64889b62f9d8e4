package messages

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// Command kinds. ota_update, reset_backoff and rotate_key are snake_case; the
// others are bare words. cancel is this project's extension: daemons that do
// not know it skip it as Unknown.
const (
	KindHibernate    = "hibernate"
	KindSetup        = "setup"
	KindExec         = "exec"
	KindOtaUpdate    = "ota_update"
	KindResetBackoff = "reset_backoff"
	KindRotateKey    = "rotate_key"
	KindRun          = "run"
	KindCancel       = "cancel"
)

// Hibernate makes the daemon stop polling until UntilEpochS on its own clock.
type Hibernate struct {
	UntilEpochS Epoch `msgpack:"until_epoch_s"`
}

// Setup is one host setup script, run serially in arrival order.
type Setup struct {
	Script              string  `msgpack:"script"`
	Sudo                bool    `msgpack:"sudo"`
	RefreshCapabilities bool    `msgpack:"refresh_capabilities"`
	Name                *string `msgpack:"name"`
}

// Exec is one shell command run under bash -c.
type Exec struct {
	ExecID        string            `msgpack:"exec_id"`
	Command       string            `msgpack:"command"`
	Env           map[string]string `msgpack:"env"`
	Stdin         string            `msgpack:"stdin"`
	Workdir       *string           `msgpack:"workdir"`
	TimeoutS      *float64          `msgpack:"timeout_s"`
	Log           *LogSink          `msgpack:"log"`
	PayloadInline Bytes             `msgpack:"payload_inline"`
	PayloadRef    *PayloadRef       `msgpack:"payload_ref"`
}

func (e *Exec) normalize() {
	if e.Env == nil {
		e.Env = map[string]string{}
	}
}

// LogSink asks the daemon to stream an exec's output instead of returning it
// in the result. StdinURL and ControlURL are reserved for interactive use.
type LogSink struct {
	StdoutURL  string  `msgpack:"stdout_url"`
	StdinURL   *string `msgpack:"stdin_url"`
	ControlURL *string `msgpack:"control_url"`
	FlushMs    uint64  `msgpack:"flush_ms"`
	FlushBytes uint64  `msgpack:"flush_bytes"`
}

// OtaUpdate replaces the running binary.
type OtaUpdate struct {
	Version string `msgpack:"version"`
	URL     string `msgpack:"url"`
	SHA256  string `msgpack:"sha256"`
}

// ResetBackoff collapses the poll backoff to retry_min_s. It has no body.
type ResetBackoff struct{}

// RotateKey asks the daemon for a new keypair. It has no body.
type RotateKey struct{}

// FunctionRef names the function a run calls.
type FunctionRef struct {
	Module   string `msgpack:"module" json:"module"`
	Qualname string `msgpack:"qualname" json:"qualname"`
}

// RunnerKinds are the runner kinds a daemon may advertise in
// capabilities.runners and a run may name in run_config.runner.
var RunnerKinds = []string{"process", "python", "docker", "gvisor", "slurm", "echo"}

// RunConfig selects and configures the runner of an invocation. Runner nil
// means the daemon's default_runner.
type RunConfig struct {
	Runner   *string           `msgpack:"runner" json:"runner,omitempty"`
	Image    string            `msgpack:"image,omitempty" json:"image,omitempty"`
	TimeoutS float64           `msgpack:"timeout_s,omitempty" json:"timeout_s,omitempty"`
	Env      map[string]string `msgpack:"env,omitempty" json:"env,omitempty"`
	Workdir  string            `msgpack:"workdir,omitempty" json:"workdir,omitempty"`
}

// Run is one function invocation. PayloadRef, when set, carries arguments
// too large to inline (this project's extension of the run body).
type Run struct {
	InvocationID       string      `msgpack:"invocation_id"`
	Function           FunctionRef `msgpack:"function"`
	RunConfig          RunConfig   `msgpack:"run_config"`
	ArgsBlob           Bytes       `msgpack:"args_blob"`
	ParentInvocationID *string     `msgpack:"parent_invocation_id"`
	RootInvocationID   *string     `msgpack:"root_invocation_id"`
	Script             *string     `msgpack:"script"`
	AsUser             *string     `msgpack:"as_user"`
	PayloadRef         *PayloadRef `msgpack:"payload_ref,omitempty"`
}

func (r *Run) normalize() {
	if r.ArgsBlob == nil {
		r.ArgsBlob = Bytes{}
	}
}

// Cancel stops one running exec or invocation without stopping the daemon.
type Cancel struct {
	InvocationID *string `msgpack:"invocation_id"`
	ExecID       *string `msgpack:"exec_id"`
}

// Unknown is a command whose kind is not known or whose body does not fit
// its kind. It is logged and skipped, never fatal.
type Unknown struct {
	ID     string
	Kind   string
	Reason string
}

var sha256Hex = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[0-9a-fA-F]{64}$`) })

// ValidSHA256 reports whether s is exactly 64 ASCII hex characters.
func ValidSHA256(s string) bool { return sha256Hex().MatchString(s) }

// DecodeCommand decodes c.Body by c.Kind into one of *Hibernate, *Setup,
// *Exec, *OtaUpdate, ResetBackoff, RotateKey, *Run, *Cancel; anything else,
// including a body that does not decode or lacks a required field, becomes
// Unknown with the reason.
func DecodeCommand(c Command) any {
	v, err := decodeCommand(c)
	if err != nil {
		return Unknown{ID: c.ID, Kind: c.Kind, Reason: err.Error()}
	}
	return v
}

func decodeCommand(c Command) (any, error) {
	body := []byte(c.Body)
	switch c.Kind {
	case KindResetBackoff:
		return ResetBackoff{}, nil
	case KindRotateKey:
		return RotateKey{}, nil
	case KindHibernate:
		var b Hibernate
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if b.UntilEpochS <= 0 {
			return nil, errors.New("field until_epoch_s: missing or not positive")
		}
		return &b, nil
	case KindSetup:
		var b Setup
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if b.Script == "" {
			return nil, errors.New("field script: missing or empty")
		}
		return &b, nil
	case KindExec:
		var b Exec
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if b.ExecID == "" {
			return nil, errors.New("field exec_id: missing or empty")
		}
		if b.TimeoutS != nil && *b.TimeoutS < 0 {
			return nil, fmt.Errorf("field timeout_s: %v is negative", *b.TimeoutS)
		}
		if b.Log != nil && b.Log.StdoutURL == "" {
			return nil, errors.New("field log.stdout_url: missing or empty")
		}
		return &b, nil
	case KindOtaUpdate:
		var b OtaUpdate
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if b.URL == "" {
			return nil, errors.New("field url: missing or empty")
		}
		return &b, nil
	case KindRun:
		var b Run
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if b.InvocationID == "" {
			return nil, errors.New("field invocation_id: missing or empty")
		}
		return &b, nil
	case KindCancel:
		var b Cancel
		if err := decodeBody(body, &b); err != nil {
			return nil, err
		}
		if (b.InvocationID == nil || *b.InvocationID == "") && (b.ExecID == nil || *b.ExecID == "") {
			return nil, errors.New("field invocation_id or exec_id: one is required")
		}
		return &b, nil
	default:
		return nil, fmt.Errorf("unknown command kind %q", c.Kind)
	}
}

func decodeBody(body []byte, v any) error {
	if len(body) == 0 || (len(body) == 1 && body[0] == 0xc0) {
		return errors.New("body: missing")
	}
	if body[0]&0xf0 != 0x80 && body[0] != 0xde && body[0] != 0xdf {
		return errors.New("body: not a map")
	}
	if err := Unmarshal(body, v); err != nil {
		if name, ferr := badField(body, v); ferr != nil {
			return fmt.Errorf("field %s: %w", name, ferr)
		}
		return err
	}
	return nil
}

// badField finds the first field of the struct v points to whose value in
// the map body does not decode, so a refusal names the field at fault
// rather than only the msgpack code it tripped on. A body Scan refuses is
// left alone: its refusal says what is wrong, and decoding it here would
// size allocations by the lengths Scan refused.
func badField(body []byte, v any) (string, error) {
	if _, err := Scan(body); err != nil {
		return "", nil
	}
	var raw map[string]msgpack.RawMessage
	if msgpack.Unmarshal(body, &raw) != nil {
		return "", nil
	}
	t := reflect.TypeOf(v).Elem()
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("msgpack"), ",")
		r, ok := raw[name]
		if !ok {
			continue
		}
		if err := msgpack.Unmarshal(r, reflect.New(f.Type).Interface()); err != nil {
			return name, err
		}
	}
	return "", nil
}

// EncodeCommand builds a Command from a typed body, for the control plane and
// for tests. A nil body (reset_backoff, rotate_key) is sent as nil.
func EncodeCommand(id, kind string, body any) (Command, error) {
	if body == nil {
		return Command{ID: id, Kind: kind, Body: msgpack.RawMessage{0xc0}}, nil
	}
	raw, err := Marshal(body)
	if err != nil {
		return Command{}, err
	}
	return Command{ID: id, Kind: kind, Body: raw}, nil
}
