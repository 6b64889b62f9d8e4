// Package ledger owns the daemon's bookkeeping of jobs (execs and runs)
// from the moment a command is accepted until its result is handed to the
// outbox. It lives outside every actor instance, so a crashed or stopped
// actor loses nothing: a restarted parent finds the accepted jobs it has not
// started yet, a restarted child finds that its job was already started
// (and must not run twice), and Complete says yes exactly once per job,
// whoever calls it.
//
// The ledger also answers what the poller needs: how many jobs hold a
// permit, the InvocationStatus list (with stdout tails) of running runs, and
// when the daemon was last busy.
package ledger

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"nymph/messages"
)

// Kind separates execs from runs; their ids live in different spaces.
type Kind string

// Job kinds.
const (
	Exec Kind = "exec"
	Run  Kind = "run"
)

// TailSize is how much of a run's output the stdout tail keeps.
const TailSize = 4 << 10

// doneCap bounds the memory of finished job ids used to refuse repeats.
const doneCap = 1 << 14

type key struct {
	kind Kind
	id   string
}

// Entry is one accepted job.
type Entry struct {
	Kind Kind
	ID   string
	// CommandID is the id of the command that carried the job, when known.
	CommandID  string
	Body       any
	AcceptedAt time.Time
	// StartedAt is set by Claim.
	StartedAt time.Time
	// Tail keeps the last TailSize bytes of a run's output.
	Tail *Tail
	// Refused, when set, is why the job is not to be run: its parent
	// reports it refused instead of starting it.
	Refused string

	claimed bool
}

// Ledger is safe for concurrent use.
type Ledger struct {
	now func() time.Time

	mu           sync.Mutex
	active       map[key]*Entry
	order        []key
	done         map[key]struct{}
	doneOrder    []key
	reported     int
	lastActivity time.Time
}

// New returns an empty ledger; now is its clock (nil: time.Now).
func New(now func() time.Time) *Ledger {
	if now == nil {
		now = time.Now
	}
	return &Ledger{now: now, active: map[key]*Entry{}, done: map[key]struct{}{}}
}

// Accept records a new job. It returns false, and records nothing, when a
// job with that id is already active or finished recently.
func (l *Ledger) Accept(kind Kind, id string, body any) bool {
	return l.accept(kind, id, "", body, "")
}

// AcceptCommand is Accept for a job that came in the command commandID.
func (l *Ledger) AcceptCommand(kind Kind, id, commandID string, body any) bool {
	return l.accept(kind, id, commandID, body, "")
}

// Refuse records a job that is not to be run, and why, under the same rules
// as Accept. It is active (it holds its place in the count the daemon waits
// on before it exits) until its refusal is reported and Complete called,
// so a refusal is never lost to an exit or to a parent's restart: whichever
// parent incarnation finds it reports it.
func (l *Ledger) Refuse(kind Kind, id string, body any, reason string) bool {
	return l.accept(kind, id, "", body, reason)
}

func (l *Ledger) accept(kind Kind, id, commandID string, body any, refused string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{kind, id}
	if _, ok := l.active[k]; ok {
		return false
	}
	if _, ok := l.done[k]; ok {
		return false
	}
	now := l.now()
	l.active[k] = &Entry{Kind: kind, ID: id, CommandID: commandID, Body: body, AcceptedAt: now, Tail: &Tail{}, Refused: refused}
	l.order = append(l.order, k)
	l.lastActivity = now
	return true
}

// Unclaimed lists the accepted jobs of kind not started yet, oldest first.
func (l *Ledger) Unclaimed(kind Kind) []*Entry {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*Entry
	for _, k := range l.order {
		if e, ok := l.active[k]; ok && k.kind == kind && !e.claimed {
			out = append(out, e)
		}
	}
	return out
}

// Claim marks a job started. Only the first claim of an active job
// succeeds; a restarted child that finds its job already claimed must not
// run it again.
func (l *Ledger) Claim(kind Kind, id string) (*Entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.active[key{kind, id}]
	if !ok || e.claimed {
		return e, false
	}
	e.claimed = true
	e.StartedAt = l.now()
	return e, true
}

