package controlplane

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// Presence: what this process knows of the workers that poll it, so that
// an empty poll is answered from memory, without a read or a write.
//
// A full poll (RecordPoll, then the reads that find nothing to hand over)
// leaves a memo of the worker: its sequence numbers, state and poll
// queue, and that nothing waits for it. The next poll that would change
// nothing (no running invocation, no new capabilities, the same queue, a
// cursor that acknowledges nothing new) is answered from the memo; its
// "seen now" is kept in memory and written with everyone else's in one
// TouchWorkers every presenceFlush, so `stale`, derived from the stored
// last seen at read time, is right to within that.
//
// A memo holds only while nothing changed: queuing a command for the
// worker, a claimable invocation, a hello, a queue edit or a removal
// invalidates it (here directly, on the other replicas through the
// notifications that wake their long-polls), and the worker's next look at
// its queue reads the store again. An invalidation bumps the worker's
// generation; a full poll leaves a memo only if the generation it started
// with is still current, so a change that lands while it reads is never
// forgotten.
const (
	// presenceFlush is how often the last-seen times noted in memory are
	// written (the issue allows 5 s).
	presenceFlush = 2 * time.Second
	// presenceTouchTimeout bounds one flush.
	presenceTouchTimeout = 10 * time.Second
	// maxMemos bounds the memos kept; past it, the oldest half is dropped
	// (a dropped memo costs one full poll).
	maxMemos = 1 << 20
)

// memo is a worker as of its last full poll: only what an empty poll's
// answer and the decision to skip the store need. Copied, never shared.
type memo struct {
	namespace        string
	state            string
	setupPending     int
	hibernatingUntil *time.Time
	pollQueue        string
	deliveredSeq     int64
	ackedSeq         int64
	lastSeq          int64
	// clearAbove: no unacknowledged command has a seq above it (a take
	// after it found none).
	clearAbove int64
	// running is how many invocations the store has running on the
	// worker; a worker with any is polled the full way (its statuses
	// are recorded, its missing ones failed).
	running int
}

type presenceEntry struct {
	gen   uint64
	valid bool // m describes the worker and nothing waits for it
	// claim: an invocation may be claimable by the worker (set by the
	// local submit path); valid memos with claim false skip the claim.
	claim bool
	// take: a command was queued since the memo was left.
	take     bool
	m        memo
	seenAt   time.Time // last poll, in memory
	touched  bool      // seenAt not flushed yet
	lastUsed time.Time
}

// presence is safe for concurrent use.
type presence struct {
	// live: invalidations from the other replicas reach this process
	// (see caches); without, no memo is trusted.
	live *atomic.Bool
	mu   sync.Mutex
	m    map[string]*presenceEntry
	// dirty lists the entries whose seenAt is not written yet.
	dirty []string
	// gens hands out generations, one sequence for every entry, so an
	// entry dropped and made again never repeats a generation a poll
	// may hold.
	gens uint64
}

func (p *presence) bump() uint64 {
	p.gens++
	return p.gens
}

func newPresence(live *atomic.Bool) *presence {
	return &presence{live: live, m: map[string]*presenceEntry{}}
}

func (p *presence) entry(id string, now time.Time) *presenceEntry {
	e := p.m[id]
	if e == nil {
		if len(p.m) >= maxMemos {
			p.evictOldestLocked()
		}
		e = &presenceEntry{gen: p.bump(), claim: true}
		p.m[id] = e
	}
	e.lastUsed = now
	return e
}

// evictOldestLocked drops the memos used longest ago, about half, keeping
// the ones with a last seen not written yet.
func (p *presence) evictOldestLocked() {
	var newest, oldest time.Time
	for _, e := range p.m {
		if oldest.IsZero() || e.lastUsed.Before(oldest) {
			oldest = e.lastUsed
		}
		if e.lastUsed.After(newest) {
			newest = e.lastUsed
		}
	}
	mid := oldest.Add(newest.Sub(oldest) / 2)
	for id, e := range p.m {
		if !e.touched && !e.lastUsed.After(mid) {
			delete(p.m, id)
		}
	}
}

