package controlplane

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"
	"unsafe"

	"github.com/rs/zerolog"

	"nymph/lakeshore/store"
	"nymph/messages"
)

var pollChecks = []check{
	{path: "worker_id", required: true, kind: kNonEmpty},
	{path: "queue", kind: kString},
	{path: "timeout_s", kind: kNumber},
	{path: "cursor", kind: kStrOrUint},
	{path: "invocations", kind: kMapsList, elemCost: invocationStatusCost},
	{path: "updated_capabilities", kind: kMap},
	{path: "updated_capabilities.runners", kind: kStrings},
	{path: "updated_capabilities.max_invocations", kind: kUint32},
	{path: "updated_capabilities.workdir", kind: kString},
	{path: "hibernating", kind: kBool},
}

// invocationStatusCost is what one element of invocations decodes to: the
// struct and the smallest allocations of its strings.
const invocationStatusCost = int(unsafe.Sizeof(messages.InvocationStatus{})) + 3*16

var invocationChecks = []check{
	{path: "invocation_id", kind: kString},
	{path: "state", kind: kString},
	{path: "started_at", kind: kNumber},
	{path: "stdout_tail", kind: kString},
}

// A poll is served in three steps: beginPoll (decode, record), the wait
// (lookPoll, then park until woken or the time is up, as often as it
// takes) and endPoll (the answer). Most of the 10,000 polls of a fleet
// are in the wait at any moment, for up to 20 s each, so what the wait
// keeps alive is what a fleet costs: over HTTP/1.1 from Serve, the poll
// takes its connection from net/http and waits in goroutines of its own
// (parked.go), which keep only the connection and the pollState; the
// handler's goroutine, its buffers and the request are gone. Otherwise
// (HTTP/2, a Handler served by someone else) it waits in the handler.
// Either way the frames that park are small (what the poll carries lives
// in the pollState on the heap), and beginPoll, lookDue and endPoll, which
// decode, read and write, run in frames of their own that are gone by the
// time the poll parks.
func (s *Server) handlePoll(w http.ResponseWriter, r *http.Request, _ daemonPrincipal) {
	ps := s.beginPoll(w, r)
	if ps == nil {
		return
	}
	ps.timer = time.NewTimer(ps.timeout)
	var handoff func(woken <-chan struct{}, release func()) bool
	if lot := parkingFor(r); lot != nil && ps.timeout > 0 {
		handoff = func(woken <-chan struct{}, release func()) bool {
			return s.parkConn(lot, w, r, ps, woken, release)
		}
	}
	switch s.waitPoll(r.Context(), ps, handoff) {
	case waitGone, waitParked:
		return
	}
	ps.timer.Stop()
	s.endPoll(r.Context(), w, ps)
}

// How waitPoll ended.
type waitEnd int

const (
	waitAnswer waitEnd = iota // answer with what the pollState holds
	waitGone                  // the daemon went away: answer nothing
	waitParked                // the connection was parked: answered from there
)

// waitPoll looks for what the worker is due and parks until something is,
// or the poll's time is up. handoff, when set, is offered the wait the
// first time it would park; once it takes it, the wait goes on elsewhere.
func (s *Server) waitPoll(ctx context.Context, ps *pollState, handoff func(woken <-chan struct{}, release func()) bool) waitEnd {
	for {
		woken, release, due := s.lookPoll(ctx, ps)
		if due {
			return waitAnswer
		}
		if handoff != nil {
			if handoff(woken, release) {
				return waitParked
			}
			handoff = nil
		}
		switch s.park(workerKey(ps.view.id), woken, release, ps.timer.C, ctx.Done()) {
		case parkGone:
			ps.timer.Stop()
			return waitGone
		case parkOver:
			return waitAnswer
		}
	}
}

// lookPoll subscribes to the worker's wake-ups, then looks for what it is
// due: true when the poll is to answer now; otherwise the subscription to
// park on. A watch poll (a hibernating daemon's) looks only for a wake
// until one is queued, then as any poll does.
func (s *Server) lookPoll(ctx context.Context, ps *pollState) (<-chan struct{}, func(), bool) {
	woken, release := s.wake.subscribe(workerKey(ps.view.id))
	if ps.watch {
		if !s.wakeQueued(ctx, ps) {
			return woken, release, false
		}
		ps.watch = false
	}
	if s.lookDue(ctx, ps, ps.first) {
		release()
		return nil, nil, true
	}
	if ps.first {
		// What only the first look needs: the worker RecordPoll read.
		ps.first, ps.wk = false, nil
	}
	return woken, release, false
}

