// Package protocol owns the host side of the function protocol that every
// process-based runner speaks: the layout of an invocation's scratch
// directory (args, result, error and script files), the protocol's
// environment variables, turning how a command ended plus the files it
// left into a runners.Outcome, and (Host) the run of such a command from
// spec to outcome, so that each runner keeps only what differs: which
// command runs, where, and what it leaves outside its process group.
package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"nymph/messages"
	"nymph/runners"
	"nymph/runners/procgroup"
)

// File names inside the scratch directory.
const (
	ArgsFile   = "args"
	ResultFile = "result"
	ErrorFile  = "error"
	ScriptFile = "script"
)

// stderrLines is how many trailing stderr lines a NonZeroExit message keeps.
const stderrLines = 20

// Files are the protocol paths of one invocation, either as the host sees
// them or as seen from inside a container.
type Files struct {
	Dir    string
	Args   string
	Result string
	Error  string
	Script string
}

// FilesIn lays the protocol files out in dir.
func FilesIn(dir string) Files {
	return Files{
		Dir:    dir,
		Args:   filepath.Join(dir, ArgsFile),
		Result: filepath.Join(dir, ResultFile),
		Error:  filepath.Join(dir, ErrorFile),
		Script: filepath.Join(dir, ScriptFile),
	}
}

// Prepare writes the args file into the scratch directory. Stale result
// and error files are removed so that they cannot be mistaken for this
// run's.
func Prepare(spec runners.Spec) (Files, error) {
	if spec.ScratchDir == "" {
		return Files{}, errors.New("spec.ScratchDir is required")
	}
	f := FilesIn(spec.ScratchDir)
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return Files{}, fmt.Errorf("scratch dir: %w", err)
	}
	if err := os.WriteFile(f.Args, spec.Args, 0o600); err != nil {
		return Files{}, fmt.Errorf("write args: %w", err)
	}
	for _, p := range []string{f.Result, f.Error} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			return Files{}, fmt.Errorf("clear %s: %w", filepath.Base(p), err)
		}
	}
	return f, nil
}

// WriteScript writes spec.Script to the script file.
func WriteScript(f Files, script string) error {
	if err := os.WriteFile(f.Script, []byte(script), 0o600); err != nil {
		return fmt.Errorf("write script: %w", err)
	}
	return nil
}

// CheckEnv rejects environment entries a process cannot carry.
func CheckEnv(env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fmt.Errorf("run_config.env: invalid variable name %q", k)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("run_config.env: value of %s contains a NUL byte", k)
		}
	}
	return nil
}

// Env returns the protocol variables of spec, with the paths as view names
// them.
func Env(spec runners.Spec, view Files) map[string]string {
	return map[string]string{
		runners.EnvArgsPath:           view.Args,
		runners.EnvResultPath:         view.Result,
		runners.EnvErrorPath:          view.Error,
		runners.EnvInvocationID:       spec.InvocationID,
		runners.EnvParentInvocationID: spec.ParentInvocationID,
		runners.EnvRootInvocationID:   spec.RootInvocationID,
	}
}

// HostEnv is the environment of a host child: the daemon's own environment,
// then spec.Env on top, then the protocol variables, which always win.
func HostEnv(spec runners.Spec, f Files, extra map[string]string) []string {
	m := make(map[string]string)
	for _, kv := range os.Environ() {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	maps.Copy(m, spec.Env)
	maps.Copy(m, extra)
	maps.Copy(m, Env(spec, f))
	return EnvList(m)
}

// EnvList renders m as sorted KEY=VALUE entries.
func EnvList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// Workdir is where a host child runs: spec.Workdir, or the scratch dir.
func Workdir(spec runners.Spec) string {
	if spec.Workdir != "" {
		return spec.Workdir
	}
	return spec.ScratchDir
}

// GiveTo hands the scratch directory and the files in it to the user a run
// executes as, so that the function can read its args and write its
// result. It does nothing unless the daemon is root and username is set.
func GiveTo(f Files, username string) error {
	if username == "" || os.Geteuid() != 0 {
		return nil
	}
	u, err := user.Lookup(username)
	if err != nil {
		return fmt.Errorf("as_user: %w", err)
	}
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return fmt.Errorf("as_user %s: uid %q: %w", username, u.Uid, err)
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return fmt.Errorf("as_user %s: gid %q: %w", username, u.Gid, err)
	}
	for _, p := range []string{f.Dir, f.Args, f.Script} {
		if err := os.Lchown(p, uid, gid); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("as_user %s: chown %s: %w", username, p, err)
		}
	}
	return nil
}

