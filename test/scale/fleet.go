//go:build scale

package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"nymph/backoff"
	"nymph/daemon/uplink"
	"nymph/messages"
)

// pollTimeoutS is what every simulated daemon asks of its long-polls: the
// daemon's default [poll] wait_max_s, and the server's cap.
const pollTimeoutS = 20

// The real daemon's retry backoff ([poll] retry_min_s, retry_max_s).
const (
	retryMin = time.Second
	retryMax = 60 * time.Second
)

// sourceIPs is how many loopback addresses the daemons dial from, so that
// no one address needs more than a few hundred ephemeral ports, and none
// comes near the control plane's --max-conns-per-ip.
const sourceIPs = 64

// execTrack is one exec's life, in the tracker's clock (since its base; 0
// is "not yet").
type execTrack struct {
	phase                             int // -1 until the operator's POST is answered
	sent, queued, delivered, finished time.Duration
	counted                           bool // counted in done[phase]
}

// tracker follows every exec from the operator's POST to the daemon's
// result. The two sides race (a poll may carry an exec before the POST
// that queued it is answered), so either may create the entry.
type tracker struct {
	base time.Time
	mu   sync.Mutex
	m    map[string]*execTrack
	// queued and done count per phase the execs the operator queued and,
	// of those, the ones finished.
	queued, done []int
	// redelivered counts execs a poll carried again.
	redelivered int
}

func newTracker(phases, capacity int) *tracker {
	return &tracker{base: time.Now(), m: make(map[string]*execTrack, capacity), queued: make([]int, phases), done: make([]int, phases)}
}

// now is the tracker's clock: monotonic, and never 0.
func (t *tracker) now() time.Duration { return time.Since(t.base) + 1 }

func (t *tracker) entry(id string) *execTrack {
	e := t.m[id]
	if e == nil {
		e = &execTrack{phase: -1}
		t.m[id] = e
	}
	return e
}

func (t *tracker) count(e *execTrack) {
	if e.phase >= 0 && e.finished > 0 && !e.counted {
		e.counted = true
		t.done[e.phase]++
	}
}

func (t *tracker) markQueued(id string, phase int, sent, queued time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	e.phase, e.sent, e.queued = phase, sent, queued
	t.queued[phase]++
	t.count(e)
}

// markDelivered notes a poll answer carrying id; false when one did
// already (a poll retried before its cursor was echoed may carry it again:
// the daemon skips it, as nymph does).
func (t *tracker) markDelivered(id string, at time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	if e.delivered != 0 {
		t.redelivered++
		return false
	}
	e.delivered = at
	return true
}

func (t *tracker) markFinished(id string, at time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entry(id)
	if e.finished == 0 {
		e.finished = at
		t.count(e)
	}
}

// drained says whether every exec queued in phase has finished.
func (t *tracker) drained(phase int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.queued[phase] == t.done[phase]
}

// phaseStats are the figures of one phase.
type phaseStats struct {
	queued int
	// dispatch is POST answered → the poll answer carrying the exec (0
	// when the poll answer came first); roundTrip POST sent → result
	// answered; post the operator's POST, sent → answered.
	dispatch, roundTrip, post *latencies
	// finishedBy counts the execs finished by the end of the window.
	finishedBy  int
	undelivered int // queued, never carried by a poll
	unfinished  int // carried, never finished
}

// stats reads the figures of phase; windowEnd is the end of its offer
// window, on the tracker's clock.
func (t *tracker) stats(phase int, windowEnd time.Duration) phaseStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := t.queued[phase]
	ps := phaseStats{queued: n, dispatch: newLatencies(n), roundTrip: newLatencies(n), post: newLatencies(n)}
	for _, e := range t.m {
		if e.phase != phase {
			continue
		}
		ps.post.add(e.queued - e.sent)
		switch {
		case e.delivered == 0:
			ps.undelivered++
			continue
		case e.finished == 0:
			ps.unfinished++
		default:
			ps.roundTrip.add(e.finished - e.sent)
			if e.finished <= windowEnd {
				ps.finishedBy++
			}
		}
		ps.dispatch.add(max(e.delivered-e.queued, 0))
	}
	return ps
}

