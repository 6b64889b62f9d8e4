package actors

import "nymph/gopool"

// IdleGoroutines is how many idle goroutines the daemon's pool keeps:
// enough for the mailbox runs, the poll, the jobs and the result
// deliveries of a busy moment.
const IdleGoroutines = 32

// mailboxThroughput is how many messages a mailbox run takes before it
// lets others go (protoactor's default).
const mailboxThroughput = 300

// poolDispatcher runs mailboxes on the pool's goroutines, whose stacks are
// already grown, instead of on a new goroutine per run.
type poolDispatcher struct{ pool *gopool.Pool }

func (d poolDispatcher) Schedule(fn func()) { d.pool.Go(fn) }

func (poolDispatcher) Throughput() int { return mailboxThroughput }
