// Package poller owns the daemon's conversation with the control plane:
// hello, then the long-poll loop, the spec's jittered backoff on errors, the
// max_invocations permits (no free permit, no poll), the wake signal (a
// finished run or setup abandons the in-flight poll and polls at once, so
// that the control plane hears of it; with a legacy server, which deletes
// commands as it delivers them, an in-flight poll is never abandoned; a
// finished exec keeps the poll in flight, see PermitFreed), the cursor
// (echo the last one received; never run a command id twice), hibernate,
// reset_backoff and the idle policy.
//
// A hibernating daemon stops polling for work. With a control plane whose
// hello offers it (HibernateWake), it keeps one watch poll open instead,
// which that control plane answers only once a wake is queued (a hibernate
// whose deadline is now): the answer ends the hibernation early and is
// handled as an ordinary batch.
//
// A single-job daemon (keep_alive_s = 0) takes exactly one job: once it
// has accepted an exec or a run it polls no more (commands a cursor-speaking
// server still holds for it stay queued there, unacknowledged, and lose
// nothing), refuses with an outcome every other job the batch that brought
// its job carries (an old control plane may send several), and exits once
// its job and any setup are done, abandoning whatever request is in flight.
//
// Nothing here blocks inside Receive: each request runs in a goroutine that
// reports back with a message tagged by a sequence number, so the answer to
// an abandoned request, or to a previous incarnation's, is recognised and
// dropped. Timers are scheduler messages tagged the same way. What must
// survive a crash (worker id, cursor, handled ids, backoff, hibernation)
// lives in State, outside the actor instance.
package poller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/scheduler"
	"github.com/rs/zerolog"

	"nymph/actors/ledger"
	"nymph/gopool"
	"nymph/messages"
)

// Server is the part of the control plane client the poller uses.
type Server interface {
	Hello(ctx context.Context, req *messages.HelloRequest) (*messages.HelloResponse, error)
	Poll(ctx context.Context, req *messages.PollRequest) (*messages.PollResponse, error)
}

// Setups is what the poller needs to know of the setup queue.
type Setups interface {
	Idle() bool
	LastActivity() time.Time
}

// Settings are the poller's knobs.
type Settings struct {
	// Hello is sent as is on first contact.
	Hello messages.HelloRequest
	// ProvisionalID is the worker id kept when hello returns none.
	ProvisionalID string
	Queue         string
	// WaitMax is the poll's timeout_s.
	WaitMax time.Duration
	// RequestTimeout bounds one hello or poll request (default WaitMax + 30 s).
	RequestTimeout time.Duration
	// MaxInvocations is the number of permits; 0 is unbounded.
	MaxInvocations int
	// KeepAlive is the idle policy: < 0 never exit, 0 take one job and
	// exit after it (single-job), > 0 exit after that long idle.
	KeepAlive time.Duration
	// AckHold bounds how long the poll after a batch with an exec waits
	// for the exec's process to start (default DefaultAckHold).
	AckHold time.Duration
}

// singleJob reports the single-job idle policy.
func (s *Settings) singleJob() bool { return s.KeepAlive == 0 }

// Metrics takes what the poller measures (the daemon's metrics.Recorder).
// It is called on the poller's mailbox and must return at once.
type Metrics interface {
	// PollFailed counts a hello or poll that failed; retryIn is the
	// backoff before the next try.
	PollFailed(retryIn time.Duration)
	// PollSucceeded records a hello or poll answered at at.
	PollSucceeded(at time.Time)
}

// Deps is everything the poller uses. It outlives every incarnation.
type Deps struct {
	Settings
	Server Server
	State  *State
	Ledger *ledger.Ledger
	Setups Setups
	// Metrics, when set, counts failed requests and records the backoff
	// and the last success.
	Metrics Metrics
	Log     zerolog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// PropsOptions are added to the actor's props.
	PropsOptions []actor.PropsOption
	// Goroutines runs each poll's goroutine (nil: a goroutine of its own).
	Goroutines *gopool.Pool
}

