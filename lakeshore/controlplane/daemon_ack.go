package controlplane

import (
	"encoding/json"
	"net/http"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

var ackChecks = []check{
	{path: "invocation_id", required: true, kind: kNonEmpty},
	{path: "state", required: true, kind: kString},
	{path: "result_blob", kind: kBytes},
	{path: "error", kind: kMap},
	{path: "error.type", kind: kString},
	{path: "error.message", kind: kString},
	{path: "error.traceback", kind: kString},
	{path: "worker_id", kind: kString},
}

// handleAck stores the terminal outcome of a run. A repeat, or an ack for an
// invocation already finished another way (cancelled, failed as lost), is a
// no-op, so a daemon retrying a post it could not confirm does no harm; an
// invocation this control plane never handed out is a 404, and so is one
// handed to another worker than the one the credential acts for (a fleet
// credential acts for any).
func (s *Server) handleAck(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
	body, err := readBody(w, r, limitAck)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	ack, err := decodeAck(body)
	if err != nil {
		s.log.Info().Err(err).Msg("ack refused as malformed")
		writeDaemonError(w, err)
		return
	}
	var errJSON json.RawMessage
	if ack.Error != nil && ack.State != messages.StateSucceeded {
		errJSON, _ = json.Marshal(ack.Error)
	}
	// The result is kept only for a success, as the protocol says it is
	// empty otherwise.
	var result []byte
	if ack.State == messages.StateSucceeded {
		result = nonNilBytes(ack.ResultBlob)
	}
	inv, applied, err := s.st.FinishInvocation(r.Context(), store.Finish{
		ID: ack.InvocationID, State: ack.State, From: []string{operatorapi.InvocationRunning},
		WorkerID: p.workerID, Result: result, Error: errJSON, Now: s.now(),
	})
	if err == nil && p.workerID != "" && inv.WorkerID != p.workerID {
		s.log.Info().Str("invocation_id", ack.InvocationID).Str("worker_id", p.workerID).Str("invocation_worker_id", inv.WorkerID).
			Msg("ack refused: the invocation is not this worker's")
		err = store.ErrNotFound
	}
	if isNotFound(err) {
		s.log.Info().Str("invocation_id", ack.InvocationID).Str("worker_id", ack.WorkerID).Msg("ack for an unknown invocation")
		writeDaemonError(w, badField(http.StatusNotFound, "invocation_id", "unknown invocation"))
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("invocation_id", ack.InvocationID).Msg("ack: store")
		writeDaemonError(w, err)
		return
	}
	if applied {
		s.wake.broadcast(invocationKey(inv.ID))
		s.metrics.observeInvocation(inv)
		// A finished run frees a slot: a parked poll of its worker may now
		// claim more.
		s.due(inv.WorkerID, true)
	}
	s.log.Info().Str("invocation_id", ack.InvocationID).Str("worker_id", ack.WorkerID).Str("state", ack.State).
		Str("stored_state", inv.State).Bool("duplicate", !applied).Msg("invocation acknowledged")
	writeMsgpack(w, http.StatusOK, map[string]any{"ok": true, "duplicate": !applied})
}

func decodeAck(body []byte) (messages.Ack, error) {
	var ack messages.Ack
	if err := decodeChecked(body, ackChecks, &ack); err != nil {
		return ack, err
	}
	switch ack.State {
	case messages.StateSucceeded, messages.StateFailed, messages.StateKilled:
		return ack, nil
	}
	return ack, badField(http.StatusUnprocessableEntity, "state", "must be succeeded, failed or killed")
}

var resultChunkChecks = []check{
	{path: "invocation_id", required: true, kind: kNonEmpty},
	{path: "seq", kind: kUint64},
	{path: "data", kind: kBytes},
	{path: "last", kind: kBool},
}

func decodeResultChunk(body []byte) (messages.ResultChunk, error) {
	var c messages.ResultChunk
	return c, decodeChecked(body, resultChunkChecks, &c)
}

// handleResultChunk stores one piece of a streamed invocation result. A
// credential that acts for one worker (a key, a bound token) may post
// pieces of that worker's invocations only (else 404).
func (s *Server) handleResultChunk(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
	body, err := readBody(w, r, limitResultChunk)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	c, err := decodeResultChunk(body)
	if err != nil {
		s.log.Info().Err(err).Msg("result chunk refused as malformed")
		writeDaemonError(w, err)
		return
	}
	if p.workerID != "" {
		inv, err := s.st.Invocation(r.Context(), p.namespace, c.InvocationID)
		if err == nil && inv.WorkerID != p.workerID {
			err = store.ErrNotFound
		}
		if isNotFound(err) {
			s.log.Info().Str("invocation_id", c.InvocationID).Str("worker_id", p.workerID).Msg("result chunk refused: not this worker's invocation")
			writeDaemonError(w, badField(http.StatusNotFound, "invocation_id", "unknown invocation"))
			return
		}
		if err != nil {
			s.log.Error().Err(err).Str("invocation_id", c.InvocationID).Msg("result chunk: read the invocation")
			writeDaemonError(w, err)
			return
		}
	}
	applied, err := s.st.SaveResultChunk(r.Context(), store.ResultChunk{
		InvocationID: c.InvocationID, Seq: c.Seq, Data: c.Data, Last: c.Last, ReceivedAt: s.now(),
	})
	if err != nil {
		s.log.Error().Err(err).Str("invocation_id", c.InvocationID).Msg("result chunk: store")
		writeDaemonError(w, err)
		return
	}
	writeMsgpack(w, http.StatusOK, map[string]any{"ok": true, "duplicate": !applied})
}
