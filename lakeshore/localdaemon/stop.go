package localdaemon

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"
)

// KillWait bounds how long Stop waits for a SIGKILLed process to go.
const KillWait = 5 * time.Second

// ErrStillRunning is returned by Stop when the process outlived its timeout
// and force was not given.
var ErrStillRunning = errors.New("still running")

// StopResult says how a process went away.
type StopResult struct {
	PID     int           `json:"pid"`
	Signal  string        `json:"signal"` // the last signal sent: SIGTERM or SIGKILL
	Stopped bool          `json:"stopped"`
	Took    time.Duration `json:"tookNs"`
}

// Stop sends SIGTERM to p and waits up to timeout for it to exit; nymph
// then finishes its running jobs within its shutdown grace. If it is still
// there and force is set, Stop sends SIGKILL and waits up to KillWait.
// Stopping a process that is already gone succeeds.
func (s Scanner) Stop(ctx context.Context, p Process, timeout time.Duration, force bool) (StopResult, error) {
	start := time.Now()
	res := StopResult{PID: p.PID, Signal: "SIGTERM"}
	if !s.Alive(p) {
		res.Stopped = true
		return res, nil
	}
	if err := syscall.Kill(p.PID, syscall.SIGTERM); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			res.Stopped = true
			return res, nil
		}
		return res, fmt.Errorf("signal pid %d: %w", p.PID, err)
	}
	gone, err := s.waitGone(ctx, p, timeout)
	if err != nil {
		return res, err
	}
	if gone {
		res.Stopped, res.Took = true, time.Since(start)
		return res, nil
	}
	if !force {
		res.Took = time.Since(start)
		return res, fmt.Errorf("pid %d after %s: %w", p.PID, timeout, ErrStillRunning)
	}
	res.Signal = "SIGKILL"
	if err := syscall.Kill(p.PID, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return res, fmt.Errorf("kill pid %d: %w", p.PID, err)
	}
	gone, err = s.waitGone(ctx, p, KillWait)
	res.Took = time.Since(start)
	if err != nil {
		return res, err
	}
	if !gone {
		return res, fmt.Errorf("pid %d after SIGKILL: %w", p.PID, ErrStillRunning)
	}
	res.Stopped = true
	return res, nil
}
