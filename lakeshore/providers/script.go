package providers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/providers/providerspec"

	"nymph/backoff"
	"nymph/runners/procgroup"
)

// ScriptProtocolVersion is the "version" of every request a script
// provider's command receives.
const ScriptProtocolVersion = 1

// ScriptExitThrottled is the exit status by which a script provider's
// command says "throttled, try again later" (EX_TEMPFAIL of sysexits.h).
const ScriptExitThrottled = 75

// Default bounds on one run of a script provider's command; Script's
// fields may change them.
const (
	DefaultScriptLaunchTimeout = 5 * time.Minute
	DefaultScriptCallTimeout   = time.Minute
)

// Default backoff between throttled attempts.
const (
	defaultScriptRetryMin = time.Second
	defaultScriptRetryMax = 30 * time.Second
)

// scriptKillGrace is how long a command that ran out of time gets between
// SIGTERM and SIGKILL (to its whole process group).
const scriptKillGrace = 5 * time.Second

// Caps on what is read back: an answer is small but a console log may be
// long; stderr is quoted in errors.
const (
	scriptAnswerCap = 4 << 20
	scriptStderrCap = 4 << 10
)

// ScriptProtocol is the contract between the control plane and a script
// provider's command.
const ScriptProtocol = providerspec.ScriptProtocol

// Script is the script launcher: every call runs the provider's command
// as ScriptProtocol describes, in a process group of its own that is
// killed whole when the call's time is up or its ctx ends.
//
// The fields bound each run and the retries of a throttled one; zero means
// the default. Set them before the first call; a Script is then safe for
// concurrent use.
type Script struct {
	// LaunchTimeout bounds one run of `COMMAND launch`
	// (DefaultScriptLaunchTimeout).
	LaunchTimeout time.Duration
	// CallTimeout bounds one run of terminate and console-log
	// (DefaultScriptCallTimeout).
	CallTimeout time.Duration
	// RetryMin and RetryMax bound the backoff between throttled runs
	// (1 s and 30 s).
	RetryMin, RetryMax time.Duration

	name string
	spec ScriptSpec
	log  zerolog.Logger
}

var _ Launcher = (*Script)(nil)

// NewScript is the launcher of script provider name.
func NewScript(name string, spec ScriptSpec, log zerolog.Logger) (*Script, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("script provider %s: %w", name, err)
	}
	return &Script{
		name: name,
		spec: spec,
		log:  log.With().Str("provider", name).Str("kind", string(KindScript)).Logger(),
	}, nil
}

// Check verifies that the command exists and is executable; it does not
// run it.
func (s *Script) Check(ctx context.Context) error {
	if _, err := exec.LookPath(s.spec.Command); err != nil {
		return fmt.Errorf("script provider %s: --command %s: %w", s.name, s.spec.Command, err)
	}
	return nil
}

// Launch runs `COMMAND launch`.
func (s *Script) Launch(ctx context.Context, req LaunchRequest) (Instance, error) {
	capacity := req.Capacity
	if len(capacity) == 0 {
		capacity = json.RawMessage("null")
	} else if !json.Valid(capacity) {
		return Instance{}, fmt.Errorf("script provider %s: capacity is not JSON", s.name)
	}
	answer, err := s.call(ctx, "launch", s.timeout(s.LaunchTimeout, DefaultScriptLaunchTimeout), struct {
		Version   int             `json:"version"`
		WorkerID  string          `json:"worker_id"`
		Name      string          `json:"name"`
		Bootstrap string          `json:"bootstrap"`
		Capacity  json.RawMessage `json:"capacity"`
	}{ScriptProtocolVersion, req.WorkerID, req.Name, req.Bootstrap, capacity})
	if err != nil {
		return Instance{}, err
	}
	id, err := answerString(answer, "instance_id")
	if err == nil && id == "" {
		err = errors.New(`"instance_id" is empty`)
	}
	if err != nil {
		return Instance{}, fmt.Errorf("script provider %s: launch: %w", s.name, err)
	}
	s.log.Info().Str("worker_id", req.WorkerID).Str("instance", id).Msg("instance launched")
	return Instance{ID: id}, nil
}

// Terminate runs `COMMAND terminate`.
func (s *Script) Terminate(ctx context.Context, instanceID string) error {
	_, err := s.call(ctx, "terminate", s.timeout(s.CallTimeout, DefaultScriptCallTimeout), struct {
		Version    int    `json:"version"`
		InstanceID string `json:"instance_id"`
	}{ScriptProtocolVersion, instanceID})
	if err == nil {
		s.log.Info().Str("instance", instanceID).Msg("instance terminated")
	}
	return err
}

