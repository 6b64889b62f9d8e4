package timerslack

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

func coarsen(d time.Duration) (int, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	was, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil {
		return 0, fmt.Errorf("timer slack: %w", err)
	}
	if int64(was) >= d.Nanoseconds() {
		return 0, nil
	}
	// The threads there are now; those started meanwhile come from one
	// of them, or are caught by the second pass.
	set := map[string]bool{}
	for pass := 0; pass < 2; pass++ {
		tids, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return len(set), fmt.Errorf("timer slack: %w", err)
		}
		for _, t := range tids {
			if set[t.Name()] {
				continue
			}
			err := os.WriteFile("/proc/"+t.Name()+"/timerslack_ns", []byte(strconv.FormatInt(d.Nanoseconds(), 10)), 0)
			if errors.Is(err, os.ErrNotExist) {
				continue // the thread ended
			}
			if err != nil {
				if len(set) > 0 {
					// Some threads took it: children must still get the
					// original back.
					original.CompareAndSwap(0, int64(was))
				}
				return len(set), fmt.Errorf("timer slack of thread %s (it needs CAP_SYS_NICE): %w", t.Name(), err)
			}
			set[t.Name()] = true
		}
	}
	original.CompareAndSwap(0, int64(was))
	return len(set), nil
}

func child(ns int64, start func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cur, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0)
	if err != nil || int64(cur) == ns {
		return start()
	}
	if err := unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(ns), 0, 0, 0); err != nil {
		return start()
	}
	defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(cur), 0, 0, 0)
	return start()
}
