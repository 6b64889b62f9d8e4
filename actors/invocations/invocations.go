// Package invocations owns the `run` command: what the job child of
// package jobparent runs for each invocation. It picks the runner from the
// injected registry by run_config.runner (the default runner only when
// that is absent; an unknown kind fails the run with "unknown runner
// kind: X"),
// feeds the runner's output into the ledger's stdout tail and streams it to
// the control plane as invocation.log events (logship.go), and acks the
// outcome at once through the outbox: succeeded with the result bytes,
// failed or killed with a structured error.
//
// Exactly-once acks follow the same rules as execs: the ledger, outside the
// actors, decides who reports; a child that is stopped or restarted aborts
// its run hard, its runner kills everything it started, and the run is
// acked killed with type Cancelled.
package invocations

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"nymph/actors/jobparent"
	"nymph/actors/ledger"
	"nymph/actors/payload"
	"nymph/messages"
	"nymph/runners"
)

// Acks takes finished run outcomes (the outbox).
type Acks interface {
	Ack(a *messages.Ack) error
}

// Metrics counts acked runs by state (the daemon's metrics.Recorder). It
// is called from the goroutine that acks the run and must be safe for
// concurrent use.
type Metrics interface {
	RunFinished(state string)
}

// States lists every state Metrics is given: the ack's.
func States() []string {
	return []string{messages.StateSucceeded, messages.StateFailed, messages.StateKilled}
}

// Deps is what the invocations actors share. It outlives every instance.
type Deps struct {
	jobparent.Wiring
	// Metrics, when set, counts each acked run.
	Metrics Metrics
	// Runners maps run_config.runner to its implementation.
	Runners       map[string]runners.Runner
	DefaultRunner string
	// Workdir holds each run's scratch directory.
	Workdir   string
	Acks      Acks
	WorkerID  func() string
	Payloads  payload.Store
	Namespace string
	// Events, when set, takes each run's output as it is produced
	// (invocation.log events); Leftovers keeps what could not be posted by
	// the end of the run. Logs tunes the batching.
	Events    EventPoster
	Leftovers EventStore
	Logs      LogSettings
}

// Props returns the props of the invocations parent.
func Props(d *Deps) *actor.Props {
	return jobparent.Props(&jobparent.Kind{
		Wiring: d.Wiring, Kind: ledger.Run, Noun: "invocation", IDField: "invocation_id",
		ChildName: ChildName,
		Run: func(ctx context.Context, sys *actor.ActorSystem, e *ledger.Entry) {
			ack := failed(e.ID, "run body missing")
			if body, _ := e.Body.(*messages.Run); body != nil {
				ack = d.execute(ctx, body, e.Tail)
			}
			d.report(sys, ack)
		},
		Unstarted: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, &messages.Ack{InvocationID: id, State: messages.StateKilled,
				Error: &messages.AckError{Type: messages.ErrorTypeCancelled, Message: reason}})
		},
		Refused: func(sys *actor.ActorSystem, id, reason string) {
			d.report(sys, &messages.Ack{InvocationID: id, State: messages.StateFailed,
				Error: &messages.AckError{Type: messages.ErrorTypeRefused, Message: reason}})
		},
	})
}

// ChildName is the actor name of one run's child under the parent.
func ChildName(invocationID string) string {
	return ledger.ActorName("run-", invocationID)
}

