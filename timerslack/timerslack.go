// Package timerslack owns the kernel's timer slack of this process: how
// late the kernel may fire a timer of one of its threads so that wake-ups
// coalesce. The Go runtime's sysmon thread sleeps 20 µs at a time while
// any goroutine runs; on a small virtual machine each of those sleeps was
// a wake-up of its own (10-16% of the daemon's and the control plane's CPU
// in a back-to-back exec loop). Coarsen lets them come up to a millisecond
// late. The children a process starts get the slack it began with back
// (Child), so the commands it runs keep the timers they would have had.
//
// The slack is per thread, and a new thread inherits its creator's: the
// original slack is kept here, once for the process, because it is the
// kernel's state of the whole process, not of any one caller.
package timerslack

import (
	"sync/atomic"
	"time"
)

// original is the slack, in nanoseconds, the process began with; 0 until
// Coarsen changed something.
var original atomic.Int64

// Child runs start, a fork and exec, on a thread whose slack is the one the
// process began with, so that the child inherits that one. Without a
// Coarsen that changed something it just runs start.
func Child(start func() error) error {
	ns := original.Load()
	if ns == 0 {
		return start()
	}
	return child(ns, start)
}

// Coarsen sets the timer slack of every thread of the process to d, and
// returns how many it set. Setting another thread's needs CAP_SYS_NICE:
// without it nothing is changed, and the error says so. d <= 0 changes
// nothing.
func Coarsen(d time.Duration) (int, error) {
	if d <= 0 {
		return 0, nil
	}
	return coarsen(d)
}
