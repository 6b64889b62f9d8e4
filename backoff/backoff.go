// Package backoff is the protocol's retry delay, shared by every loop that
// retries against a remote side: the daemon's poller, outbox and key
// rotation, the control plane's replica listener and the CLI's waits.
//
// Each delay is backoff + rand(0,1)·min(backoff, 5 s) (full jitter on a
// capped term, as the spec writes it); after it the backoff doubles up to
// Max, and Reset brings it back to Min.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// JitterCap is the spec's 5 s cap on the jitter term.
const JitterCap = 5 * time.Second

// Backoff is one retry loop's delay. The zero Rand means math/rand/v2. A
// Backoff is not safe for concurrent use: each loop owns its own.
type Backoff struct {
	Min, Max time.Duration
	// Rand returns a uniform value in [0,1); nil means math/rand/v2.
	Rand func() float64
	cur  time.Duration
}

// New is a Backoff from min to max with the default jitter source.
func New(min, max time.Duration) *Backoff { return &Backoff{Min: min, Max: max} }

// Next returns the delay before the next attempt and doubles the backoff.
func (b *Backoff) Next() time.Duration {
	if b.cur <= 0 {
		b.cur = b.Min
	}
	rnd := b.Rand
	if rnd == nil {
		rnd = rand.Float64
	}
	d := b.cur + time.Duration(rnd()*float64(min(b.cur, JitterCap)))
	b.cur = min(b.cur*2, max(b.Max, b.Min))
	return d
}

// Reset brings the backoff back to Min.
func (b *Backoff) Reset() { b.cur = b.Min }

// Current is the backoff the next delay starts from.
func (b *Backoff) Current() time.Duration {
	if b.cur <= 0 {
		return b.Min
	}
	return b.cur
}

// Wait sleeps for Next(), or less if ctx ends first; it reports whether the
// whole delay passed.
func (b *Backoff) Wait(ctx context.Context) bool {
	return Sleep(ctx, b.Next())
}

// Sleep waits d or until ctx ends, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
