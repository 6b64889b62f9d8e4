// Package setupqueue owns `setup` commands: a serial FIFO of host setup
// scripts and the actor that drains it, one script at a time, never inline
// in the poll loop.
//
// The FIFO lives outside the actor instance, so a crash or a stop loses
// nothing: a script that was running when its actor died was killed with
// it (its process group belongs to that actor) and is run again from the
// head of the queue by the next incarnation, which is why setup scripts must
// be idempotent. Each script runs through the process runner as a synthetic
// invocation: module "_setup", qualname = the setup's name or "setup", and
// sudo runs it as root (runuser -u root --). After exit 0 with
// refresh_capabilities, the host is probed again and the new capabilities
// go out on the next poll. Every setup that ran to its end (whatever its
// exit code) is reported to the control plane as a setup.finished event of
// its command id, with its exit code, duration and output tail, through the
// outbox.
package setupqueue

import (
	"context"
	"errors"
	"math"
	"os"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/ledger"
	"nymph/messages"
	"nymph/runners"
)

// Module is the function module of a setup's synthetic invocation.
const Module = "_setup"

// Reasons a running setup is cancelled.
const (
	reasonStopped   = "setup actor stopped"
	reasonRestarted = "setup actor restarted after a crash"
)

type item struct {
	commandID string
	setup     *messages.Setup
}

// FIFO is the queue of setups. It is safe for concurrent use.
type FIFO struct {
	mu           sync.Mutex
	items        []item
	busy         bool
	attempt      uint64
	lastActivity time.Time
}

// NewFIFO returns an empty queue.
func NewFIFO() *FIFO { return &FIFO{} }

// Push appends a setup.
func (f *FIFO) Push(commandID string, s *messages.Setup) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.items = append(f.items, item{commandID: commandID, setup: s})
	f.lastActivity = time.Now()
}

// Len counts the setups waiting or running.
func (f *FIFO) Len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.items)
}

// Idle reports whether nothing is queued or running.
func (f *FIFO) Idle() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.items) == 0 && !f.busy
}

// Busy reports whether a setup is running.
func (f *FIFO) Busy() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.busy
}

// LastActivity is when a setup was last queued or finished.
func (f *FIFO) LastActivity() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastActivity
}

// begin takes the head for running; ok is false when the queue is empty or
// a setup is already running.
func (f *FIFO) begin() (item, uint64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.busy || len(f.items) == 0 {
		return item{}, 0, false
	}
	f.busy = true
	f.attempt++
	return f.items[0], f.attempt, true
}

// finish ends the running attempt; a completed setup leaves the queue, an
// interrupted one stays at the head to run again.
func (f *FIFO) finish(attempt uint64, completed bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if attempt != f.attempt || !f.busy {
		return
	}
	f.busy = false
	f.lastActivity = time.Now()
	if completed && len(f.items) > 0 {
		f.items = f.items[1:]
	}
}

// drop empties the queue, returning what was dropped.
func (f *FIFO) drop() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.items)
	if f.busy {
		n--
	}
	if f.busy && len(f.items) > 0 {
		f.items = f.items[:1]
	} else {
		f.items = nil
	}
	return n
}

// CapabilitiesSink receives a fresh capabilities snapshot to ship on the
// next poll.
type CapabilitiesSink interface {
	SetUpdatedCapabilities(c messages.Capabilities)
}

// Outcomes takes each finished setup's outcome event and posts it durably
// (the outbox), so that it reaches the operator even across a control plane
// that is down for a while.
type Outcomes interface {
	Event(e *messages.Event) error
}

// Metrics counts setups by the state of their outcome (the daemon's
// metrics.Recorder). It is called from the setup's goroutine and must be
// safe for concurrent use.
type Metrics interface {
	SetupFinished(state string)
}

// Deps is what the setup-queue actor needs. It outlives every instance.
type Deps struct {
	// Metrics, when set, counts each setup that ran to its end (or could
	// not run at all).
	Metrics Metrics
	FIFO    *FIFO
	// Runner is the process runner.
	Runner runners.Runner
	// Workdir holds each setup's scratch directory.
	Workdir string
	// Reprobe returns the host's capabilities now.
	Reprobe func(ctx context.Context) messages.Capabilities
	Sink    CapabilitiesSink
	// Outcomes, when set, gets a setup.finished event for every setup that
	// ran to its end (or could not run at all); WorkerID names the daemon
	// in it.
	Outcomes Outcomes
	WorkerID func() string
	Log      zerolog.Logger
	Jobs     *sync.WaitGroup
	// PropsOptions are added to the actor's props.
	PropsOptions []actor.PropsOption
}

// Props returns the props of the setup-queue actor.
func Props(d *Deps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &queue{d: d} }, d.PropsOptions...)
}

// done is sent to the actor by a finished setup; the FIFO is already
// updated, so a lost done loses nothing. Attempt tells a done of this
// incarnation's run from a late one of a previous incarnation.
type done struct{ attempt uint64 }

type queue struct {
	d       *Deps
	cancel  context.CancelCauseFunc
	attempt uint64
	// shutdown: no new setups start; the one running may finish.
	shutdown bool
}

