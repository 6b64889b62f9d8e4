package localdaemon

import (
	"context"
	"time"
)

// procInterval is how often watchProc re-reads /proc. Another process's
// exit raises no event we can subscribe to without a pidfd.
const procInterval = 20 * time.Millisecond

func (s Scanner) watchProc(ctx context.Context, p Process, timeout time.Duration) (bool, error) {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(procInterval)
	defer tick.Stop()
	for {
		if !s.Alive(p) {
			return true, nil
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-deadline.C:
			return !s.Alive(p), nil
		case <-tick.C:
		}
	}
}
