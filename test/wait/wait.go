// Package wait is the one polling helper of the tests: wait until a
// condition holds, and fail with what was awaited when it does not. Tests
// wait on conditions, never on time; a poll is the fallback where no event
// can be subscribed to (a process table, a file, a remote row).
package wait

import (
	"testing"
	"time"
)

// interval is the first pause between checks; it doubles up to maxInterval
// so a long wait does not spin a busy machine.
const (
	interval    = 10 * time.Millisecond
	maxInterval = 200 * time.Millisecond
)

// For polls cond until it holds, or fails t after timeout naming what.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for %s", timeout, what)
	}
}

// Until polls cond until it holds (true) or timeout passes (false).
func Until(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for pause := interval; !cond(); pause = min(2*pause, maxInterval) {
		if time.Now().After(deadline) {
			return cond()
		}
		time.Sleep(pause)
	}
	return true
}