// pollState is one poll between its steps.
type pollState struct {
	// base is the server's logger; logger adds the worker to it when a
	// line is logged (most polls log none, and a logger kept per parked
	// poll is a few hundred bytes each).
	base     *zerolog.Logger
	log      *zerolog.Logger
	workerID string
	view     pollView
	gen      uint64
	quiet    bool
	wk       *store.Worker // what RecordPoll read; nil for a quiet poll
	running  int
	known    bool // running is what the store said
	after    int64
	legacy   bool
	watch    bool // a hibernating daemon's watch poll, until a wake is queued
	first    bool // no look yet
	timeout  time.Duration
	timer    *time.Timer // the end of the wait
	now      time.Time

	cmds []store.Command
	err  error
	// deliveredGen is the generation the take that found cmds began at.
	deliveredGen uint64
	// takenAt is the time that take marked them delivered at.
	takenAt time.Time
}

// logger is the poll's logger, with its worker.
func (ps *pollState) logger() *zerolog.Logger {
	if ps.log == nil {
		l := ps.base.With().Str("worker_id", ps.workerID).Logger()
		ps.log = &l
	}
	return ps.log
}

// beginPoll decodes the poll and records what it says, unless it says
// nothing new (answered from memory, presence.go). nil: answered already.
//
//go:noinline
func (s *Server) beginPoll(w http.ResponseWriter, r *http.Request) *pollState {
	req, cursor, err := s.decodePoll(w, r)
	if err != nil {
		s.log.Info().Err(err).Msg("poll refused as malformed")
		writeDaemonError(w, err)
		return nil
	}
	ps := &pollState{base: &s.log, now: s.now(), first: true,
		legacy: cursor == nil, watch: req.Hibernating, timeout: s.pollWait(req.TimeoutS)}
	ps.workerID = req.WorkerID
	view, gen, kind := s.presence.look(req.WorkerID, req.Queue, cursor, len(req.Invocations) > 0, req.UpdatedCapabilities != nil, ps.now)
	if kind == pollAckOnly {
		var ok bool
		if kind, ok = s.ackOnly(w, r, ps, view, *cursor); !ok {
			return nil
		}
		view, gen = ps.view, ps.gen
	}
	ps.view, ps.gen, ps.quiet = view, gen, kind == pollQuiet
	if !ps.quiet {
		if kind == pollAck {
			// The memo holds but for what the cursor acknowledges.
			ps.gen = s.presence.current(req.WorkerID, ps.now)
		} else {
			ps.gen = s.presence.generation(req.WorkerID, ps.now)
		}
		poll := store.Poll{WorkerID: req.WorkerID, Queue: req.Queue, Cursor: cursor, Now: ps.now,
			Running: make([]store.InvocationStatus, 0, len(req.Invocations))}
		for _, inv := range req.Invocations {
			poll.Running = append(poll.Running, store.InvocationStatus{
				InvocationID: inv.InvocationID, State: inv.State, StartedAt: epochTime(inv.StartedAt),
				ExitCode: inv.ExitCode, StdoutTail: inv.StdoutTail,
			})
		}
		if c := req.UpdatedCapabilities; c != nil {
			poll.UpdatedCapabilities = &store.Capabilities{Runners: c.Runners, MaxInvocations: c.MaxInvocations, Workdir: c.Workdir}
			ps.logger().Info().Strs("runners", c.Runners).Msg("capabilities updated")
		}
		wk, err := s.st.RecordPoll(r.Context(), poll)
		if isNotFound(err) {
			s.presence.drop(req.WorkerID)
			writeDaemonError(w, errUnknownWorker)
			return nil
		}
		if err != nil && r.Context().Err() != nil {
			ps.logger().Debug().Err(err).Msg("poll abandoned by the daemon")
			return nil
		}
		if err != nil {
			ps.logger().Error().Err(err).Msg("poll: store")
			writeDaemonError(w, err)
			return nil
		}
		ps.wk = &wk
		if kind == pollAck {
			// The memo knows nothing runs there, and the poll says so.
			ps.running, ps.known = 0, true
		} else {
			ps.running, ps.known = s.reportRunning(r.Context(), wk.ID, poll.Running, *ps.logger())
		}
		ps.view = pollView{id: wk.ID, namespace: wk.Namespace, deliveredSeq: wk.DeliveredSeq, ackedSeq: wk.AckedSeq}
	}
	// after is where delivery resumes. With a cursor it is the cursor, but
	// never past what was delivered; without one, everything unacknowledged
	// is due and is acknowledged by being sent.
	if !ps.legacy {
		ps.after = min(*cursor, ps.view.deliveredSeq)
	}
	return ps
}