// ConsoleLog runs `COMMAND console-log`; an answer {"gone":true} is
// ErrInstanceGone.
func (s *Script) ConsoleLog(ctx context.Context, instanceID string, latest bool) (string, error) {
	answer, err := s.call(ctx, "console-log", s.timeout(s.CallTimeout, DefaultScriptCallTimeout), struct {
		Version    int    `json:"version"`
		InstanceID string `json:"instance_id"`
		Latest     bool   `json:"latest"`
	}{ScriptProtocolVersion, instanceID, latest})
	if err != nil {
		return "", err
	}
	if raw, ok := answer["gone"]; ok {
		var gone bool
		if err := json.Unmarshal(raw, &gone); err != nil {
			return "", fmt.Errorf("script provider %s: console-log: \"gone\" must be true or false, not %s", s.name, raw)
		}
		if gone {
			return "", fmt.Errorf("script provider %s: instance %s: %w", s.name, instanceID, ErrInstanceGone)
		}
	}
	out, err := answerString(answer, "output")
	if err != nil {
		return "", fmt.Errorf("script provider %s: console-log: %w", s.name, err)
	}
	return out, nil
}

func (s *Script) timeout(set, def time.Duration) time.Duration {
	if set > 0 {
		return set
	}
	return def
}

// call runs `COMMAND op` with req on stdin, again after a backoff for as
// long as it exits throttled and ctx lasts, and returns its answer, a JSON
// object.
func (s *Script) call(ctx context.Context, op string, timeout time.Duration, req any) (map[string]json.RawMessage, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("script provider %s: %s: encode request: %w", s.name, op, err)
	}
	retry := backoff.New(s.timeout(s.RetryMin, defaultScriptRetryMin), s.timeout(s.RetryMax, defaultScriptRetryMax))
	for attempt := 1; ; attempt++ {
		out, res, err := s.run(ctx, op, timeout, body)
		if err != nil {
			return nil, err
		}
		if res.ExitCode == ScriptExitThrottled && res.Stopped == procgroup.NotStopped {
			delay := retry.Next()
			s.log.Warn().Str("op", op).Int("attempt", attempt).Dur("retry_in", delay).
				Str("stderr", lastBytes(res.StderrTail, 512)).Msg("throttled")
			if !backoff.Sleep(ctx, delay) {
				return nil, fmt.Errorf("script provider %s: %s: still throttled after %d attempts: %w", s.name, op, attempt, context.Cause(ctx))
			}
			continue
		}
		return s.answer(op, timeout, out, res)
	}
}

// run is one run of `COMMAND op`.
func (s *Script) run(ctx context.Context, op string, timeout time.Duration, body []byte) (*cappedBuffer, procgroup.Result, error) {
	out := &cappedBuffer{max: scriptAnswerCap}
	res, err := procgroup.Run(ctx, procgroup.Command{
		Argv:      []string{s.spec.Command, op},
		Input:     bytes.NewReader(body),
		Stdout:    out,
		Timeout:   timeout,
		KillGrace: scriptKillGrace,
	})
	if err != nil {
		return nil, res, fmt.Errorf("script provider %s: %s: %w", s.name, op, err)
	}
	return out, res, nil
}

// answer turns a run that was not throttled into the answer or an error.
func (s *Script) answer(op string, timeout time.Duration, out *cappedBuffer, res procgroup.Result) (map[string]json.RawMessage, error) {
	stderr := quoteStderr(res.StderrTail)
	prefix := fmt.Sprintf("script provider %s: %s %s", s.name, s.spec.Command, op)
	switch {
	case res.Stopped == procgroup.Timeout:
		return nil, fmt.Errorf("%s: no answer within %s, its process group was killed; stderr: %s", prefix, timeout, stderr)
	case res.Stopped == procgroup.Cancelled:
		return nil, fmt.Errorf("%s: stopped: %w", prefix, res.Cause)
	case res.ExitCode != 0:
		how := fmt.Sprintf("exit status %d", res.ExitCode)
		if res.ExitCode < 0 && res.State != nil {
			how = res.State.String()
		}
		return nil, fmt.Errorf("%s failed (%s): %s", prefix, how, stderr)
	case out.over:
		return nil, fmt.Errorf("%s: answer longer than %d bytes", prefix, scriptAnswerCap)
	}
	var answer map[string]json.RawMessage
	if err := json.Unmarshal(out.buf, &answer); err != nil || answer == nil {
		return nil, fmt.Errorf("%s: stdout is not a JSON object (%q): the answer must be one", prefix, lastBytes(bytes.TrimSpace(out.buf), 200))
	}
	return answer, nil
}

// quoteStderr is the last scriptStderrCap bytes of a run's stderr, from a
// line's start, for an error.
func quoteStderr(b []byte) string {
	cut := len(b) > scriptStderrCap
	if cut {
		b = b[len(b)-scriptStderrCap:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	switch q := strings.TrimSpace(string(b)); {
	case q == "":
		return "(nothing on stderr)"
	case cut:
		return "[...]\n" + q
	default:
		return q
	}
}

// answerString is the string field name of an answer.
func answerString(answer map[string]json.RawMessage, name string) (string, error) {
	raw, ok := answer[name]
	if !ok {
		return "", fmt.Errorf("the answer has no %q", name)
	}
	var v string
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", fmt.Errorf("%q must be a string, not %s", name, lastBytes(raw, 100))
	}
	return v, nil
}

// cappedBuffer keeps the first max bytes written to it and then fails, so
// that procgroup stops handing it more (the rest is drained and dropped).
type cappedBuffer struct {
	max  int
	buf  []byte
	over bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if len(b.buf)+len(p) > b.max {
		b.over = true
		return 0, errors.New("answer too long")
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}
