// Package fakeclock is the tests' settable clock: code under test takes a
// `func() time.Time`, and a test hands it Clock.Now and moves time with
// Advance instead of waiting for it.
package fakeclock

import (
	"sync"
	"time"
)

// Clock is a time that moves only when told. It is safe for concurrent use.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// New is a Clock standing at start.
func New(start time.Time) *Clock { return &Clock{now: start} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
