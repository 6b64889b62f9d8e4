// Package gopool owns goroutines that are used again: Go runs a function on
// a goroutine that finished an earlier one and waits idle, and starts a new
// goroutine only when none is idle.
//
// A new goroutine starts on a small stack and grows it by copying, frame by
// frame, each time a call goes deeper than the stack it has. The daemon's
// short-lived goroutines (an actor's mailbox run, one per message burst; a
// poll; a job; a result's delivery) each went deep once and died: in a
// back-to-back exec loop, growing their stacks was a fifth of the daemon's
// CPU. An idle goroutine of the pool keeps the stack it grew.
//
// A Pool is safe for concurrent use. Its zero value is not usable: New
// makes one.
package gopool

import "sync"

// Pool keeps up to a number of idle goroutines.
type Pool struct {
	maxIdle int

	mu     sync.Mutex
	idle   []*worker // the most recently idle last: its stack is the warmest
	closed bool
	// running counts the goroutines of the pool, busy or idle; started
	// counts every goroutine it ever started (for tests).
	running sync.WaitGroup
	started int
}

// worker is one goroutine of the pool; it takes its next function from
// next, and ends when next is closed.
type worker struct {
	next chan func()
}

// New returns a pool that keeps at most maxIdle goroutines idle (at least
// one); a goroutine that finishes while that many wait ends.
func New(maxIdle int) *Pool {
	return &Pool{maxIdle: max(maxIdle, 1)}
}

// Go runs fn on a goroutine of the pool, or on a new one, and returns
// without waiting for it. After Close, or on a nil Pool (a caller given no
// pool), it runs fn on a goroutine of its own, which no pool keeps.
func (p *Pool) Go(fn func()) {
	if p == nil {
		go fn()
		return
	}
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		// next holds one function, and an idle worker has none: this
		// never blocks.
		w.next <- fn
		return
	}
	if p.closed {
		p.mu.Unlock()
		go fn()
		return
	}
	p.running.Add(1)
	p.started++
	p.mu.Unlock()
	go p.work(&worker{next: make(chan func(), 1)}, fn)
}

// work runs fn, then each function handed to w, until the pool has enough
// idle goroutines or is closed.
func (p *Pool) work(w *worker, fn func()) {
	defer p.running.Done()
	for {
		fn()
		fn = nil // drop what it holds while idle
		p.mu.Lock()
		if p.closed || len(p.idle) >= p.maxIdle {
			p.mu.Unlock()
			return
		}
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		var ok bool
		if fn, ok = <-w.next; !ok {
			return
		}
	}
}

// Idle is how many goroutines wait for a function.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

// Close ends the idle goroutines; a busy one ends when its function
// returns. Go still works after Close, on goroutines of their own.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, w := range idle {
		close(w.next)
	}
}

// Wait waits until every goroutine of the pool has ended: call it after
// Close, once the functions it runs have been told to return.
func (p *Pool) Wait() { p.running.Wait() }
