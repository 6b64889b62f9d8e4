package execs

import (
	"context"

	"nymph/messages"
)

// RunOutcome is run, for the tests of the outcomes the metrics count.
func (s *Shell) RunOutcome(ctx context.Context, e *messages.Exec) (*messages.ExecResult, string) {
	return s.run(ctx, e, nil)
}

// SetBashPath stands for a bash looked up before it moved.
func (s *Shell) SetBashPath(path string) {
	s.bashMu.Lock()
	defer s.bashMu.Unlock()
	s.bash = path
}