func (q *queue) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started, *messages.Queued:
		q.next(ctx)
	case *done:
		if m.attempt == q.attempt {
			q.cancel = nil
		}
		q.next(ctx)
	case *messages.Shutdown:
		q.shutdown = true
		if n := q.d.FIFO.drop(); n > 0 {
			q.d.Log.Warn().Int("dropped", n).Msg("daemon stopping: queued setups dropped")
		}
	case *messages.GraceExpired:
		q.shutdown = true
		q.stop(errors.New(messages.CancelledShutdownMessage))
	case *actor.Stopping:
		q.stop(errors.New(reasonStopped))
	case *actor.Restarting:
		q.stop(errors.New(reasonRestarted))
	}
}

func (q *queue) stop(cause error) {
	if q.cancel != nil {
		q.cancel(cause)
	}
}

func (q *queue) next(ctx actor.Context) {
	if q.shutdown {
		return
	}
	it, attempt, ok := q.d.FIFO.begin()
	if !ok {
		return
	}
	runCtx, cancel := context.WithCancelCause(context.Background())
	q.cancel, q.attempt = cancel, attempt
	sys, self, parent := ctx.ActorSystem(), ctx.Self(), ctx.Parent()
	q.d.Jobs.Add(1)
	go func() {
		defer q.d.Jobs.Done()
		defer cancel(nil)
		completed := q.d.run(runCtx, it, attempt)
		q.d.FIFO.finish(attempt, completed)
		sys.Root.Send(self, &done{attempt: attempt})
		sys.Root.Send(parent, &messages.SetupFinished{CommandID: it.commandID})
	}()
}

// run executes one setup and reports whether it ran to its end (whatever
// the exit code); false means it was interrupted and stays queued.
func (d *Deps) run(ctx context.Context, it item, attempt uint64) bool {
	s := it.setup
	name := "setup"
	if s.Name != nil && *s.Name != "" {
		name = *s.Name
	}
	log := d.Log.With().Str("command_id", it.commandID).Str("setup", name).Uint64("attempt", attempt).Logger()
	outcome := messages.SetupOutcome{Name: name, State: messages.StateFailed, ExitCode: messages.ExitFailed}
	scratch, err := runners.NewScratchDir(d.Workdir, "setups", "setup")
	if err != nil {
		log.Error().Err(err).Msg("setup scratch dir")
		msg := err.Error()
		outcome.Error = &msg
		d.report(it.commandID, outcome, log)
		return true
	}
	defer os.RemoveAll(scratch)
	tail := &ledger.Tail{}
	spec := runners.Spec{
		InvocationID: "setup-" + it.commandID,
		Function:     messages.FunctionRef{Module: Module, Qualname: name},
		Script:       s.Script,
		ScratchDir:   scratch,
		Workdir:      d.Workdir,
		Output:       tail,
	}
	if s.Sudo {
		spec.AsUser = "root"
	}
	log.Info().Bool("sudo", s.Sudo).Msg("setup started")
	start := time.Now()
	out, err := d.Runner.Run(ctx, spec)
	if ctx.Err() != nil {
		log.Warn().Str("reason", context.Cause(ctx).Error()).Msg("setup interrupted; it stays at the head of the queue")
		return false
	}
	dur := time.Since(start)
	outcome.DurationMs, outcome.OutputTail = uint64(dur.Milliseconds()), tail.String()
	defer func() { d.report(it.commandID, outcome, log) }()
	switch {
	case err != nil:
		log.Error().Err(err).Dur("took", dur).Msg("setup could not run")
		msg := err.Error()
		outcome.Error = &msg
	case out.State != messages.StateSucceeded:
		ev := log.Error().Str("state", out.State).Int("exit_code", out.ExitCode).Dur("took", dur)
		outcome.ExitCode = int32(max(min(out.ExitCode, math.MaxInt32), math.MinInt32))
		if out.Error != nil {
			ev = ev.Str("error", out.Error.Message)
			msg := out.Error.Message
			outcome.Error = &msg
		}
		ev.Msg("setup failed")
	default:
		outcome.State, outcome.ExitCode = messages.StateSucceeded, 0
		log.Info().Dur("took", dur).Msg("setup succeeded")
		if s.RefreshCapabilities && d.Reprobe != nil && d.Sink != nil {
			caps := d.Reprobe(context.Background())
			d.Sink.SetUpdatedCapabilities(caps)
			log.Info().Strs("runners", caps.Runners).Msg("capabilities refreshed; shipped on the next poll")
		}
	}
	return true
}

// report counts a finished setup and hands its outcome to the outbox.
func (d *Deps) report(commandID string, o messages.SetupOutcome, log zerolog.Logger) {
	if d.Metrics != nil {
		d.Metrics.SetupFinished(o.State)
	}
	if d.Outcomes == nil {
		return
	}
	wid := ""
	if d.WorkerID != nil {
		wid = d.WorkerID()
	}
	ev, err := messages.NewEvent(commandID, messages.EventSetupFinished, wid, &o, time.Now())
	if err == nil {
		err = d.Outcomes.Event(ev)
	}
	if err != nil {
		log.Error().Err(err).Msg("setup outcome not stored for posting")
	}
}
