// Package runners owns the contract between the daemon and the things that
// execute a function invocation (a host process, a Python function, a
// container, a gVisor sandbox, a SLURM job, or nothing at all for echo).
// Each kind lives in its own subpackage; runnertest holds the one
// conformance suite that every kind must pass.
//
// The function protocol is the same for every kind: the argument bytes
// arrive on stdin and at $NYMPH_ARGS_PATH; the function writes its result
// bytes to $NYMPH_RESULT_PATH; on failure it may write {type, message,
// traceback} JSON to $NYMPH_ERROR_PATH; exit 0 means succeeded. The ids are
// in $NYMPH_INVOCATION_ID, $NYMPH_PARENT_INVOCATION_ID and
// $NYMPH_ROOT_INVOCATION_ID.
package runners

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"nymph/messages"
)

// Environment variables of the function protocol.
const (
	EnvArgsPath           = "NYMPH_ARGS_PATH"
	EnvResultPath         = "NYMPH_RESULT_PATH"
	EnvErrorPath          = "NYMPH_ERROR_PATH"
	EnvInvocationID       = "NYMPH_INVOCATION_ID"
	EnvParentInvocationID = "NYMPH_PARENT_INVOCATION_ID"
	EnvRootInvocationID   = "NYMPH_ROOT_INVOCATION_ID"
)

// Spec is one invocation as a runner sees it.
type Spec struct {
	InvocationID       string
	ParentInvocationID string
	RootInvocationID   string
	Function           messages.FunctionRef
	// Script, when non-empty, is run as a bash script instead of calling
	// Function.
	Script string
	// AsUser, when non-empty, runs the process as that user (runuser -u).
	AsUser string
	Args   []byte
	Image  string
	// Env is merged on top of the daemon's own environment.
	Env map[string]string
	// Workdir is where the function runs; empty means ScratchDir.
	Workdir string
	// ScratchDir is a fresh private directory for this invocation, owned by
	// the caller, where the runner keeps the args, result and error files.
	ScratchDir string
	// Timeout, when positive, bounds the run; the outcome is then killed
	// with error type "Timeout".
	Timeout time.Duration
	// Output, when non-nil, receives stdout and stderr as they are produced.
	// Writes come from the runner's own goroutines; it must be safe for
	// concurrent use.
	Output io.Writer
	// Stdout and Stderr, when non-nil, receive that stream alone as it is
	// produced (Output still gets both), so that the output can travel
	// with the name of its stream. The same concurrency rule applies.
	Stdout, Stderr io.Writer
}

// Outcome is how an invocation ended. A function that fails is an outcome
// (State failed), not an error.
type Outcome struct {
	State    string // messages.StateSucceeded, StateFailed or StateKilled
	Result   []byte // only when succeeded
	Error    *messages.AckError
	ExitCode int
}

// Runner executes invocations of one kind.
//
// Concurrency: Run is called from many goroutines at once, one per
// invocation; implementations keep no per-run state outside the call.
// Cancelling ctx must kill everything the run started (its whole process
// group, container or job) before Run returns, and yields State killed with
// error type "Cancelled". Run returns an error only when the runner could
// not attempt the invocation at all (for example a missing binary); the
// daemon reports that as a failed invocation of type DaemonError.
type Runner interface {
	Kind() string
	Run(ctx context.Context, spec Spec) (Outcome, error)
}

// Error types a runner produces itself.
const (
	ErrorTypeTimeout   = "Timeout"
	ErrorTypeCancelled = messages.ErrorTypeCancelled
	ErrorTypeExit      = "NonZeroExit"
)

// NewScratchDir makes a fresh private directory (0700) for one job under
// workdir/area, named after the job and made unique, so a job id that repeats
// (a retried setup, a re-sent command) never shares one. Remove it with
// os.RemoveAll when the job ends.
func NewScratchDir(workdir, area, name string) (string, error) {
	parent := filepath.Join(workdir, area)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return "", fmt.Errorf("scratch dir: %w", err)
	}
	dir, err := os.MkdirTemp(parent, name+"-")
	if err != nil {
		return "", fmt.Errorf("scratch dir: %w", err)
	}
	return dir, nil
}
