package poller

import (
	"sync"
	"time"

	"nymph/backoff"
	"nymph/messages"
)

// seenCap bounds the memory of command ids already handled.
const seenCap = 4096

// maxDelays bounds the recorded backoff delays.
const maxDelays = 256

// State is the poller's memory that outlives any poller incarnation: the
// worker id, the cursor, the command ids already handled, the backoff, the
// hibernation deadline, capabilities waiting to be shipped, and the job a
// single-job daemon took. It is safe
// for concurrent use.
type State struct {
	mu          sync.Mutex
	registered  bool
	workerID    string
	cursor      *string
	seen        map[string]struct{}
	seenOrder   []string
	backoff     backoff.Backoff
	delays      []time.Duration
	seq         uint64
	caps        *messages.Capabilities
	capsVersion uint64
	hibernate   time.Time
	// wakeable: the control plane's hello offered to answer a watch poll
	// when a wake is queued (HelloResponse.HibernateWake).
	wakeable  bool
	idleSince time.Time
	// singleJob names the one job a single-job daemon took ("exec X"),
	// empty before it took one.
	singleJob string
}

// NewState returns the state of a daemon that has not said hello yet.
func NewState(retryMin, retryMax time.Duration, rnd func() float64, now time.Time) *State {
	return &State{
		seen:      map[string]struct{}{},
		backoff:   backoff.Backoff{Min: retryMin, Max: retryMax, Rand: rnd},
		idleSince: now,
	}
}

// WorkerID is the id hello gave (or the provisional one); empty before.
func (s *State) WorkerID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workerID
}

// Cursor is the cursor the next poll will echo.
func (s *State) Cursor() *string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cursor
}

// SetUpdatedCapabilities queues a capabilities snapshot for the next poll.
func (s *State) SetUpdatedCapabilities(c messages.Capabilities) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps = &c
	s.capsVersion++
}

// Delays returns the backoff delays computed so far, oldest first.
func (s *State) Delays() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.delays...)
}

func (s *State) nextSeq() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.seq++
	return s.seq
}

func (s *State) isRegistered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registered
}

func (s *State) register(workerID string, cursor *string, wakeable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered = true
	s.workerID = workerID
	s.cursor = cursor
	s.wakeable = wakeable
}

// canWatch reports whether a hibernation may keep a watch poll open: the
// control plane offered it and speaks the cursor (so an answer it gives
// loses nothing if abandoned).
func (s *State) canWatch() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.registered && s.wakeable && s.cursor != nil
}

// unregister makes the next request a hello again; the worker id and the
// cursor are kept for it.
func (s *State) unregister() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.registered = false
}

func (s *State) setCursor(c *string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cursor = c
}

// firstTime records a command id and reports whether it is new.
func (s *State) firstTime(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.seen[id]; ok {
		return false
	}
	s.seen[id] = struct{}{}
	s.seenOrder = append(s.seenOrder, id)
	if len(s.seenOrder) > seenCap {
		delete(s.seen, s.seenOrder[0])
		s.seenOrder = s.seenOrder[1:]
	}
	return true
}

func (s *State) nextDelay() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.backoff.Next()
	s.delays = append(s.delays, d)
	if len(s.delays) > maxDelays {
		s.delays = s.delays[1:]
	}
	return d
}

func (s *State) resetBackoff() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.backoff.Reset()
}

func (s *State) pendingCaps() (*messages.Capabilities, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.caps == nil {
		return nil, 0
	}
	c := *s.caps
	return &c, s.capsVersion
}

// capsShipped clears the queued capabilities if they are still the ones a
// successful poll carried.
func (s *State) capsShipped(version uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if version != 0 && version == s.capsVersion {
		s.caps = nil
	}
}

func (s *State) hibernateUntil() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hibernate
}

func (s *State) setHibernate(until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hibernate = until
}

func (s *State) endHibernate(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hibernate = time.Time{}
	s.idleSince = now
}

func (s *State) idleStart() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.idleSince
}

// SingleJob names the job a single-job daemon has taken ("exec <id>",
// "run <id>"), or is empty while it has none.
func (s *State) SingleJob() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.singleJob
}

func (s *State) takeSingleJob(job string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.singleJob == "" {
		s.singleJob = job
	}
}
