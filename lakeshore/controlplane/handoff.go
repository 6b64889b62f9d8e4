package controlplane

import (
	"sync"
	"time"

	"nymph/lakeshore/store"
)

// Handing an exec straight to a parked poll. A daemon that runs one exec
// after another is, between them, a poll parked here with nothing due.
// The exec's enqueue then delivers it in its own transaction
// (store.NewCommand.DeliverAfter) and hands it to that poll, which
// answers with it: no wake to look, no Take, one transaction less on the
// path of every exec.
//
// Only a poll with a cursor is offered (a legacy daemon acknowledges by
// receipt, and an answer lost with its connection would lose the
// command; with a cursor, the next poll asks for it again), and not a
// hibernating daemon's watch poll. The parked poll offers itself while it
// waits and withdraws the offer whenever its wait ends; an enqueue claims
// the offer first, so that the poll, should its wait end meanwhile, waits
// for the enqueue (one transaction) instead of answering without it.

// handoffs are the offers of the polls parked here, one per worker.
type handoffs struct {
	mu sync.Mutex
	m  map[string]*handoff
}

func newHandoffs() *handoffs { return &handoffs{m: map[string]*handoff{}} }

// handoff is one parked poll's offer.
type handoff struct {
	// after is the poll's cursor: the enqueue delivers only if the daemon
	// has everything up to it.
	after int64
	// done is closed by the claimer once cmds, gen and takenAt are final
	// (cmds nil: not delivered, the ordinary wake follows).
	done    chan struct{}
	cmds    []store.Command
	gen     uint64
	takenAt time.Time
	claimed bool
	once    sync.Once
}

// offer registers a parked poll of workerID at cursor after, in place of
// any older offer of the worker's (that poll then waits as any poll does).
func (h *handoffs) offer(workerID string, after int64) *handoff {
	o := &handoff{after: after, done: make(chan struct{})}
	h.mu.Lock()
	h.m[workerID] = o
	h.mu.Unlock()
	return o
}

// withdraw ends o's offer and reports whether an enqueue claimed it
// first; the caller then waits on o.done.
func (h *handoffs) withdraw(workerID string, o *handoff) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m[workerID] == o {
		delete(h.m, workerID)
	}
	return o.claimed
}

// claim takes the offer of workerID's parked poll, if there is one; the
// caller must end it with fill.
func (h *handoffs) claim(workerID string) *handoff {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.m[workerID]
	if o != nil {
		delete(h.m, workerID)
		o.claimed = true
	}
	return o
}

// fill ends a claimed offer: cmds delivered at takenAt, by a take as of
// presence generation gen (or nothing). Only the first call counts, so a
// claimer can also defer a fill with nothing: a poll never waits for an
// enqueue that panicked.
func (o *handoff) fill(cmds []store.Command, gen uint64, takenAt time.Time) {
	o.once.Do(func() {
		o.cmds, o.gen, o.takenAt = cmds, gen, takenAt
		close(o.done)
	})
}

// size is the number of offers, for tests.
func (h *handoffs) size() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.m)
}