// counters are the errors of a run, and what shows each daemon holds one
// connection.
type counters struct {
	daemonStatus, daemonTransport, daemonDecode atomic.Int64
	opStatus, opTransport                       atomic.Int64
	rejected                                    atomic.Int64
	lastErr                                     atomic.Pointer[string]
}

func (c *counters) total() int64 {
	return c.daemonStatus.Load() + c.daemonTransport.Load() + c.daemonDecode.Load() + c.opStatus.Load() + c.opTransport.Load() + c.rejected.Load()
}

func (c *counters) String() string {
	return fmt.Sprintf("daemon non-2xx %d, daemon transport %d, daemon decode %d, hello rejected %d, operator non-2xx %d, operator transport %d",
		c.daemonStatus.Load(), c.daemonTransport.Load(), c.daemonDecode.Load(), c.rejected.Load(), c.opStatus.Load(), c.opTransport.Load())
}

func (c *counters) note(err error) {
	s := err.Error()
	c.lastErr.Store(&s)
}

// daemonErr counts a failed daemon request.
func (c *counters) daemonErr(err error) {
	c.note(err)
	var se *statusError
	if errors.As(err, &se) {
		c.daemonStatus.Add(1)
		return
	}
	c.daemonTransport.Add(1)
}

// fleet is N simulated daemons sharing one fleet token.
type fleet struct {
	tr      *tracker
	c       *counters
	daemons []*simDaemon
	start   chan struct{}
	wg      sync.WaitGroup
	// registered counts the daemons whose hello was answered, polling
	// those that have sent their first poll; lastHello is when the last
	// hello was answered, on the tracker's clock.
	registered, polling atomic.Int64
	lastHello           atomic.Int64
}

// newFleet makes n daemons; daemon i talks to addrs[i*len(addrs)/n], so
// that a fleet split between replicas is split in halves.
func newFleet(tr *tracker, c *counters, n int, addrs []string, token string) (*fleet, error) {
	f := &fleet{tr: tr, c: c, daemons: make([]*simDaemon, n), start: make(chan struct{})}
	result, err := messages.Marshal(&messages.ExecResult{ExitCode: 0})
	if err != nil {
		return nil, err
	}
	run := "scale-" + time.Now().UTC().Format("150405.000")
	for i := range f.daemons {
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+i%sourceIPs))}
		name := fmt.Sprintf("%s-%05d", run, i)
		hello, err := messages.Marshal(&messages.HelloRequest{
			MachineID: "host-" + name,
			Label:     name,
			Tags:      []string{"fleet=scale"},
			Capabilities: messages.Capabilities{
				Runners: []string{"process"},
				Workdir: "/var/lib/nymph/work",
			},
			Versions:    messages.Versions{Daemon: ptr("0.0.0-scale"), Protocol: ptr(messages.ProtocolVersion)},
			Incarnation: name,
		})
		if err != nil {
			return nil, err
		}
		f.daemons[i] = &simDaemon{f: f, conn: newConn(addrs[i*len(addrs)/n], local, token), hello: hello, result: result}
	}
	return f, nil
}

func ptr[T any](v T) *T { return &v }

// run starts every daemon, each waiting for boot to say hello.
func (f *fleet) run(ctx context.Context) {
	for _, d := range f.daemons {
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			d.run(ctx)
		}()
	}
}

// boot lets every daemon say hello at once, as a fleet that boots together.
func (f *fleet) boot() { close(f.start) }

// wait returns when every daemon has stopped (after ctx is cancelled and
// the control plane is gone, which ends the held polls).
func (f *fleet) wait() { f.wg.Wait() }

// workerIDs are the registered daemons' worker ids, in daemon order
// ("" for one not registered).
func (f *fleet) workerIDs() []string {
	ids := make([]string, len(f.daemons))
	for i, d := range f.daemons {
		if p := d.workerID.Load(); p != nil {
			ids[i] = *p
		}
	}
	return ids
}

// dials is how many connections the daemons opened: one each when none
// was ever lost. Valid after wait.
func (f *fleet) dials() int {
	n := 0
	for _, d := range f.daemons {
		n += d.conn.dials
	}
	return n
}