// Props returns the props of the poller.
func Props(deps *Deps) *actor.Props {
	d := *deps
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.RequestTimeout <= 0 {
		d.RequestTimeout = d.WaitMax + 30*time.Second
	}
	if d.AckHold <= 0 {
		d.AckHold = DefaultAckHold
	}
	return actor.PropsFromProducer(func() actor.Actor { return &poller{d: &d} }, d.PropsOptions...)
}

// PermitFreed tells the poller that an exec ended. Unlike a Wake it keeps
// a poll that is in flight: the control plane learns of an exec's end from
// its result, not from a poll, and answers a held poll as soon as anything
// is queued for the worker, so the held poll still serves. Abandoning it
// cost every exec a new connection and a fresh poll for the control plane
// to record. Without a poll in flight (max_invocations were all taken) it
// polls at once.
type PermitFreed struct{}

// TargetVersion is sent to the parent for every poll response that carries
// a target_nymph_version: the fleet's wanted daemon version, for
// auto-update to compare with its own. The poller itself does nothing with it.
type TargetVersion struct {
	Version string
}

// Self-messages. seq/gen tie each one to the request or timer it answers.
type (
	helloDone struct {
		seq  uint64
		resp *messages.HelloResponse
		err  error
	}
	pollDone struct {
		seq         uint64
		resp        *messages.PollResponse
		err         error
		capsVersion uint64
	}
	retry         struct{ gen uint64 }
	holdOver      struct{ gen uint64 }
	hibernateOver struct{ gen uint64 }
	idleCheck     struct{ gen uint64 }
	repoll        struct{}
)

type poller struct {
	d     *Deps
	sched *scheduler.TimerScheduler

	inflight    uint64
	cancelReq   context.CancelFunc
	pollingNow  bool // the in-flight request is a poll (not a hello)
	watching    bool // the in-flight poll is a hibernation's watch poll
	retryGen    uint64
	cancelRetry scheduler.CancelFunc
	hibGen      uint64
	cancelHib   scheduler.CancelFunc
	idleGen     uint64
	idleDue     time.Time
	cancelIdle  scheduler.CancelFunc
	stopped     bool
	wakeQueued  bool
	// holdGen is set while the poll after a batch with an exec waits for
	// the exec's process (ExecStarted), at most AckHold.
	holdGen    uint64
	cancelHold scheduler.CancelFunc
}

// DefaultAckHold bounds how long the poll that follows a batch with an
// exec in it waits for that exec's process to start. The poll only
// acknowledges the batch and waits for more; on a daemon of one
// processor, sent first it ran ahead of the exec's spawn (a request built,
// signed and written: some 150 µs of the spawn's path, measured).
const DefaultAckHold = 5 * time.Millisecond

func (p *poller) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		p.sched = scheduler.NewTimerScheduler(ctx)
		p.resume(ctx)
	case *actor.Stopping, *actor.Restarting:
		p.cancelAll()
	case *messages.Shutdown:
		if !p.stopped {
			p.d.Log.Info().Msg("poller stopping: no more polls")
		}
		p.stopped = true
		p.cancelAll()
	case *messages.Wake:
		// Coalesce a burst of wakes into one abandoned poll.
		if !p.wakeQueued {
			p.wakeQueued = true
			ctx.Send(ctx.Self(), &repoll{})
		}
	case *PermitFreed:
		// An exec that never started ends the hold too.
		p.endHold()
		p.maybePoll(ctx)
	case *messages.ExecStarted:
		if p.holdGen != 0 {
			p.endHold()
			p.maybePoll(ctx)
		}
	case *holdOver:
		if m.gen == p.holdGen {
			p.holdGen, p.cancelHold = 0, nil
			p.maybePoll(ctx)
		}
	case *repoll:
		p.wakeQueued = false
		// Only a server that speaks the cursor keeps the commands of an
		// abandoned poll; a legacy one deleted them when it answered, so
		// with it the in-flight poll is left to return on its own (the
		// server ends it as soon as there is work).
		if p.inflight != 0 && p.pollingNow && !p.watching && p.d.State.Cursor() != nil {
			p.abandon()
		}
		p.maybePoll(ctx)
	case *helloDone:
		p.helloDone(ctx, m)
	case *pollDone:
		p.pollDone(ctx, m)
	case *retry:
		if m.gen == p.retryGen {
			p.retryGen, p.cancelRetry = 0, nil
			p.resume(ctx)
		}
	case *hibernateOver:
		if m.gen == p.hibGen {
			p.hibGen, p.cancelHib = 0, nil
			if p.watching {
				p.abandon()
				p.watching = false
			}
			p.d.State.endHibernate(p.d.Now())
			p.d.Log.Info().Msg("hibernation over; polling again")
			p.resume(ctx)
		}
	case *idleCheck:
		if m.gen == p.idleGen {
			p.idleGen, p.cancelIdle, p.idleDue = 0, nil, time.Time{}
			if !p.stopped && !p.idleExpired(ctx) {
				p.maybePoll(ctx)
			}
		}
	}
}

