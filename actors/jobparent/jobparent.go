// Package jobparent owns the actors shared by the exec and the run paths:
// a parent with one child actor per job the ledger holds for a kind,
// spawned once the job is accepted; a cancel routed to the job's child,
// or, for a job that never got one, reported as ended unstarted; at the
// end of the shutdown grace every child aborted hard and every waiting job
// reported; a finished job's child retired.
//
// The child claims its job and runs it on a goroutine of its own, under a
// context it cancels when the job is aborted; a child that is stopped or
// restarted aborts its job hard, so that nothing it started outlives it.
//
// Before a child runs its job it journals it (Wiring.Journal), so that a
// daemon process that dies while the job runs leaves a record the next
// start reports the job from; the journal entry goes once the outcome is
// handed over.
//
// What differs between the kinds (running and reporting a job, the report
// of a job that never ran or that was refused) comes from a Kind. The bookkeeping that makes a
// job run once and report once stays in the ledger: a child claims its job
// there (a restarted child finds it claimed and does not run it twice),
// and the parent only reports a job it manages to claim itself.
package jobparent

import (
	"context"
	"errors"
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/ledger"
	"nymph/gopool"
	"nymph/messages"
	"nymph/runners/procgroup"
)

// ReasonCancelled is the reason a job cancelled by the operator ends with.
const ReasonCancelled = "cancelled"

// Kind is what the parent needs to know of the jobs it supervises. It
// outlives every incarnation of the parent. ChildName is called on the
// parent's mailbox, Run and Unstarted on goroutines of their own
// (reporting touches the disk).
type Kind struct {
	Wiring
	Kind ledger.Kind
	// Noun names a job in logs ("exec"), IDField its id ("exec_id").
	Noun, IDField string
	// ChildName is the actor name of a job's child.
	ChildName func(id string) string
	// Run runs a job its child claimed and reports it, on a goroutine of
	// its own. ctx ends when the job is aborted: its cause is the reason,
	// and a hard abort asks for a kill without grace (procgroup.WithKill).
	Run func(ctx context.Context, sys *actor.ActorSystem, e *ledger.Entry)
	// Unstarted reports a job that never ran; the parent has claimed it.
	Unstarted func(sys *actor.ActorSystem, id, reason string)
	// Refused reports a job the ledger holds as refused (see
	// ledger.Refuse); the parent has claimed it.
	Refused func(sys *actor.ActorSystem, id, reason string)
}

// Journal keeps a durable record of each job from before anything of it is
// spawned until its outcome is handed to the results (the outbox, which
// also holds the journal and drops the record once the outcome is posted
// or stored).
type Journal interface {
	// Begin records job id of kind ("exec", "run"), carried by command
	// commandID; it returns once a daemon process that dies leaves the
	// record for the next start (the outbox's reaches the disk moments
	// later).
	Begin(kind, id, commandID string) error
}

// Wiring is what every job path (execs, invocations) is built with. It
// outlives every actor instance.
type Wiring struct {
	Ledger *ledger.Ledger
	// Journal records each job before it runs; nil records nothing.
	Journal Journal
	Log     zerolog.Logger
	// Jobs counts the goroutines running or reporting jobs, so the daemon
	// can wait for every outcome before it exits.
	Jobs *sync.WaitGroup
	// PropsOptions are added to the parent and to every child.
	PropsOptions []actor.PropsOption
	// Goroutines runs each job's goroutine (nil: a goroutine of its own).
	Goroutines *gopool.Pool
	// Finished receives the end of every reported job: the daemon's root,
	// which outlives every incarnation of a parent (a respawned parent has
	// a new name, so a notice sent to the old one would be lost) and passes
	// the notice on to the current one.
	Finished *actor.PID
}

// childStrategy restarts a crashed child; the restart ends its job, which
// is reported, so the count does not matter.
var childStrategy = actor.NewOneForOneStrategy(1<<30, 0, actor.DefaultDecider)

// Props returns the props of a parent of k's jobs.
func Props(k *Kind) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &parent{k: k, children: map[string]*actor.PID{}}
	}, append([]actor.PropsOption{actor.WithSupervisor(childStrategy)}, k.PropsOptions...)...)
}

type parent struct {
	k        *Kind
	children map[string]*actor.PID
	// closing: the shutdown grace expired; nothing new is started.
	closing bool
}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started, *messages.Queued:
		p.spawnPending(ctx)
	case *messages.Cancel:
		id := m.ExecID
		if p.k.Kind == ledger.Run {
			id = m.InvocationID
		}
		if id != nil {
			p.abort(ctx, *id, ReasonCancelled, false)
		}
	case *messages.GraceExpired:
		p.closing = true
		for id := range p.children {
			p.abort(ctx, id, messages.CancelledShutdownMessage, true)
		}
		p.spawnPending(ctx)
	case *actor.Terminated:
		for id, pid := range p.children {
			if pid.Equal(m.Who) {
				delete(p.children, id)
			}
		}
	case *messages.ExecFinished:
		p.retire(ctx, ledger.Exec, m.ExecID)
	case *messages.RunFinished:
		p.retire(ctx, ledger.Run, m.InvocationID)
	}
}

