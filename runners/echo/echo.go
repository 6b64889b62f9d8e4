// Package echo owns the "echo" runner: no process at all, the result is the
// argument bytes. It exists for tests and latency benchmarks of everything
// around a runner.
package echo

import (
	"context"
	"errors"

	"nymph/messages"
	"nymph/runners"
)

// Kind is the run_config.runner name of this runner.
const Kind = "echo"

// Runner answers every invocation with its own args.
type Runner struct{}

var _ runners.Runner = (*Runner)(nil)

// New returns an echo runner.
func New() *Runner { return &Runner{} }

// Kind implements runners.Runner.
func (*Runner) Kind() string { return Kind }

// Run implements runners.Runner. A context that is already done yields a
// killed outcome, as it would for a runner that had started something.
func (*Runner) Run(ctx context.Context, spec runners.Spec) (runners.Outcome, error) {
	if ctx.Err() != nil {
		msg := "cancelled"
		if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
			msg = cause.Error()
		}
		return runners.Outcome{
			State:    messages.StateKilled,
			Error:    &messages.AckError{Type: runners.ErrorTypeCancelled, Message: msg},
			ExitCode: -1,
		}, nil
	}
	result := make([]byte, len(spec.Args))
	copy(result, spec.Args)
	return runners.Outcome{State: messages.StateSucceeded, Result: result}, nil
}