// ackOnly writes the acknowledgement of a pollAckOnly poll and nothing
// else, and turns it into a quiet poll on the memo (ps.view, ps.gen): the
// poll after every delivery costs one small write, not RecordPoll's.
// Should the memo stop holding meanwhile, the poll goes the full way
// (pollFull). false: answered already.
func (s *Server) ackOnly(w http.ResponseWriter, r *http.Request, ps *pollState, view pollView, cursor int64) (pollKind, bool) {
	// The store clamps the cursor to what was delivered, as RecordPoll
	// does (another replica may have delivered more than the memo knows).
	acked, err := s.st.AckThrough(r.Context(), view.id, cursor, ps.now)
	switch {
	case isNotFound(err):
		s.presence.drop(view.id)
		writeDaemonError(w, errUnknownWorker)
		return 0, false
	case err != nil && r.Context().Err() != nil:
		ps.logger().Debug().Err(err).Msg("poll abandoned by the daemon")
		return 0, false
	case err != nil:
		ps.logger().Error().Err(err).Msg("poll: store")
		writeDaemonError(w, err)
		return 0, false
	}
	v, gen, ok := s.presence.acked(view.id, acked, ps.now)
	if !ok {
		return pollFull, true
	}
	ps.view, ps.gen = v, gen
	return pollQuiet, true
}

// lookDue claims and takes what the worker is due; true when the poll is
// to answer now (commands, or an error).
//
//go:noinline
func (s *Server) lookDue(ctx context.Context, ps *pollState, first bool) bool {
	g := s.presence.current(ps.view.id, ps.now)
	claim, take := s.presence.due(ps.view.id, ps.after)
	if first && ps.known {
		// What RecordPoll just read is newer than any memo: nothing
		// waits past its last seq unless something was queued since.
		claim = claim || ps.running > 0
		take = take && (g != ps.gen || ps.wk.LastSeq > max(ps.after, ps.wk.AckedSeq))
	}
	claimed := true
	if claim {
		var n int
		n, claimed = s.dispatch(ctx, ps.view.id, *ps.logger())
		ps.running += n
		// Each claim queued a run command the memo knows nothing of.
		take = take || n > 0
	}
	if take {
		ps.deliveredGen, ps.takenAt = g, s.now()
		ps.cmds, ps.err = s.st.Take(ctx, ps.view.id, ps.after, pollBatch, ps.legacy, ps.takenAt)
		if ps.err != nil || len(ps.cmds) > 0 {
			return true
		}
	}
	switch {
	case !first || !claimed:
	case !ps.quiet && ps.known:
		s.presence.settle(*ps.wk, ps.gen, ps.after, ps.running, ps.now)
	case ps.quiet && (claim || take):
		s.presence.nothingDue(ps.view.id, ps.gen, ps.after)
	}
	return false
}

// endPoll answers the poll with what it found.
//
//go:noinline
func (s *Server) endPoll(ctx context.Context, w http.ResponseWriter, ps *pollState) {
	if err := ps.err; err != nil {
		if isNotFound(err) {
			s.presence.drop(ps.view.id)
			writeDaemonError(w, errUnknownWorker)
			return
		}
		if ctx.Err() != nil {
			// The daemon abandoned this poll (a wake signal): routine.
			ps.logger().Debug().Err(err).Msg("poll abandoned by the daemon")
			return
		}
		ps.logger().Error().Err(err).Msg("poll: take commands")
		writeDaemonError(w, err)
		return
	}
	if len(ps.cmds) > 0 {
		s.presence.delivered(ps.view.id, ps.deliveredGen, ps.cmds, ps.legacy)
		s.metrics.observeDelivered(ps.cmds, ps.takenAt, s.now())
	}
	s.writePollResponse(ctx, w, ps.view, ps.after, ps.cmds, ps.legacy, *ps.logger())
}

