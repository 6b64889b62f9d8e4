package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// Jobs whose worker will never finish them are resolved here, so that no
// exec or invocation stays running forever. A job is lost when its worker
//   - says hello as a new process (another incarnation) after the old one
//     had received the job: its command was acknowledged, by cursor or by
//     delivery to a daemon without one. A command delivered but not
//     acknowledged is not lost: it goes out again to the new process;
//   - stops listing a run it had reported (invocations only, on poll);
//   - has not been seen for lostAfter (running jobs; `serve --lost-after`);
//   - was removed (killed, cleaned up), queued execs included.
//
// Losses an event causes are resolved as it happens: a hello sweeps for
// restarts, a kill or cleanup for removals. A ticker sweeps for everything
// (the deadline, and whatever a crash of this control plane between an
// event and its sweep left), every lostAfter/4 but at most 5 s apart.
// Invocation reads sweep for invocations first, as they always have; exec
// reads do not, being the streaming hot path (one sweep costs about as
// much as five exec reads on SQLite), and the ticker's lag is nothing
// against a deadline of minutes. Each resolution goes through the store's
// applied-once finish (FinishExec, FinishInvocation), so a real outcome
// that arrives first wins and one that arrives later is a no-op; whoever
// applies it wakes the job's waiters.

// DefaultLostAfter is how long a worker may go unseen before its running
// jobs are resolved as lost, unless configured. A daemon holds each poll
// up to 20 s, so this is many missed polls: long enough to ride out a
// network blip or a control-plane restart without failing work that is
// still going.
const DefaultLostAfter = 5 * time.Minute

// sweepLost resolves every exec and invocation whose worker is lost.
func (s *Server) sweepLost(ctx context.Context) {
	// Staleness is read from the stored last seen: write what memory has.
	s.flushPresence(ctx, s.log)
	s.sweepLostInvocations(ctx)
	s.sweepLostExecs(ctx)
}

func (s *Server) sweepLostInvocations(ctx context.Context) {
	lost, err := s.st.LostInvocations(ctx, s.now().Add(-s.lostAfter))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Msg("sweeping for lost invocations")
		}
		return
	}
	for _, l := range lost {
		s.failLost(ctx, l)
	}
}

func (s *Server) sweepLostExecs(ctx context.Context) {
	lost, err := s.st.LostExecs(ctx, s.now().Add(-s.lostAfter))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Msg("sweeping for lost execs")
		}
		return
	}
	for _, l := range lost {
		s.failLostExec(ctx, l)
	}
}

// lostMessage says why a job (an "exec" or an "invocation") of worker
// (id, label) was lost.
func (s *Server) lostMessage(reason, workerID, label, job string) string {
	who := fmt.Sprintf("worker %s (%s)", label, workerID)
	if label == "" || label == workerID {
		who = "worker " + workerID
	}
	switch reason {
	case store.LostRestarted:
		return who + " restarted (new process) without finishing this " + job
	case store.LostRemoved:
		return who + " was removed (killed or cleaned up) before this " + job + " finished"
	case store.LostGone:
		return who + " is gone; it was running this " + job
	case store.LostMissing:
		return who + " no longer reports this " + job + " (the daemon restarted or lost it)"
	default:
		return fmt.Sprintf("%s went stale while running this %s: not seen for more than %v", who, job, s.lostAfter)
	}
}

func (s *Server) failLost(ctx context.Context, l store.LostInvocation) {
	msg := s.lostMessage(l.Reason, l.WorkerID, l.WorkerLabel, "invocation")
	errJSON, _ := json.Marshal(messages.AckError{Type: operatorapi.ErrorTypeWorkerLost, Message: msg})
	inv, applied, err := s.st.FinishInvocation(ctx, store.Finish{
		ID: l.ID, State: operatorapi.InvocationFailed, From: []string{operatorapi.InvocationRunning}, WorkerID: l.WorkerID,
		Error: errJSON, Now: s.now(),
	})
	if err != nil {
		if ctx.Err() == nil {
			s.log.Error().Err(err).Str("invocation_id", l.ID).Msg("failing a lost invocation")
		}
		return
	}
	if applied {
		s.wake.broadcast(invocationKey(l.ID))
		s.metrics.observeInvocation(inv)
		s.log.Warn().Str("invocation_id", l.ID).Str("worker_id", l.WorkerID).Str("reason", l.Reason).Msg(msg)
	}
}

// failLostExec gives a lost exec the result a daemon gives an exec it
// could not finish: exit_code -1 and an error saying why.
func (s *Server) failLostExec(ctx context.Context, l store.LostExec) {
	msg := s.lostMessage(l.Reason, l.WorkerID, l.WorkerLabel, "exec")
	stored, err := messages.Marshal(&messages.ExecResult{ExitCode: messages.ExitFailed, Error: &msg})
	if err != nil {
		s.log.Error().Err(err).Str("exec_id", l.ID).Msg("encoding a lost exec's result")
		return
	}
	applied, err := s.st.FinishExec(ctx, l.ID, stored, s.now())
	if err != nil {
		if ctx.Err() == nil && !isNotFound(err) {
			s.log.Error().Err(err).Str("exec_id", l.ID).Msg("failing a lost exec")
		}
		return
	}
	if applied {
		s.wake.broadcast(execKey(l.ID))
		s.metrics.execOutcomes.WithLabelValues(execLost).Inc()
		s.log.Warn().Str("exec_id", l.ID).Str("worker_id", l.WorkerID).Str("reason", l.Reason).Str("was", l.State).Msg(msg)
	}
}

// startSweeper runs sweepLost on a ticker until the server closes.
func (s *Server) startSweeper() {
	interval := min(max(s.lostAfter/4, 50*time.Millisecond), 5*time.Second)
	s.every(interval, max(interval, time.Second), s.sweepLost)
}
