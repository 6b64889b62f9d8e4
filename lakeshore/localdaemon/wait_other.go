//go:build !linux

package localdaemon

import (
	"context"
	"time"
)

func (s Scanner) waitGone(ctx context.Context, p Process, timeout time.Duration) (bool, error) {
	return s.watchProc(ctx, p, timeout)
}