// pollWait is how long a poll that finds nothing waits: what the daemon
// asked (at most the server's cap), ended at a random point between 0.8
// and 1.0 of it, so that a fleet whose daemons said hello together drifts
// out of lockstep within a few cycles instead of polling in waves.
func (s *Server) pollWait(timeoutS float64) time.Duration {
	if timeoutS <= 0 {
		return 0
	}
	d := min(time.Duration(timeoutS*float64(time.Second)), s.pollCap)
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// writePollResponse answers a poll with cmds and the cursor past them.
func (s *Server) writePollResponse(ctx context.Context, w http.ResponseWriter, wk pollView, after int64, cmds []store.Command, legacy bool, log zerolog.Logger) {
	next := max(after, wk.ackedSeq)
	resp := &messages.PollResponse{Commands: make([]messages.Command, 0, len(cmds))}
	for _, c := range cmds {
		resp.Commands = append(resp.Commands, messages.Command{ID: c.ID, Kind: c.Kind, Body: c.Body})
		next = max(next, c.Seq)
		if c.Kind == messages.KindExec {
			if e, ok := messages.DecodeCommand(messages.Command{Kind: c.Kind, Body: c.Body}).(*messages.Exec); ok {
				s.handedOver.note(e.ExecID, wk.namespace, wk.id)
				s.wake.broadcast(execStateKey(e.ExecID))
				log.Debug().Str("exec_id", e.ExecID).Str("command_id", c.ID).Msg("exec delivered")
			}
		}
	}
	cur := strconv.FormatInt(next, 10)
	resp.Cursor = &cur
	resp.TargetNymphVersion = s.targetVersionFor(ctx, wk.namespace, log)
	if len(cmds) > 0 {
		log.Debug().Int("commands", len(cmds)).Str("cursor", cur).Bool("legacy", legacy).Msg("commands delivered")
	}
	writeMsgpack(w, http.StatusOK, resp)
}

// wakeQueued reports whether a wake is queued for a watch poll's worker
// after the poll's cursor. A store error counts as one: the ordinary take
// that follows reports it.
func (s *Server) wakeQueued(ctx context.Context, ps *pollState) bool {
	// A wake is a command: with none due, none is pending.
	if _, take := s.presence.due(ps.view.id, ps.after); !take {
		return false
	}
	pending, err := s.st.WakePending(ctx, ps.view.id, ps.after)
	if pending {
		ps.logger().Info().Msg("wake queued for a hibernating daemon; its watch poll answers")
	}
	return pending || err != nil
}

func (s *Server) decodePoll(w http.ResponseWriter, r *http.Request) (messages.PollRequest, *int64, error) {
	body, err := readBody(w, r, limitPoll)
	if err != nil {
		return messages.PollRequest{}, nil, err
	}
	return decodePollBody(body)
}

// decodePollBody checks and decodes a poll body, and returns its cursor.
func decodePollBody(body []byte) (messages.PollRequest, *int64, error) {
	var req messages.PollRequest
	m, err := scanMap(body)
	if err != nil {
		return req, nil, err
	}
	if err := runChecks(m, pollChecks); err != nil {
		return req, nil, err
	}
	invs, _ := m.Get("invocations")
	i := 0
	for inv := range invs.Elems() {
		if err := runChecks(inv, invocationChecks); err != nil {
			fe := err.(*fieldError)
			fe.field = "invocations[" + strconv.Itoa(i) + "]." + fe.field
			return req, nil, fe
		}
		i++
	}
	// The cursor is decoded here, not by the typed decoder, because a daemon
	// may send it as a string (what this server hands out) or an integer.
	var cursor *int64
	c, _ := m.Get("cursor")
	switch {
	case len(c) == 0 || c.IsNil():
	case c.Type() == messages.TypeStr:
		s, _ := c.Str()
		n, err := strconv.ParseInt(string(s), 10, 64)
		if err != nil || n < 0 {
			return req, nil, badField(http.StatusUnprocessableEntity, "cursor", "must be a cursor this server handed out")
		}
		cursor = &n
	default:
		n, _ := c.Int()
		cursor = &n
		// The typed decoder wants a string there: the integer becomes a
		// nil in a copy of the body. c is a slice of body, so the
		// difference of their capacities is where it starts.
		off := cap(body) - cap(c)
		body = append(append(append(make([]byte, 0, len(body)), body[:off]...), 0xc0), body[off+len(c):]...)
	}
	if err := decodeTyped(body, &req); err != nil {
		return req, nil, err
	}
	if math.IsNaN(req.TimeoutS) || req.TimeoutS < 0 {
		return req, nil, badField(http.StatusUnprocessableEntity, "timeout_s", "must be a non-negative number")
	}
	return req, cursor, nil
}

// epochTime converts wire seconds, clamping what time.Time cannot hold in
// milliseconds.
func epochTime(e messages.Epoch) time.Time {
	const maxSecs = math.MaxInt64 / 1000
	v := int64(e)
	if v > maxSecs || v < -maxSecs {
		v = 0
	}
	return time.Unix(v, 0).UTC()
}