// pollView is what an empty poll is answered from: a memo's fields under
// the names the poll path uses.
type pollView struct {
	id, namespace          string
	deliveredSeq, ackedSeq int64
}

// How a poll relates to the worker's memo (presence.look).
type pollKind int

const (
	pollFull    pollKind = iota // anything may change: record it, claim, take
	pollAck                     // only its cursor acknowledges commands: record it
	pollAckOnly                 // as pollAck, of a worker no acknowledgement settles: the ack alone is written
	pollQuiet                   // nothing changes but its last seen: from memory
)

// look says how the poll must be served. A quiet poll is noted as seen,
// and gets the memo's view and generation.
func (p *presence) look(id string, queue string, cursor *int64, running, capsChanged bool, now time.Time) (pollView, uint64, pollKind) {
	if running || capsChanged || !p.live.Load() {
		return pollView{}, 0, pollFull
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[id]
	if e == nil || !e.valid {
		return pollView{}, 0, pollFull
	}
	m := &e.m
	switch {
	case m.running > 0, m.pollQueue != queue:
		return pollView{}, 0, pollFull
	case m.state == operatorapi.StateJoining, m.state == operatorapi.StateSettingUp && m.setupPending == 0:
		// RecordPoll would settle it active.
		return pollView{}, 0, pollFull
	case m.hibernatingUntil != nil && !m.hibernatingUntil.After(now):
		// RecordPoll would clear the deadline that passed.
		return pollView{}, 0, pollFull
	case cursor != nil && min(*cursor, m.deliveredSeq) > m.ackedSeq:
		// The cursor acknowledges something: what every exec's next
		// poll does. Of an active worker, that changes nothing but the
		// acknowledgement (RecordPoll would settle only a setting_up
		// worker whose last setup it acknowledges).
		if m.state == operatorapi.StateActive {
			return pollView{id: id, namespace: m.namespace, deliveredSeq: m.deliveredSeq, ackedSeq: m.ackedSeq}, e.gen, pollAckOnly
		}
		return pollView{}, 0, pollAck
	}
	if !e.touched {
		p.dirty = append(p.dirty, id)
	}
	e.seenAt, e.touched, e.lastUsed = now, true, now
	return pollView{id: id, namespace: m.namespace, deliveredSeq: m.deliveredSeq, ackedSeq: m.ackedSeq}, e.gen, pollQuiet
}

// acked notes an acknowledgement written for the worker (AckThrough) and
// the poll that sent it as seen, and returns the memo's view and
// generation for the poll to go on as a quiet one; false when the memo
// stopped holding meanwhile (the poll then goes the full way).
func (p *presence) acked(id string, ackedSeq int64, now time.Time) (pollView, uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[id]
	if e == nil || !e.valid {
		return pollView{}, 0, false
	}
	m := &e.m
	// Acknowledged is delivered, and queued: what another replica handed
	// over is known from here on too.
	m.ackedSeq = max(m.ackedSeq, ackedSeq)
	m.deliveredSeq = max(m.deliveredSeq, m.ackedSeq)
	m.lastSeq = max(m.lastSeq, m.deliveredSeq)
	if !e.touched {
		p.dirty = append(p.dirty, id)
	}
	e.seenAt, e.touched, e.lastUsed = now, true, now
	return pollView{id: id, namespace: m.namespace, deliveredSeq: m.deliveredSeq, ackedSeq: m.ackedSeq}, e.gen, true
}

// current returns the worker's generation, the memo left as it is.
func (p *presence) current(id string, now time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.entry(id, now).gen
}

// generation returns the worker's current generation, to hand to settle.
// The memo stops holding: the full poll that asks replaces it.
func (p *presence) generation(id string, now time.Time) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entry(id, now)
	e.valid = false
	return e.gen
}