// Invalid is the outcome of a spec a runner cannot run: a failed
// invocation whose message names the offending field.
func Invalid(msg string) runners.Outcome {
	return runners.Outcome{
		State:    messages.StateFailed,
		Error:    &messages.AckError{Type: messages.ErrorTypeDaemon, Message: msg},
		ExitCode: -1,
	}
}

// Killed is the outcome of a run stopped by a timeout or a cancelled
// context. A cancellation cause other than context.Canceled becomes the
// message, so the caller can say why (e.g. "daemon shutdown grace expired").
func Killed(reason procgroup.StopReason, cause error, timeout time.Duration, exitCode int) runners.Outcome {
	e := &messages.AckError{}
	if reason == procgroup.Timeout {
		e.Type = runners.ErrorTypeTimeout
		e.Message = "timed out after " + timeout.String()
	} else {
		e.Type = runners.ErrorTypeCancelled
		e.Message = "cancelled"
		if cause != nil && !errors.Is(cause, context.Canceled) {
			e.Message = cause.Error()
		}
	}
	return runners.Outcome{State: messages.StateKilled, Error: e, ExitCode: exitCode}
}

// Collect turns the end of a command into an outcome: killed if it was
// stopped, succeeded with the result file's bytes on exit 0, otherwise
// failed with the error file's JSON or a NonZeroExit error carrying the
// tail of stderr.
func Collect(f Files, res procgroup.Result, timeout time.Duration) runners.Outcome {
	if res.Stopped != procgroup.NotStopped {
		return Killed(res.Stopped, res.Cause, timeout, res.ExitCode)
	}
	if res.ExitCode == 0 {
		result, err := os.ReadFile(f.Result)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return runners.Outcome{
				State:    messages.StateFailed,
				Error:    &messages.AckError{Type: messages.ErrorTypeDaemon, Message: "read result: " + err.Error()},
				ExitCode: 0,
			}
		}
		if result == nil {
			result = []byte{}
		}
		return runners.Outcome{State: messages.StateSucceeded, Result: result, ExitCode: 0}
	}
	if e := readError(f.Error); e != nil {
		return runners.Outcome{State: messages.StateFailed, Error: e, ExitCode: res.ExitCode}
	}
	return runners.Outcome{
		State:    messages.StateFailed,
		Error:    &messages.AckError{Type: runners.ErrorTypeExit, Message: exitMessage(res)},
		ExitCode: res.ExitCode,
	}
}

// readError reads the function's {type, message, traceback} JSON; nil when
// there is none or it does not parse.
func readError(path string) *messages.AckError {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	var e messages.AckError
	if err := json.Unmarshal(b, &e); err != nil {
		return nil
	}
	if e.Type == "" {
		e.Type = runners.ErrorTypeExit
	}
	if e.Traceback != nil && *e.Traceback == "" {
		e.Traceback = nil
	}
	return &e
}

func exitMessage(res procgroup.Result) string {
	msg := "exit status " + strconv.Itoa(res.ExitCode)
	if res.State != nil && res.ExitCode < 0 {
		msg = res.State.String()
	}
	if tail := LastLines(res.StderrTail, stderrLines); tail != "" {
		msg += ": " + tail
	}
	return msg
}

// LastLines returns the last n non-empty lines of b, trimmed.
func LastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n\r\t "), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}
