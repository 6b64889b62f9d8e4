// Package metrics owns what nymph counts about itself and the file it
// writes those numbers to, in the Prometheus text exposition format that
// node_exporter's textfile collector reads (nymph never listens, so it is
// never scraped itself).
//
// The Recorder holds the counters. It lives outside every actor, in the
// daemon, so a crashed or stopped actor loses nothing: the poller, the exec
// and run paths and the setup queue each get it behind a small interface of
// their own and count where things happen. What is already kept elsewhere
// (jobs running: the ledger and the setup FIFO; results not posted yet: the
// outbox) is not copied but read when the file is written (Gauges).
//
// Textfile renders the Recorder and the Gauges through a private
// prometheus.Registry (never the global one) and replaces the file
// atomically with package atomicfile (a temporary file in the same
// directory, fsynced, renamed over the target, the directory fsynced), so a
// reader sees the old file or the new one, never a torn one. The writer
// actor (Props) writes it every interval and once more when it stops.
package metrics

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Job kinds, as the metrics label them.
const (
	KindExec  = "exec"
	KindRun   = "run"
	KindSetup = "setup"
)

// OutcomeLost is the outcome of a job a previous process of the daemon was
// running when it died, reported by this one at start (exec exit -1, run
// failed {type: DaemonRestarted}).
const OutcomeLost = "lost"

// Recorder counts what happens in the daemon. Every method is safe for
// concurrent use from any goroutine or actor and returns at once (atomics,
// and one short mutex for the finished-jobs map); nothing is ever reset, so
// a restarted actor carries on counting where its previous incarnation
// stopped. The zero value is not usable: NewRecorder.
type Recorder struct {
	pollErrors atomic.Uint64
	// backoffNs is the delay before the poller's next retry, 0 once a
	// request succeeded.
	backoffNs atomic.Int64
	// lastPollOK is when a hello or poll last succeeded (unix ns; 0: never).
	lastPollOK atomic.Int64

	mu       sync.Mutex
	finished map[finishKey]uint64
}

type finishKey struct{ kind, outcome string }

// NewRecorder returns a Recorder with nothing counted.
func NewRecorder() *Recorder {
	return &Recorder{finished: map[finishKey]uint64{}}
}

// Known makes the outcomes of kind appear in the file at 0 before the first
// job of each ends, so that rate() and increase() see the first one.
func (r *Recorder) Known(kind string, outcomes ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, o := range outcomes {
		k := finishKey{kind, o}
		if _, ok := r.finished[k]; !ok {
			r.finished[k] = 0
		}
	}
}

// PollFailed counts a hello or poll that failed; retryIn is the backoff the
// poller waits before it tries again.
func (r *Recorder) PollFailed(retryIn time.Duration) {
	r.pollErrors.Add(1)
	r.backoffNs.Store(int64(retryIn))
}

// PollSucceeded records a hello or poll the control plane answered at at;
// the backoff is over.
func (r *Recorder) PollSucceeded(at time.Time) {
	r.backoffNs.Store(0)
	r.lastPollOK.Store(at.UnixNano())
}

// ExecFinished counts an exec reported with outcome (see execs.Outcomes).
func (r *Recorder) ExecFinished(outcome string) { r.JobFinished(KindExec, outcome) }

// RunFinished counts a run acked in state (succeeded, failed, killed).
func (r *Recorder) RunFinished(state string) { r.JobFinished(KindRun, state) }

// SetupFinished counts a setup whose outcome is state (succeeded, failed).
func (r *Recorder) SetupFinished(state string) { r.JobFinished(KindSetup, state) }

// JobFinished counts a job of kind that ended with outcome.
func (r *Recorder) JobFinished(kind, outcome string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished[finishKey{kind, outcome}]++
}

// PollErrors is the count of failed hellos and polls.
func (r *Recorder) PollErrors() uint64 { return r.pollErrors.Load() }

// Backoff is the delay before the poller's next retry (0: not backing off).
func (r *Recorder) Backoff() time.Duration { return time.Duration(r.backoffNs.Load()) }

// LastPollSuccess is when a hello or poll last succeeded (zero: never).
func (r *Recorder) LastPollSuccess() time.Time {
	ns := r.lastPollOK.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Finished is one count of jobs of a kind that ended with an outcome.
type Finished struct {
	Kind, Outcome string
	Count         uint64
}

// Finished lists the counts of finished jobs, by kind then outcome.
func (r *Recorder) Finished() []Finished {
	r.mu.Lock()
	out := make([]Finished, 0, len(r.finished))
	for k, n := range r.finished {
		out = append(out, Finished{Kind: k.kind, Outcome: k.outcome, Count: n})
	}
	r.mu.Unlock()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Outcome < out[j].Outcome
	})
	return out
}