// due says what a poll of the worker must read before it may park: the
// claim of invocations, the take of commands after after. Both, unless a
// valid memo says otherwise.
func (p *presence) due(id string, after int64) (claim, take bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[id]
	if e == nil || !e.valid || !p.live.Load() {
		return true, true
	}
	m := &e.m
	take = e.take || m.lastSeq > max(after, m.ackedSeq) && after < m.clearAbove
	return e.claim || m.running > 0, take
}

// settle leaves a memo of w after a full look found nothing to hand over
// (no claim, no command after after), unless the worker's generation
// moved past gen meanwhile.
func (p *presence) settle(w store.Worker, gen uint64, after int64, running int, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.entry(w.ID, now)
	if e.gen != gen {
		return
	}
	e.valid, e.claim, e.take = true, false, false
	e.m = memo{
		namespace: w.Namespace, state: w.State, setupPending: w.SetupPending, hibernatingUntil: w.HibernatingUntil,
		pollQueue: w.PollQueue, deliveredSeq: w.DeliveredSeq, ackedSeq: w.AckedSeq, lastSeq: w.LastSeq,
		clearAbove: after, running: running,
	}
}

// expect makes the entry of a worker that a hello is about to create and
// returns its generation, for welcome. A hello that creates no worker
// under that id drops the entry again.
func (p *presence) expect(id string, now time.Time) uint64 {
	return p.generation(id, now)
}

// welcome leaves a memo of w, a worker its hello created just now, so its
// first poll is as quiet as any other: the row the hello read is all that
// poll's RecordPoll would read, and it would write nothing a new row does
// not hold already (state active, poll queue "", nothing running). When a
// fleet boots together this takes one write transaction per daemon off
// the store at the moment every daemon's first poll arrives. Anything
// that touched the worker since expect (a command queued, a claimable
// invocation, an edit, a removal) moved or dropped the entry: then no memo
// is left, and the first poll goes the full way. The claim stays due:
// an invocation may be waiting for a worker like this one.
func (p *presence) welcome(w store.Worker, gen uint64, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[w.ID]
	if e == nil || e.gen != gen {
		return
	}
	// An unmoved generation says nothing was queued: take is unset.
	e.valid, e.lastUsed = true, now
	e.m = memo{
		namespace: w.Namespace, state: w.State, setupPending: w.SetupPending, hibernatingUntil: w.HibernatingUntil,
		pollQueue: w.PollQueue, deliveredSeq: w.DeliveredSeq, ackedSeq: w.AckedSeq, lastSeq: w.LastSeq,
		clearAbove: w.LastSeq,
	}
}

// nothingDue notes that a poll answered from the memo looked (claimed,
// took after after) and found nothing, unless the generation moved past
// gen meanwhile.
func (p *presence) nothingDue(id string, gen uint64, after int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[id]; e != nil && e.gen == gen && e.valid {
		e.claim, e.take = false, false
		e.m.clearAbove = after
	}
}

// invalidate forgets what is known of a worker: anything may have changed.
func (p *presence) invalidate(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[id]; e != nil {
		e.gen = p.bump()
		e.valid = false
		e.claim = true
	}
}

// claimable notes that the worker may claim an invocation.
func (p *presence) claimable(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[id]; e != nil {
		e.gen = p.bump()
		e.claim = true
	}
}

// queued notes a command queued for the worker: its next look takes.
// The memo still holds for what a poll records (a command changes none of
// it until it is delivered).
func (p *presence) queued(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[id]; e != nil {
		e.gen = p.bump()
		e.take = true
	}
}

