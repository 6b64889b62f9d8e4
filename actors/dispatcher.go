package actors

import "nymph/gopool"

// idleGoroutines is how many idle goroutines the tree's pool keeps: enough
// for the mailbox runs, the poll and the jobs of a busy moment.
const idleGoroutines = 32

// mailboxThroughput is how many messages a mailbox run takes before it
// lets others go (protoactor's default).
const mailboxThroughput = 300

// poolDispatcher runs mailboxes on the pool's goroutines, whose stacks are
// already grown, instead of on a new goroutine per run.
type poolDispatcher struct{ pool *gopool.Pool }

func (d poolDispatcher) Schedule(fn func()) { d.pool.Go(fn) }

func (poolDispatcher) Throughput() int { return mailboxThroughput }