// resume continues wherever the daemon is: hibernating, saying hello, or
// polling.
func (p *poller) resume(ctx actor.Context) {
	if p.stopped {
		return
	}
	if until := p.d.State.hibernateUntil(); !until.IsZero() {
		if d := until.Sub(p.d.Now()); d > 0 {
			p.scheduleHibernate(ctx, d)
			p.watch(ctx)
			return
		}
		p.d.State.endHibernate(p.d.Now())
	}
	if !p.d.State.isRegistered() {
		p.startHello(ctx)
		return
	}
	p.maybePoll(ctx)
}

func (p *poller) busy() bool {
	return p.stopped || p.inflight != 0 || p.retryGen != 0 || p.hibGen != 0 || p.holdGen != 0
}

// hold puts the next poll off until an exec of the batch just taken has
// started, or AckHold.
func (p *poller) hold(ctx actor.Context) {
	p.endHold()
	p.holdGen = p.d.State.nextSeq()
	p.cancelHold = p.sched.SendOnce(p.d.AckHold, ctx.Self(), &holdOver{gen: p.holdGen})
}

func (p *poller) endHold() {
	if p.cancelHold != nil {
		p.cancelHold()
	}
	p.holdGen, p.cancelHold = 0, nil
}

func (p *poller) maybePoll(ctx actor.Context) {
	if p.stopped {
		return
	}
	if p.d.singleJob() && p.d.State.SingleJob() != "" {
		// A single-job daemon that has its job polls no more, whatever
		// else is pending (a retry, a hibernation): it only waits for its
		// job, and any setup, to end, then exits.
		p.idleExpired(ctx)
		return
	}
	if p.inflight != 0 && p.retryGen == 0 && p.hibGen == 0 {
		// A request in flight (a legacy server's poll, which a wake does
		// not abandon) does not put the idle policy off: its timer is set
		// now, and an exit abandons the request.
		p.idleExpired(ctx)
		return
	}
	if p.busy() || !p.d.State.isRegistered() {
		return
	}
	if p.idleExpired(ctx) {
		return
	}
	if max := p.d.MaxInvocations; max > 0 && p.d.Ledger.Active() >= max {
		// No free permit: no poll until a job ends and wakes us.
		p.d.Log.Debug().Int("active", p.d.Ledger.Active()).Msg("no free permit; not polling")
		return
	}
	p.startPoll(ctx, false)
}

// watch opens a hibernation's watch poll, when the control plane offers
// it and nothing else is in flight.
func (p *poller) watch(ctx actor.Context) {
	if p.stopped || p.inflight != 0 || p.retryGen != 0 || p.hibGen == 0 || !p.d.State.canWatch() {
		return
	}
	p.startPoll(ctx, true)
}