// execute runs one invocation and builds its ack.
func (d *Deps) execute(ctx context.Context, r *messages.Run, tail *ledger.Tail) *messages.Ack {
	kind := d.DefaultRunner
	if r.RunConfig.Runner != nil && *r.RunConfig.Runner != "" {
		kind = *r.RunConfig.Runner
	}
	runner, ok := d.Runners[kind]
	if !ok {
		return failed(r.InvocationID, "unknown runner kind: "+kind)
	}
	args := []byte(r.ArgsBlob)
	if r.PayloadRef != nil {
		data, err := payload.Fetch(ctx, d.Payloads, d.Namespace, r.PayloadRef)
		if err != nil {
			if ctx.Err() != nil {
				return cancelled(r.InvocationID, ctx)
			}
			return failed(r.InvocationID, err.Error())
		}
		args = data
	}
	scratch, err := runners.NewScratchDir(d.Workdir, "runs", ChildName(r.InvocationID))
	if err != nil {
		return failed(r.InvocationID, err.Error())
	}
	defer os.RemoveAll(scratch)
	spec := runners.Spec{
		InvocationID:       r.InvocationID,
		ParentInvocationID: deref(r.ParentInvocationID),
		RootInvocationID:   deref(r.RootInvocationID),
		Function:           r.Function,
		Script:             deref(r.Script),
		AsUser:             deref(r.AsUser),
		Args:               args,
		Image:              r.RunConfig.Image,
		Env:                r.RunConfig.Env,
		Workdir:            r.RunConfig.Workdir,
		ScratchDir:         scratch,
		Output:             tail,
	}
	if t := r.RunConfig.TimeoutS; t > 0 && t < float64(math.MaxInt64/int64(time.Second)) {
		spec.Timeout = time.Duration(t * float64(time.Second))
	}
	if ship := d.newLogShipper(r.InvocationID); ship != nil {
		spec.Stdout, spec.Stderr = ship.writer(messages.StreamStdout), ship.writer(messages.StreamStderr)
		// Closed before the ack is built and posted: the output is on its
		// way by the time the run reads as over.
		defer ship.Close()
	}
	out, err := runner.Run(ctx, spec)
	if ctx.Err() != nil {
		return cancelled(r.InvocationID, ctx)
	}
	if err != nil {
		return failed(r.InvocationID, err.Error())
	}
	ack := &messages.Ack{InvocationID: r.InvocationID, State: out.State, Error: out.Error}
	switch out.State {
	case messages.StateSucceeded:
		ack.ResultBlob = messages.Bytes(out.Result)
		ack.Error = nil
	case messages.StateFailed, messages.StateKilled:
		if ack.Error == nil {
			ack.Error = &messages.AckError{Type: messages.ErrorTypeDaemon, Message: fmt.Sprintf("runner %s: %s with exit code %d", kind, out.State, out.ExitCode)}
		}
	default:
		return failed(r.InvocationID, fmt.Sprintf("runner %s returned unknown state %q", kind, out.State))
	}
	return ack
}

// report hands an ack over exactly once and tells the root.
func (d *Deps) report(sys *actor.ActorSystem, ack *messages.Ack) {
	if !d.Ledger.Complete(ledger.Run, ack.InvocationID) {
		d.Log.Warn().Str("invocation_id", ack.InvocationID).Msg("invocation already acked; duplicate dropped")
		return
	}
	if d.Metrics != nil {
		d.Metrics.RunFinished(ack.State)
	}
	if d.WorkerID != nil {
		ack.WorkerID = d.WorkerID()
	}
	ev := d.Log.Info().Str("invocation_id", ack.InvocationID).Str("state", ack.State)
	if ack.Error != nil {
		ev = ev.Str("error_type", ack.Error.Type).Str("error", ack.Error.Message)
	}
	ev.Msg("invocation finished")
	if err := d.Acks.Ack(ack); err != nil {
		d.Log.Error().Err(err).Str("invocation_id", ack.InvocationID).Msg("ack not stored")
	}
	sys.Root.Send(d.Finished, &messages.RunFinished{InvocationID: ack.InvocationID})
}

func failed(id, msg string) *messages.Ack {
	return &messages.Ack{InvocationID: id, State: messages.StateFailed,
		Error: &messages.AckError{Type: messages.ErrorTypeDaemon, Message: msg}}
}

func cancelled(id string, ctx context.Context) *messages.Ack {
	msg := jobparent.ReasonCancelled
	if cause := context.Cause(ctx); cause != nil && !errors.Is(cause, context.Canceled) {
		msg = cause.Error()
	}
	return &messages.Ack{InvocationID: id, State: messages.StateKilled,
		Error: &messages.AckError{Type: messages.ErrorTypeCancelled, Message: msg}}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