// simDaemon does what nymph's poller does on the wire: hello, then
// long-polls that echo the cursor, and an exec's result posted at once
// (exit 0, no output) before the next poll. It never runs anything.
type simDaemon struct {
	f        *fleet
	conn     *conn
	hello    []byte // encoded once
	result   []byte // the exec result, the same for every exec
	workerID atomic.Pointer[string]
	cursor   *string
	bo       *backoff.Backoff
}

func (d *simDaemon) run(ctx context.Context) {
	defer d.conn.close()
	d.bo = backoff.New(retryMin, retryMax)
	select {
	case <-d.f.start:
	case <-ctx.Done():
		return
	}
	if !d.sayHello(ctx) {
		return
	}
	d.f.registered.Add(1)
	// The latest wins, whichever goroutine stores last.
	for at := int64(d.f.tr.now()); ; {
		old := d.f.lastHello.Load()
		if old >= at || d.f.lastHello.CompareAndSwap(old, at) {
			break
		}
	}
	first := true
	req := messages.PollRequest{TimeoutS: pollTimeoutS, Invocations: []messages.InvocationStatus{}}
	var resp messages.PollResponse
	for ctx.Err() == nil {
		req.WorkerID, req.Cursor = *d.workerID.Load(), d.cursor
		body, err := messages.Marshal(&req)
		if err != nil {
			d.f.c.note(err)
			return
		}
		if first {
			d.f.polling.Add(1)
			first = false
		}
		answer, err := d.conn.post(ctx, uplink.PathPoll, body)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d.f.c.daemonErr(err)
			var se *statusError
			if errors.As(err, &se) && se.status == 401 && !d.sayHello(ctx) {
				return // as nymph does: a refused credential says hello again
			}
			if !d.bo.Wait(ctx) {
				return
			}
			continue
		}
		resp = messages.PollResponse{}
		if err := messages.Unmarshal(answer, &resp); err != nil {
			d.f.c.daemonDecode.Add(1)
			d.f.c.note(err)
			if !d.bo.Wait(ctx) {
				return
			}
			continue
		}
		d.bo.Reset()
		at := d.f.tr.now()
		for _, c := range resp.Commands {
			if c.Kind != messages.KindExec {
				continue
			}
			ex, ok := messages.DecodeCommand(c).(*messages.Exec)
			if !ok {
				d.f.c.daemonDecode.Add(1)
				continue
			}
			if d.f.tr.markDelivered(ex.ExecID, at) {
				d.postResult(ctx, ex.ExecID)
			}
		}
		if resp.Cursor != nil {
			d.cursor = resp.Cursor
		}
	}
}

// sayHello registers, retrying with the daemon's backoff; false when ctx
// ended it or the control plane rejected the hello.
func (d *simDaemon) sayHello(ctx context.Context) bool {
	for {
		answer, err := d.conn.post(ctx, uplink.PathHello, d.hello)
		if err == nil {
			var hr messages.HelloResponse
			if err := messages.Unmarshal(answer, &hr); err != nil {
				d.f.c.daemonDecode.Add(1)
				d.f.c.note(err)
			} else if hr.Reject != nil {
				d.f.c.rejected.Add(1)
				d.f.c.note(fmt.Errorf("hello rejected: %s: %s", hr.Reject.Code, hr.Reject.Message))
				return false
			} else if hr.WorkerID == nil || *hr.WorkerID == "" {
				d.f.c.daemonDecode.Add(1)
				d.f.c.note(errors.New("hello answered without a worker id"))
			} else {
				d.workerID.Store(hr.WorkerID)
				d.cursor = hr.Cursor
				d.bo.Reset()
				return true
			}
		} else if ctx.Err() == nil {
			d.f.c.daemonErr(err)
		}
		if !d.bo.Wait(ctx) {
			return false
		}
	}
}

// postResult posts an exec's result until it is taken, as nymph's outbox
// does.
func (d *simDaemon) postResult(ctx context.Context, execID string) {
	path := uplink.ExecResultPath(execID)
	for {
		_, err := d.conn.post(ctx, path, d.result)
		if err == nil {
			d.f.tr.markFinished(execID, d.f.tr.now())
			d.bo.Reset()
			return
		}
		if ctx.Err() != nil {
			return
		}
		d.f.c.daemonErr(err)
		if !d.bo.Wait(ctx) {
			return
		}
	}
}
