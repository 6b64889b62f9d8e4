// Package execs owns the `exec` command: what the job child of package
// jobparent runs for each exec, the shell path (bash -c in its own process
// group through package procgroup, stdout/stderr capped at 1 MiB or
// streamed to a LogSink, timeout with a settle grace, payload materialised
// and verified before the spawn).
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
	"context"

	"github.com/asynkron/protoactor-go/actor"

	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/messages"
)

// Results takes finished exec results (the outbox).
type Results interface {
	ExecResult(execID string, r *messages.ExecResult) error
}

// Deps is what the execs actors share. It outlives every actor instance.
type Deps struct {
	jobparent.Wiring
	Shell   *Shell
	Results Results
}

// Props returns the props of the execs parent.
func Props(d *Deps) *actor.Props {
	return jobparent.Props(&jobparent.Kind{
		Wiring: d.Wiring, Kind: ledger.Exec, Noun: "exec", IDField: "exec_id",
		ChildName: ChildName,
		Run: func(ctx context.Context, sys *actor.ActorSystem, e *ledger.Entry) {
			var res *messages.ExecResult
			if body, _ := e.Body.(*messages.Exec); body != nil {
				res = d.Shell.Run(ctx, body)
			} else {
				msg := "exec body missing"
				res = &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &msg}
			}
			d.report(sys, e.ID, res)
		},
		Unstarted: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, id, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason})
		},
		Refused: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, id, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason})
		},
	})
}

// ChildName is the actor name of one exec's child under the parent.
func ChildName(execID string) string {
	return ledger.ActorName("exec-", execID)
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