// Get returns an active job.
func (l *Ledger) Get(kind Kind, id string) (*Entry, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.active[key{kind, id}]
	return e, ok
}

// Complete ends a job. It returns true exactly once per job: the caller
// that gets true hands the result over; everyone else drops theirs.
func (l *Ledger) Complete(kind Kind, id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{kind, id}
	if _, ok := l.active[k]; !ok {
		return false
	}
	delete(l.active, k)
	for i, o := range l.order {
		if o == k {
			l.order = append(l.order[:i], l.order[i+1:]...)
			break
		}
	}
	l.finish(k)
	l.reported++
	l.lastActivity = l.now()
	return true
}

// MarkDone records a job as finished that this ledger never accepted: one
// a previous process of the daemon was running when it died, whose outcome
// the start-up reported. A redelivery of its command (the dead process
// never acknowledged it) is then refused by Accept instead of run again.
// It counts neither as reported nor as activity.
func (l *Ledger) MarkDone(kind Kind, id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{kind, id}
	if _, ok := l.active[k]; ok {
		return
	}
	if _, ok := l.done[k]; !ok {
		l.finish(k)
	}
}

// finish adds k to the bounded memory of finished jobs; l.mu is held.
func (l *Ledger) finish(k key) {
	l.done[k] = struct{}{}
	l.doneOrder = append(l.doneOrder, k)
	if len(l.doneOrder) > doneCap {
		delete(l.done, l.doneOrder[0])
		l.doneOrder = l.doneOrder[1:]
	}
}

// Active counts jobs accepted and not completed, of the given kinds (all
// kinds when none is given). Each holds a max_invocations permit.
func (l *Ledger) Active(kinds ...Kind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(kinds) == 0 {
		return len(l.active)
	}
	n := 0
	for k := range l.active {
		for _, want := range kinds {
			if k.kind == want {
				n++
			}
		}
	}
	return n
}

// IDs lists the active job ids of kind, oldest first.
func (l *Ledger) IDs(kind Kind) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, k := range l.order {
		if k.kind == kind {
			out = append(out, k.id)
		}
	}
	return out
}

// Running is the InvocationStatus list of started runs, for the next poll.
func (l *Ledger) Running() []messages.InvocationStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := []messages.InvocationStatus{}
	for _, k := range l.order {
		e := l.active[k]
		if k.kind != Run || !e.claimed {
			continue
		}
		out = append(out, messages.InvocationStatus{
			InvocationID: e.ID,
			State:        messages.StateRunning,
			StartedAt:    messages.Epoch(e.StartedAt.Unix()),
			StdoutTail:   e.Tail.String(),
		})
	}
	return out
}

// Reported counts completed jobs.
func (l *Ledger) Reported() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reported
}

// LastActivity is when a job was last accepted or completed (zero: never).
func (l *Ledger) LastActivity() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lastActivity
}

// Tail keeps the last TailSize bytes written to it. It is safe for
// concurrent use, as runners.Spec.Output requires.
type Tail struct {
	mu  sync.Mutex
	buf []byte
}

// Write implements io.Writer.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= TailSize {
		t.buf = append(t.buf[:0], p[len(p)-TailSize:]...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - TailSize; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

// String returns the tail as valid UTF-8: a character cut at the front is
// dropped and invalid bytes are replaced.
func (t *Tail) String() string {
	t.mu.Lock()
	b := append([]byte(nil), t.buf...)
	t.mu.Unlock()
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.RuneStart(b[i]) {
			b = b[i:]
			break
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// ActorName names the child actor of one job: prefix + id when the id is
// short and plain, else prefix + "x" + a hash of it, so any id the control
// plane sends makes a valid, unique actor name.
func ActorName(prefix, id string) string {
	plain := len(id) >= 1 && len(id) <= 100
	for i := 0; plain && i < len(id); i++ {
		c := id[i]
		plain = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
	}
	if plain {
		return prefix + id
	}
	sum := sha256.Sum256([]byte(id))
	return prefix + "x" + hex.EncodeToString(sum[:12])
}
