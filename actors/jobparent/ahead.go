package jobparent

import (
	"sync"
)

// Ahead begins each job's journal record as soon as the job is accepted
// (Start, called by the poller), on a goroutine of its own, so that the
// record's sync overlaps the messages that carry the job from the poller
// to its child; the child's Begin then waits for that record instead of
// writing one. A job that nobody started ahead is journalled by Begin
// itself, as without Ahead. Either way nothing of the job is spawned
// before its record is on disk.
type Ahead struct {
	journal Journal
	// jobs counts the records in flight, so the daemon waits for them
	// before it closes the journal.
	jobs *sync.WaitGroup

	mu      sync.Mutex
	pending map[string]*aheadRecord
}

// aheadRecord is one record on its way to disk; err is set before done
// is closed.
type aheadRecord struct {
	done chan struct{}
	err  error
}

var _ Journal = (*Ahead)(nil)

// NewAhead journals through j; jobs counts the goroutines writing records.
func NewAhead(j Journal, jobs *sync.WaitGroup) *Ahead {
	return &Ahead{journal: j, jobs: jobs, pending: map[string]*aheadRecord{}}
}

func aheadKey(kind, id string) string { return kind + ":" + id }

// Start begins the record of job id of kind, carried by command
// commandID, without waiting for it. A second Start of a job whose record
// is pending does nothing.
func (a *Ahead) Start(kind, id, commandID string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	k := aheadKey(kind, id)
	if _, ok := a.pending[k]; ok {
		return
	}
	rec := &aheadRecord{done: make(chan struct{})}
	a.pending[k] = rec
	a.jobs.Add(1)
	go func() {
		defer a.jobs.Done()
		rec.err = a.journal.Begin(kind, id, commandID)
		close(rec.done)
	}()
}

// Begin returns once the record of job id is on disk: the one Start
// began, or one written now.
func (a *Ahead) Begin(kind, id, commandID string) error {
	a.mu.Lock()
	k := aheadKey(kind, id)
	rec, ok := a.pending[k]
	delete(a.pending, k)
	a.mu.Unlock()
	if !ok {
		return a.journal.Begin(kind, id, commandID)
	}
	<-rec.done
	return rec.err
}

// Forget drops what Start began for a job that will not run (reported
// without a child); its record ends with its outcome like any other.
func (a *Ahead) Forget(kind, id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.pending, aheadKey(kind, id))
}