// delivered notes commands handed to the worker by a take that began at
// generation gen: the memo's delivered seq moves to the last of them (so
// the cursor acknowledging them is recorded), and, unless something was
// queued since or the batch was full, nothing is due to take any more. A
// legacy delivery (acknowledged as sent), a hibernate (whose deadline
// the worker now shows) or a setup (whose enqueue made the worker
// setting_up, and whose acknowledgement RecordPoll settles) changes more
// than that: the memo goes.
func (p *presence) delivered(id string, gen uint64, cmds []store.Command, legacy bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.m[id]
	if e == nil {
		return
	}
	moved := e.gen != gen
	e.gen = p.bump()
	if !e.valid {
		return
	}
	for _, c := range cmds {
		if legacy || c.Kind == store.KindHibernate || c.Kind == store.KindSetup {
			e.valid = false
			return
		}
		e.m.deliveredSeq = max(e.m.deliveredSeq, c.Seq)
		e.m.lastSeq = max(e.m.lastSeq, c.Seq)
	}
	if !moved && len(cmds) < pollBatch {
		e.take = false
		e.m.clearAbove = max(e.m.clearAbove, e.m.deliveredSeq)
	}
}

// invalidateAll forgets every memo (another replica may have changed
// anything while this one was not listening).
func (p *presence) invalidateAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range p.m {
		e.gen = p.bump()
		e.valid = false
		e.claim = true
	}
}

// drop removes the worker: its row is gone.
func (p *presence) drop(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.m, id)
}

// takeSeen returns the last-seen times not written yet, and marks them
// written.
func (p *presence) takeSeen() []store.Seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]store.Seen, 0, len(p.dirty))
	for _, id := range p.dirty {
		if e := p.m[id]; e != nil && e.touched {
			out = append(out, store.Seen{WorkerID: id, At: e.seenAt})
			e.touched = false
		}
	}
	p.dirty = p.dirty[:0]
	return out
}

// flushPresence writes the last-seen times noted in memory, and forgets
// the workers whose rows are gone.
func (s *Server) flushPresence(ctx context.Context, log zerolog.Logger) {
	seen := s.presence.takeSeen()
	if len(seen) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, presenceTouchTimeout)
	defer cancel()
	missing, err := s.st.TouchWorkers(ctx, seen)
	if err != nil {
		// Put them back: the next flush tries again.
		s.presence.mu.Lock()
		for _, x := range seen {
			if e := s.presence.m[x.WorkerID]; e != nil && !e.touched {
				e.seenAt, e.touched = x.At, true
				s.presence.dirty = append(s.presence.dirty, x.WorkerID)
			}
		}
		s.presence.mu.Unlock()
		log.Warn().Err(err).Int("workers", len(seen)).Msg("writing last-seen times failed; retrying at the next flush")
		return
	}
	for _, id := range missing {
		s.presence.drop(id)
	}
}

// startPresenceFlush writes the presence kept in memory every
// presenceFlush until the server closes (Close writes the last of it).
func (s *Server) startPresenceFlush() {
	s.every(presenceFlush, presenceTouchTimeout, func(ctx context.Context) { s.flushPresence(ctx, s.log) })
}

// seenAt returns when the worker last polled this process, if that is
// later than what was written.
func (p *presence) seenAt(id string) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e := p.m[id]; e != nil && e.touched {
		return e.seenAt, true
	}
	return time.Time{}, false
}

// withSeen raises w's last seen to what this process saw and has not
// written yet, so a read made between two flushes is not behind.
func (s *Server) withSeen(w store.Worker) store.Worker {
	if t, ok := s.presence.seenAt(w.ID); ok && t.After(w.LastSeenAt) {
		w.LastSeenAt = t
	}
	return w
}

// worker reads one worker, its last seen as this process knows it.
func (s *Server) worker(ctx context.Context, namespace, id string) (store.Worker, error) {
	w, err := s.st.Worker(ctx, namespace, id)
	if err != nil {
		return w, err
	}
	return s.withSeen(w), nil
}

// listWorkers reads a namespace's workers, their last seen as this
// process knows it.
func (s *Server) listWorkers(ctx context.Context, namespace string) ([]store.Worker, error) {
	all, err := s.st.ListWorkers(ctx, namespace)
	for i := range all {
		all[i] = s.withSeen(all[i])
	}
	return all, err
}
