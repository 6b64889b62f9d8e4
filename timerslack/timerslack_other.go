//go:build !linux

package timerslack

import "time"

func coarsen(time.Duration) (int, error) { return 0, nil }

func child(_ int64, start func() error) error { return start() }
