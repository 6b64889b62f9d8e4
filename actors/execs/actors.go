// Package execs owns the `exec` command: a parent actor with one child per
// running exec, and the shell path each child drives (bash -c in its own
// process group, stdout/stderr capped at 1 MiB or streamed to a LogSink,
// timeout with a settle grace, payload materialised and verified before the
// spawn).
//
// The bookkeeping that makes a result go out exactly once lives in the
// ledger, outside every actor: the root accepts the exec there, the parent
// spawns a child for each accepted exec it finds, the child claims it (a
// restarted child finds it claimed and does not run it twice), and whoever
// completes it in the ledger first hands the result to the outbox. A child
// that is stopped or restarted kills its process group, and the exec is
// reported with exit code -1.
package execs

import (
	"sync"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/ledger"
	"nymph/messages"
)

// Reasons an exec ends early; they become the result's error.
const (
	ReasonCancelled = "cancelled"
	ReasonStopped   = "exec actor stopped"
	ReasonRestarted = "exec actor restarted after a crash"
)

// Results takes finished exec results (the outbox).
type Results interface {
	ExecResult(execID string, r *messages.ExecResult) error
}

// Deps is what the execs actors share. It outlives every actor instance.
type Deps struct {
	Ledger  *ledger.Ledger
	Shell   *Shell
	Results Results
	Log     zerolog.Logger
	// Jobs counts exec goroutines still running, so the daemon can wait
	// for every result before it exits.
	Jobs *sync.WaitGroup
	// PropsOptions are added to every actor this package spawns.
	PropsOptions []actor.PropsOption
	// Finished receives an ExecFinished for every reported exec: the
	// daemon's root, which outlives every incarnation of the parent here
	// (a respawned parent has a new name, so a notice sent to the old one
	// would be lost) and passes the notice on to the current parent.
	Finished *actor.PID
}

// Props returns the props of the execs parent.
func Props(d *Deps) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &parent{d: d, children: map[string]*actor.PID{}}
	}, append([]actor.PropsOption{actor.WithSupervisor(childStrategy)}, d.PropsOptions...)...)
}

// childStrategy restarts a crashed exec child; the restart kills its
// process group and the exec is reported, so the count does not matter.
var childStrategy = actor.NewOneForOneStrategy(1<<30, 0, actor.DefaultDecider)

// ChildName is the actor name of one exec's child under the parent.
func ChildName(execID string) string {
	return ledger.ActorName("exec-", execID)
}

type parent struct {
	d        *Deps
	children map[string]*actor.PID
	// closing: the shutdown grace expired; nothing new is started.
	closing bool
}

func (p *parent) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started, *messages.Queued:
		p.spawnPending(ctx)
	case *messages.ExecFinished:
		if pid, ok := p.children[m.ExecID]; ok {
			delete(p.children, m.ExecID)
			ctx.Stop(pid)
		}
	case *messages.Cancel:
		if m.ExecID != nil {
			p.abort(ctx, *m.ExecID, ReasonCancelled, false)
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
	}
}

// spawnPending starts a child for every accepted exec without one; once
// closing, it reports them instead.
func (p *parent) spawnPending(ctx actor.Context) {
	for _, e := range p.d.Ledger.Unclaimed(ledger.Exec) {
		if _, ok := p.children[e.ID]; ok {
			continue
		}
		if p.closing {
			p.reportUnstarted(ctx, e.ID, messages.CancelledShutdownMessage)
			continue
		}
		props := actor.PropsFromProducer(func() actor.Actor {
			return &child{d: p.d, id: e.ID}
		}, p.d.PropsOptions...)
		pid, err := ctx.SpawnNamed(props, ChildName(e.ID))
		if err != nil {
			p.d.Log.Error().Err(err).Str("exec_id", e.ID).Msg("cannot spawn exec actor")
			p.reportUnstarted(ctx, e.ID, "spawn failed: "+err.Error())
			continue
		}
		p.children[e.ID] = pid
	}
}

func (p *parent) abort(ctx actor.Context, id, reason string, hard bool) {
	if pid, ok := p.children[id]; ok {
		ctx.Send(pid, &messages.Abort{Reason: reason, Hard: hard})
		return
	}
	if _, ok := p.d.Ledger.Get(ledger.Exec, id); ok {
		p.reportUnstarted(ctx, id, reason)
		return
	}
	p.d.Log.Info().Str("exec_id", id).Msg("cancel for an exec that is not running; ignored")
}

// reportUnstarted ends an exec that never got a process.
func (p *parent) reportUnstarted(ctx actor.Context, id, reason string) {
	if _, ok := p.d.Ledger.Claim(ledger.Exec, id); !ok {
		return
	}
	res := &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason}
	sys := ctx.ActorSystem()
	// Storing the result touches the disk: not inside Receive.
	p.d.Jobs.Add(1)
	go func() {
		defer p.d.Jobs.Done()
		p.d.report(sys, id, res)
	}()
}

type child struct {
	d  *Deps
	id string
	g  *Group
}

func (c *child) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started:
		e, ok := c.d.Ledger.Claim(ledger.Exec, c.id)
		if !ok {
			// A restarted incarnation: the first one ran the exec and its
			// process was killed on Restarting; that result is on its way.
			return
		}
		body, _ := e.Body.(*messages.Exec)
		c.g = NewGroup(c.d.Shell.KillGrace)
		g, sys, id := c.g, ctx.ActorSystem(), c.id
		c.d.Jobs.Add(1)
		go func() {
			defer c.d.Jobs.Done()
			var res *messages.ExecResult
			if body == nil {
				msg := "exec body missing"
				res = &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &msg}
			} else {
				res = c.d.Shell.Run(g, body)
			}
			c.d.report(sys, id, res)
		}()
	case *messages.Abort:
		if c.g != nil {
			c.g.Abort(m.Reason, m.Hard)
		}
	case *actor.Stopping:
		if c.g != nil {
			c.g.Abort(ReasonStopped, true)
		}
	case *actor.Restarting:
		if c.g != nil {
			c.g.Abort(ReasonRestarted, true)
		}
	}
}

// report hands a result over exactly once and tells the root.
func (d *Deps) report(sys *actor.ActorSystem, id string, res *messages.ExecResult) {
	if !d.Ledger.Complete(ledger.Exec, id) {
		d.Log.Warn().Str("exec_id", id).Msg("exec already reported; duplicate result dropped")
		return
	}
	ev := d.Log.Info().Str("exec_id", id).Int32("exit_code", res.ExitCode).Uint64("duration_ms", res.DurationMs)
	if res.Error != nil {
		ev = ev.Str("error", *res.Error)
	}
	ev.Msg("exec finished")
	if err := d.Results.ExecResult(id, res); err != nil {
		d.Log.Error().Err(err).Str("exec_id", id).Msg("exec result not stored")
	}
	sys.Root.Send(d.Finished, &messages.ExecFinished{ExecID: id})
}
