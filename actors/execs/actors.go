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
	"runtime"

	"github.com/asynkron/protoactor-go/actor"

	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/messages"
)

// Results takes finished exec results (the outbox).
type Results interface {
	ExecResult(execID string, r *messages.ExecResult) error
}

// Metrics counts finished execs by outcome (the daemon's
// metrics.Recorder). It is called from the goroutine that reports the exec
// and must be safe for concurrent use.
type Metrics interface {
	ExecFinished(outcome string)
}

// How an exec ended, as Metrics counts it.
const (
	OutcomeExitZero    = "exit_zero"    // the command exited 0
	OutcomeExitNonzero = "exit_nonzero" // it exited with another code
	OutcomeTimeout     = "timeout"      // killed after timeout_s (exit -2)
	OutcomeKilled      = "killed"       // cancelled, ended by the shutdown or a stopped actor, or killed by a signal (exit -1)
	OutcomeFailed      = "failed"       // could not run: spawn or payload failure, no body (exit -1)
	OutcomeRefused     = "refused"      // refused before it ran (exit -1)
)

// Outcomes lists every outcome Metrics is given.
func Outcomes() []string {
	return []string{OutcomeExitZero, OutcomeExitNonzero, OutcomeTimeout, OutcomeKilled, OutcomeFailed, OutcomeRefused}
}

// Deps is what the execs actors share. It outlives every actor instance.
type Deps struct {
	jobparent.Wiring
	Shell   *Shell
	Results Results
	// Metrics, when set, counts each reported exec.
	Metrics Metrics
}

// Props returns the props of the execs parent.
func Props(d *Deps) *actor.Props {
	return jobparent.Props(&jobparent.Kind{
		Wiring: d.Wiring, Kind: ledger.Exec, Noun: "exec", IDField: "exec_id",
		ChildName: ChildName,
		Run: func(ctx context.Context, sys *actor.ActorSystem, e *ledger.Entry) {
			var res *messages.ExecResult
			outcome := OutcomeFailed
			if body, _ := e.Body.(*messages.Exec); body != nil {
				// The poller holds its next poll until the process
				// exists (messages.ExecStarted).
				res, outcome = d.Shell.run(ctx, body, func() {
					sys.Root.Send(d.Finished, &messages.ExecStarted{ExecID: e.ID})
				})
			} else {
				msg := "exec body missing"
				res = &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &msg}
			}
			d.report(sys, e.ID, res, outcome)
		},
		Unstarted: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, id, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason}, OutcomeKilled)
		},
		Refused: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, id, &messages.ExecResult{ExitCode: messages.ExitFailed, Error: &reason}, OutcomeRefused)
		},
	})
}

// ChildName is the actor name of one exec's child under the parent.
func ChildName(execID string) string {
	return ledger.ActorName("exec-", execID)
}

// report hands a result over exactly once, counts it, and tells the root.
func (d *Deps) report(sys *actor.ActorSystem, id string, res *messages.ExecResult, outcome string) {
	if !d.Ledger.Complete(ledger.Exec, id) {
		d.Log.Warn().Str("exec_id", id).Msg("exec already reported; duplicate result dropped")
		return
	}
	if d.Metrics != nil {
		d.Metrics.ExecFinished(outcome)
	}
	if err := d.Results.ExecResult(id, res); err != nil {
		d.Log.Error().Err(err).Str("exec_id", id).Msg("exec result not stored")
	}
	// The result's delivery, just started, is what the operator waits
	// for; this log line and the wake of the root can follow it. The
	// daemon runs on one processor ([runtime] max_procs), where the
	// delivery otherwise waited for this goroutine to block.
	runtime.Gosched()
	ev := d.Log.Info().Str("exec_id", id).Int32("exit_code", res.ExitCode).Uint64("duration_ms", res.DurationMs)
	if res.Error != nil {
		ev = ev.Str("error", *res.Error)
	}
	ev.Msg("exec finished")
	sys.Root.Send(d.Finished, &messages.ExecFinished{ExecID: id})
}
