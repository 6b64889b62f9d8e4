// Package execs owns the `exec` command: the child actor of each running
// exec under a parent of package jobparent, and the shell path each child drives (bash -c in its own
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

	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/messages"
)

// Reasons an exec ends early; they become the result's error.
const (
	ReasonCancelled = jobparent.ReasonCancelled
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
	return jobparent.Props(&jobparent.Kind{
		Ledger: d.Ledger, Kind: ledger.Exec, Noun: "exec", IDField: "exec_id",
		ChildName: ChildName,
		NewChild:  func(id string) actor.Actor { return &child{d: d, id: id} },
		Unstarted: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, id, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason})
		},
		Finished: func(m any) (string, bool) {
			f, ok := m.(*messages.ExecFinished)
			if !ok {
				return "", false
			}
			return f.ExecID, true
		},
		Cancelled: func(m *messages.Cancel) (string, bool) {
			if m.ExecID == nil {
				return "", false
			}
			return *m.ExecID, true
		},
		Jobs: d.Jobs, Log: d.Log, PropsOptions: d.PropsOptions,
	})
}

// ChildName is the actor name of one exec's child under the parent.
func ChildName(execID string) string {
	return ledger.ActorName("exec-", execID)
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
