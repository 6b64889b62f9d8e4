// Package batch owns the queue of group commit, shared by the control
// plane's nonce ledger and the SQLite store's write transactions: what
// arrives while a batch is being committed waits, and the next batch takes
// all of it (up to a bound), so many concurrent callers cost a few
// commits, not one each. One goroutine commits while there is a queue and
// ends when it is empty; nothing runs while nothing is queued.
package batch

import (
	"slices"
	"sync"
)

// Queue hands what is added to commit, in order, in batches of at most
// max. It is safe for concurrent use; commit runs on one goroutine at a
// time. Telling each caller its outcome is commit's business (a channel
// in T, typically).
type Queue[T any] struct {
	commit func(batch []T)

	mu      sync.Mutex
	max     int
	queue   []T
	running bool
}

// New returns a queue committing batches of at most limit (at least 1).
func New[T any](limit int, commit func(batch []T)) *Queue[T] {
	return &Queue[T]{commit: commit, max: max(limit, 1)}
}

// Add queues x for a coming batch.
func (q *Queue[T]) Add(x T) {
	q.mu.Lock()
	q.queue = append(q.queue, x)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go q.drain()
	}
}

// Run queues x as Add does, and for a caller that is about to wait for
// its batch anyway: when no batch is being committed, the first one
// (holding x) is committed on the caller's goroutine, and only what
// queued meanwhile is left to a new one. A lone caller so costs no
// goroutine, whose stack would grow anew to what commit needs (SQLite's
// is deep) for every batch.
func (q *Queue[T]) Run(x T) {
	q.mu.Lock()
	q.queue = append(q.queue, x)
	if q.running {
		q.mu.Unlock()
		return
	}
	q.running = true
	b := q.takeLocked()
	q.mu.Unlock()
	q.commit(b)
	q.mu.Lock()
	idle := q.idleLocked()
	q.mu.Unlock()
	if !idle {
		go q.drain()
	}
}

// idleLocked ends the run when nothing is queued and reports whether it
// did; q.mu is held.
func (q *Queue[T]) idleLocked() bool {
	if len(q.queue) > 0 {
		return false
	}
	q.running = false
	q.queue = nil
	return true
}

// takeLocked takes the next batch off the queue; q.mu is held.
func (q *Queue[T]) takeLocked() []T {
	n := min(len(q.queue), q.max)
	b := slices.Clone(q.queue[:n])
	q.queue = q.queue[n:]
	return b
}

// Len is how many are queued and not yet taken into a batch.
func (q *Queue[T]) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queue)
}

// SetMax changes the bound of the batches taken from now on.
func (q *Queue[T]) SetMax(n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.max = max(n, 1)
}

// drain commits the queue, batch after batch, until it is empty.
func (q *Queue[T]) drain() {
	for {
		q.mu.Lock()
		if q.idleLocked() {
			q.mu.Unlock()
			return
		}
		b := q.takeLocked()
		q.mu.Unlock()
		q.commit(b)
	}
}