func (p *poller) startHello(ctx actor.Context) {
	seq := p.d.State.nextSeq()
	req := p.d.Hello
	rctx, cancel := context.WithTimeout(context.Background(), p.d.RequestTimeout)
	p.inflight, p.cancelReq, p.pollingNow = seq, cancel, false
	sys, self, server := ctx.ActorSystem(), ctx.Self(), p.d.Server
	go func() {
		defer cancel()
		resp, err := server.Hello(rctx, &req)
		sys.Root.Send(self, &helloDone{seq: seq, resp: resp, err: err})
	}()
}

func (p *poller) helloDone(ctx actor.Context, m *helloDone) {
	if m.seq != p.inflight {
		return
	}
	p.inflight, p.cancelReq = 0, nil
	if p.stopped {
		return
	}
	if m.err != nil {
		p.backOff(ctx, m.err, "hello failed")
		return
	}
	if r := m.resp.Reject; r != nil {
		p.d.Log.Error().Str("code", r.Code).Str("message", r.Message).Msg("hello rejected by the control plane")
		p.stopped = true
		ctx.Send(ctx.Parent(), &messages.HelloRejected{Code: r.Code, Message: r.Message})
		return
	}
	id, provisional := p.d.ProvisionalID, true
	if m.resp.WorkerID != nil && *m.resp.WorkerID != "" {
		id, provisional = *m.resp.WorkerID, false
	}
	p.d.State.register(id, m.resp.Cursor, m.resp.HibernateWake)
	p.d.State.resetBackoff()
	p.succeeded()
	p.d.Log.Info().Str("worker_id", id).Bool("provisional", provisional).Msg("hello accepted")
	ctx.Send(ctx.Parent(), &messages.Registered{WorkerID: id, Provisional: provisional})
	p.maybePoll(ctx)
}

func (p *poller) startPoll(ctx actor.Context, watch bool) {
	seq := p.d.State.nextSeq()
	caps, version := p.d.State.pendingCaps()
	req := &messages.PollRequest{
		WorkerID:            p.d.State.WorkerID(),
		Queue:               p.d.Queue,
		TimeoutS:            p.d.WaitMax.Seconds(),
		Cursor:              p.d.State.Cursor(),
		Invocations:         p.d.Ledger.Running(),
		UpdatedCapabilities: caps,
		Hibernating:         watch,
	}
	rctx, cancel := context.WithTimeout(context.Background(), p.d.RequestTimeout)
	p.inflight, p.cancelReq, p.pollingNow, p.watching = seq, cancel, true, watch
	sys, self, server := ctx.ActorSystem(), ctx.Self(), p.d.Server
	p.d.Goroutines.Go(func() {
		defer cancel()
		resp, err := server.Poll(rctx, req)
		sys.Root.Send(self, &pollDone{seq: seq, resp: resp, err: err, capsVersion: version})
	})
}

