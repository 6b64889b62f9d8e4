package execs

import (
	"context"

	"nymph/messages"
)

// RunOutcome is run, for the tests of the outcomes the metrics count.
func (s *Shell) RunOutcome(ctx context.Context, e *messages.Exec) (*messages.ExecResult, string) {
	return s.run(ctx, e, nil)
}