// retire stops the child of a finished job.
func (p *parent) retire(ctx actor.Context, kind ledger.Kind, id string) {
	if pid, ok := p.children[id]; ok && kind == p.k.Kind {
		delete(p.children, id)
		ctx.Stop(pid)
	}
}

// spawnPending starts a child for every accepted job without one; once
// closing, it reports them instead. A job the ledger holds as refused is
// reported refused, whenever it is found: by this incarnation or the next.
func (p *parent) spawnPending(ctx actor.Context) {
	for _, e := range p.k.Ledger.Unclaimed(p.k.Kind) {
		if _, ok := p.children[e.ID]; ok {
			continue
		}
		if e.Refused != "" {
			p.reportWith(ctx, e.ID, e.Refused, p.k.Refused)
			continue
		}
		if p.closing {
			p.reportUnstarted(ctx, e.ID, messages.CancelledShutdownMessage)
			continue
		}
		id := e.ID
		props := actor.PropsFromProducer(func() actor.Actor { return &child{k: p.k, id: id} }, p.k.PropsOptions...)
		pid, err := ctx.SpawnNamed(props, p.k.ChildName(id))
		if err != nil {
			p.k.Log.Error().Err(err).Str(p.k.IDField, id).Msgf("cannot spawn %s actor", p.k.Noun)
			p.reportUnstarted(ctx, id, "spawn failed: "+err.Error())
			continue
		}
		p.children[id] = pid
	}
}

// abort ends job id: through its child, or as unstarted when it has none.
// Hard asks the child to kill at once rather than after its grace.
func (p *parent) abort(ctx actor.Context, id, reason string, hard bool) {
	if pid, ok := p.children[id]; ok {
		ctx.Send(pid, &messages.Abort{Reason: reason, Hard: hard})
		return
	}
	if e, ok := p.k.Ledger.Get(p.k.Kind, id); ok {
		if e.Refused != "" {
			p.reportWith(ctx, id, e.Refused, p.k.Refused)
			return
		}
		p.reportUnstarted(ctx, id, reason)
		return
	}
	p.k.Log.Info().Str(p.k.IDField, id).Msgf("cancel for an %s that is not running; ignored", p.k.Noun)
}

// reportUnstarted ends a job that never got to run.
func (p *parent) reportUnstarted(ctx actor.Context, id, reason string) {
	p.reportWith(ctx, id, reason, p.k.Unstarted)
}

// reportWith claims a job that has no child and has report end it, on a
// goroutine of its own (reporting touches the disk).
func (p *parent) reportWith(ctx actor.Context, id, reason string, report func(sys *actor.ActorSystem, id, reason string)) {
	if _, ok := p.k.Ledger.Claim(p.k.Kind, id); !ok {
		return
	}
	sys := ctx.ActorSystem()
	p.k.Jobs.Add(1)
	go func() {
		defer p.k.Jobs.Done()
		report(sys, id, reason)
	}()
}

// child runs one job.
type child struct {
	k     *Kind
	id    string
	abort func(cause error, hard bool)
}

func (c *child) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		e, ok := c.k.Ledger.Claim(c.k.Kind, c.id)
		if !ok {
			// A restarted incarnation: the first one ran the job and
			// killed it on Restarting; that report is on its way.
			return
		}
		jobCtx, abort := procgroup.WithKill(context.Background())
		c.abort = abort
		sys := ctx.ActorSystem()
		c.k.Jobs.Add(1)
		c.k.Goroutines.Go(func() {
			defer c.k.Jobs.Done()
			defer abort(context.Canceled, false)
			c.k.journal(e)
			c.k.Run(jobCtx, sys, e)
		})
	case *messages.Abort:
		c.stop(m.Reason, m.Hard)
	case *actor.Stopping:
		c.stop(c.k.Noun+" actor stopped", true)
	case *actor.Restarting:
		c.stop(c.k.Noun+" actor restarted after a crash", true)
	}
}

// journal records e before it runs. A job that cannot be journalled (a
// full disk) still runs: refusing it would lose it for sure, while only a
// crash during the run loses its outcome.
func (k *Kind) journal(e *ledger.Entry) {
	if k.Journal == nil {
		return
	}
	if err := k.Journal.Begin(string(k.Kind), e.ID, e.CommandID); err != nil {
		k.Log.Error().Err(err).Str(k.IDField, e.ID).
			Msgf("%s not journalled; it runs, but if the daemon dies meanwhile its outcome is not reported", k.Noun)
	}
}

func (c *child) stop(reason string, hard bool) {
	if c.abort != nil {
		c.abort(errors.New(reason), hard)
	}
}