func (p *poller) pollDone(ctx actor.Context, m *pollDone) {
	if m.seq != p.inflight {
		return // abandoned or from a previous incarnation
	}
	p.inflight, p.cancelReq = 0, nil
	watched := p.watching
	p.watching = false
	if p.stopped {
		return
	}
	if m.err != nil {
		// A 401 means this daemon's credentials stopped working (a revoked
		// key or token). Say hello again, so that a refusal ends the daemon
		// with its reason instead of leaving it polling forever.
		if httpStatus(m.err) == http.StatusUnauthorized {
			p.d.State.unregister()
		}
		p.backOff(ctx, m.err, "poll failed")
		return
	}
	p.d.State.resetBackoff()
	p.succeeded()
	p.d.State.capsShipped(m.capsVersion)
	cmds := m.resp.Commands
	if watched {
		if len(cmds) == 0 {
			p.d.State.setCursor(cursorOr(m.resp.Cursor, p.d.State.Cursor()))
			p.watch(ctx)
			return
		}
		// The control plane answers a watch poll only once a wake is
		// queued: the hibernation ends now, and the batch (the wake
		// last) is handled as any other.
		if p.cancelHib != nil {
			p.cancelHib()
		}
		p.hibGen, p.cancelHib = 0, nil
		p.d.State.endHibernate(p.d.Now())
		p.d.Log.Info().Int("commands", len(cmds)).Msg("woken before the hibernation's deadline")
	}
	started := false // an exec of the batch goes to be run
	for i, c := range cmds {
		if !p.d.State.firstTime(c.ID) {
			p.d.Log.Info().Str("command_id", c.ID).Str("kind", c.Kind).Msg("command already handled; skipped")
			continue
		}
		switch b := messages.DecodeCommand(c).(type) {
		case messages.Unknown:
			p.d.Log.Warn().Str("command_id", b.ID).Str("kind", b.Kind).Str("reason", b.Reason).Msg("command skipped")
		case messages.ResetBackoff:
			p.d.State.resetBackoff()
			p.d.Log.Info().Str("command_id", c.ID).Msg("backoff reset")
		case *messages.Hibernate:
			if rest := len(cmds) - i - 1; rest > 0 {
				p.d.Log.Warn().Int("discarded", rest).Msg("hibernate: rest of the batch discarded")
			}
			p.d.State.setCursor(cursorOr(m.resp.Cursor, p.d.State.Cursor()))
			p.hibernate(ctx, b)
			return
		case *messages.Exec:
			// The job enters the ledger here, not when the parent gets the
			// message, so the permit count the next maybePoll reads already
			// holds it: max_invocations is never exceeded by a poll racing
			// its own dispatch.
			started = p.acceptJob(ctx, c, ledger.Exec, "exec_id", b.ExecID, b) || started
		case *messages.Run:
			_ = p.acceptJob(ctx, c, ledger.Run, "invocation_id", b.InvocationID, b)
		default:
			ctx.Send(ctx.Parent(), &messages.Dispatch{CommandID: c.ID, Kind: c.Kind, Body: b})
		}
	}
	p.d.State.setCursor(cursorOr(m.resp.Cursor, p.d.State.Cursor()))
	if started {
		p.hold(ctx)
	}
	// After the batch, so an ota_update in it is seen before the target.
	if v := m.resp.TargetNymphVersion; v != nil && *v != "" {
		ctx.Send(ctx.Parent(), &TargetVersion{Version: *v})
	}
	p.maybePoll(ctx)
}

// acceptJob enters an exec or a run in the ledger and dispatches it, and
// says whether it goes to be run. A
// single-job daemon that already has its job enters any other as refused:
// its parent reports the refusal (exec -1, run failed Refused) through the
// same outbox as every outcome, so the control plane that sent it learns
// it will not run here.
func (p *poller) acceptJob(ctx actor.Context, c messages.Command, kind ledger.Kind, idField, id string, body any) bool {
	log := p.d.Log.With().Str("command_id", c.ID).Str(idField, id).Logger()
	if p.d.singleJob() {
		if job := p.d.State.SingleJob(); job != "" {
			reason := fmt.Sprintf("refused: this single-job daemon (keep_alive_s = 0) already has its job (%s); it takes no other", job)
			if !p.d.Ledger.Refuse(kind, id, body, reason) {
				log.Warn().Msg("job already known; not refused again")
				return false
			}
			ctx.Send(ctx.Parent(), &messages.Dispatch{CommandID: c.ID, Kind: c.Kind, Body: body, Refused: reason})
			return false
		}
	}
	if !p.d.Ledger.AcceptCommand(kind, id, c.ID, body) {
		noun := "exec"
		if kind == ledger.Run {
			noun = "invocation"
		}
		log.Warn().Msg(noun + " already known; not run again")
		return false
	}
	if p.d.singleJob() {
		p.d.State.takeSingleJob(string(kind) + " " + id)
		log.Info().Msg("single-job daemon has its job; it polls no more")
	}
	ctx.Send(ctx.Parent(), &messages.Dispatch{CommandID: c.ID, Kind: c.Kind, Body: body})
	return true
}

// httpStatus is the HTTP status behind err, or 0.
func httpStatus(err error) int {
	var se interface{ HTTPStatus() int }
	if errors.As(err, &se) {
		return se.HTTPStatus()
	}
	return 0
}

