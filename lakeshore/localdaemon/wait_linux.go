package localdaemon

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sys/unix"
)

// pollSlice bounds each blocking poll so a cancelled context is noticed.
const pollSlice = 250 * time.Millisecond

// waitGone waits until p exits or the timeout passes. A pidfd becomes
// readable the moment the process terminates, so no sleep loop is needed;
// kernels without pidfd_open fall back to watching /proc.
func (s Scanner) waitGone(ctx context.Context, p Process, timeout time.Duration) (bool, error) {
	if s.ProcRoot != "" && s.ProcRoot != "/proc" {
		return s.watchProc(ctx, p, timeout)
	}
	fd, err := unix.PidfdOpen(p.PID, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return true, nil
		}
		return s.watchProc(ctx, p, timeout)
	}
	defer unix.Close(fd)
	// The pid may have been recycled between the scan and the open.
	if !s.Alive(p) {
		return true, nil
	}
	deadline := time.Now().Add(timeout)
	for {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return !s.Alive(p), nil
		}
		slice := min(left, pollSlice)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(fds, int((slice+time.Millisecond-1)/time.Millisecond))
		if err != nil && !errors.Is(err, unix.EINTR) {
			return s.watchProc(ctx, p, time.Until(deadline))
		}
		if n > 0 {
			return true, nil
		}
	}
}