// cursorOr keeps the last cursor received when a response carries none.
func cursorOr(c, last *string) *string {
	if c != nil {
		return c
	}
	return last
}

func (p *poller) hibernate(ctx actor.Context, h *messages.Hibernate) {
	until := time.Unix(int64(h.UntilEpochS), 0)
	d := until.Sub(p.d.Now())
	p.d.Log.Info().Time("until", until).Dur("for", max(d, 0)).Msg("hibernating")
	if d <= 0 {
		p.d.State.endHibernate(p.d.Now())
		p.maybePoll(ctx)
		return
	}
	p.d.State.setHibernate(until)
	p.scheduleHibernate(ctx, d)
	p.watch(ctx)
}

func (p *poller) scheduleHibernate(ctx actor.Context, d time.Duration) {
	if p.cancelHib != nil {
		p.cancelHib()
	}
	p.hibGen = p.d.State.nextSeq()
	p.cancelHib = p.sched.SendOnce(d, ctx.Self(), &hibernateOver{gen: p.hibGen})
}

func (p *poller) backOff(ctx actor.Context, err error, what string) {
	d := p.d.State.nextDelay()
	p.d.Log.Warn().Err(err).Dur("retry_in", d).Msg(what)
	if p.d.Metrics != nil {
		p.d.Metrics.PollFailed(d)
	}
	p.retryGen = p.d.State.nextSeq()
	p.cancelRetry = p.sched.SendOnce(d, ctx.Self(), &retry{gen: p.retryGen})
}

// succeeded tells the metrics that the control plane answered.
func (p *poller) succeeded() {
	if p.d.Metrics != nil {
		p.d.Metrics.PollSucceeded(p.d.Now())
	}
}

// idleExpired applies keep_alive_s; when it says stop, it tells the root
// and stops polling.
func (p *poller) idleExpired(ctx actor.Context) bool {
	ka := p.d.KeepAlive
	if ka < 0 || p.d.Ledger.Active() > 0 || !p.d.Setups.Idle() {
		return false
	}
	reason := ""
	if ka == 0 {
		if p.d.State.SingleJob() == "" {
			return false
		}
		reason = "single-job daemon finished its job"
	} else {
		last := latest(p.d.Ledger.LastActivity(), p.d.Setups.LastActivity(), p.d.State.idleStart())
		due := last.Add(ka)
		if wait := due.Sub(p.d.Now()); wait > 0 {
			if p.idleGen == 0 || !p.idleDue.Equal(due) {
				if p.cancelIdle != nil {
					p.cancelIdle()
				}
				p.idleGen, p.idleDue = p.d.State.nextSeq(), due
				p.cancelIdle = p.sched.SendOnce(wait, ctx.Self(), &idleCheck{gen: p.idleGen})
			}
			return false
		}
		reason = "idle for keep_alive_s"
	}
	p.d.Log.Info().Str("reason", reason).Msg("idle policy: daemon exits")
	p.stopped = true
	p.cancelAll()
	ctx.Send(ctx.Parent(), &messages.IdleExit{Reason: reason})
	return true
}

// abandon cancels the in-flight request; its answer will be stale.
func (p *poller) abandon() {
	if p.cancelReq != nil {
		p.cancelReq()
	}
	p.inflight, p.cancelReq = 0, nil
}

func (p *poller) cancelAll() {
	p.abandon()
	for _, c := range []scheduler.CancelFunc{p.cancelRetry, p.cancelHib, p.cancelIdle} {
		if c != nil {
			c()
		}
	}
	p.retryGen, p.hibGen, p.idleGen = 0, 0, 0
	p.cancelRetry, p.cancelHib, p.cancelIdle = nil, nil, nil
	p.endHold()
}

func latest(ts ...time.Time) time.Time {
	var out time.Time
	for _, t := range ts {
		if t.After(out) {
			out = t
		}
	}
	return out
}
