package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"runtime"
	"strings"
	"sync"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// The exec result and chunk callbacks are accepted only from the worker the
// exec was delivered to, and only while it runs; authorizeExec decides
// that from the headers and the exec's row, before a byte of the body is
// read. The daemon attaches its credential to these posts as to any other
// (the original one its bearer), so this is the wire as it always was.

var execResultChecks = []check{
	{path: "exit_code", required: true, kind: kNumber},
	{path: "stdout", kind: kString},
	{path: "stderr", kind: kString},
	{path: "duration_ms", kind: kUint64},
	{path: "error", kind: kString},
	{path: "result_inline", kind: kBytes},
	{path: "result_ref", kind: kMap},
}

func (s *Server) handleExecResult(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("exec_id")
	asJSON := isJSON(r.Header.Get("Content-Type"), nil)
	fail := func(err error) {
		if asJSON {
			writeOperatorError(w, err)
		} else {
			writeDaemonError(w, err)
		}
	}
	p, ok := s.authorizeExec(w, r, id, "a result is accepted once", fail)
	if !ok {
		return
	}
	// A body the headers call msgpack gets the msgpack cap; one they call
	// JSON, or nothing, gets JSON's until it reads as msgpack.
	limit := int64(limitExecResultJSON)
	if ct := r.Header.Get("Content-Type"); !isJSON(ct, nil) && strings.Contains(ct, "msgpack") {
		limit = limitExecResult
	}
	body, err := readBody(w, r, limit)
	if err != nil {
		fail(err)
		return
	}
	if !s.finishSignature(w, r, p, body) {
		return
	}
	asJSON = isJSON(r.Header.Get("Content-Type"), body)
	if !asJSON && len(body) > limitExecResult {
		fail(badField(http.StatusRequestEntityTooLarge, "body", "larger than %d bytes", limitExecResult))
		return
	}
	res, err := decodeExecResult(body, asJSON)
	if err != nil {
		s.log.Info().Err(err).Str("exec_id", id).Msg("exec result refused as malformed")
		fail(err)
		return
	}
	// Kept as msgpack, which holds output bytes exactly as the daemon sent
	// them; JSON is only made when an operator reads it.
	stored, err := messages.Marshal(&res)
	if err != nil {
		fail(badField(http.StatusUnprocessableEntity, "body", "%v", err))
		return
	}
	// The state is checked again where the result is stored: the lost
	// sweep may have finished the exec since authorizeExec read it.
	finished, err := s.st.FinishRunningExec(r.Context(), id, stored, s.now())
	if err == nil || errors.Is(err, store.ErrExecFinished) || isNotFound(err) {
		s.handedOver.forget(id)
	}
	if err != nil {
		if rerr := execStateError(err, "a result is accepted once"); rerr != nil {
			s.log.Info().Err(err).Str("exec_id", id).Msg("exec result refused")
			fail(rerr)
			return
		}
		if isNotFound(err) {
			fail(errUnknownExec)
			return
		}
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec result: store")
		fail(err)
		return
	}
	s.waiting.finish(finished)
	s.wake.broadcast(execKey(id))
	// The operator waiting for this result is answered first: on one
	// processor (--procs auto at this load) the woken submission ran only
	// once this handler blocked, after its log line and the daemon's
	// answer, which nobody waits for.
	runtime.Gosched()
	s.metrics.observeExec(res)
	s.log.Info().Str("exec_id", id).Int32("exit_code", res.ExitCode).Uint64("duration_ms", res.DurationMs).Msg("exec finished")
	// duplicate stays in the answer for the clients that read it: a
	// repeat is a 409 now.
	answer := map[string]any{"ok": true, "duplicate": false}
	if asJSON {
		writeJSON(w, http.StatusOK, answer)
	} else {
		writeMsgpack(w, http.StatusOK, answer)
	}
}

// authorizeExec admits a callback about exec id from its headers and the
// exec's row, before its body is read: a credential (else 401, as on any
// daemon route), the exec existing in its namespace and delivered to the
// worker that credential acts for (else 404: whose it is, and whether it
// exists at all, is nobody else's business), and the exec running (else
// 409, which the daemon takes as final: queued, it was not delivered; once
// finished, finished says why nothing more is taken). A key acts for its
// worker, a bound token for the worker its hello bound it to, a fleet token
// or the shared bootstrap token for any worker of its namespace, but no
// bearer for a worker with an enrolled key, whose daemon signs. Anything
// refused is answered here, the body unread, and changes nothing.
func (s *Server) authorizeExec(w http.ResponseWriter, r *http.Request, id, finished string, fail func(error)) (daemonPrincipal, bool) {
	refuse := func(err error) (daemonPrincipal, bool) {
		closeUnread(w)
		fail(err)
		return daemonPrincipal{}, false
	}
	if !validPathID(id) {
		return refuse(errUnknownExec)
	}
	p, ok := s.authorizeDaemon(w, r)
	if !ok {
		return daemonPrincipal{}, false
	}
	// An exec this process delivered is known without a read: its worker
	// and namespace never change, and it was running when it was handed
	// over. Whether it still runs is checked again where the report is
	// stored (a refusal then costs only the body read).
	ex, known := s.handedOver.get(id)
	var err error
	if !known {
		ex, err = s.st.Exec(r.Context(), id)
	}
	if isNotFound(err) || err == nil && ex.Namespace != p.namespace {
		return refuse(errUnknownExec)
	}
	if err != nil {
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec callback: read the exec")
		return refuse(err)
	}
	if !p.fleet && p.workerID != ex.WorkerID {
		s.log.Info().Str("exec_id", id).Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("exec_worker_id", ex.WorkerID).
			Str("worker_id", p.workerID).Str("token_id", p.tokenID).Msg("exec callback refused: not the exec's worker")
		return refuse(errUnknownExec)
	}
	if p.key == nil {
		has, err := s.workerHasKey(r.Context(), ex.WorkerID)
		switch {
		case err != nil:
			s.log.Error().Err(err).Str("worker_id", ex.WorkerID).Msg("look up the worker's key")
			return refuse(err)
		case has:
			closeUnread(w)
			s.refuse(w, r, "unsigned_request_from_enrolled_worker", nil)
			return daemonPrincipal{}, false
		}
	}
	if rerr := execStateError(execStateErr(ex.State), finished); rerr != nil {
		s.log.Info().Str("exec_id", id).Str("route", r.URL.Path).Str("state", ex.State).Msg("exec callback refused: the exec is not running")
		return refuse(rerr)
	}
	return p, true
}

// execStateErr is the store's refusal of a report for an exec in state.
func execStateErr(state string) error {
	switch state {
	case operatorapi.ExecQueued:
		return store.ErrExecNotDelivered
	case operatorapi.ExecFinished:
		return store.ErrExecFinished
	}
	return nil
}

// execStateError is the 409 for an exec that is not running, nil for any
// other err; finished says what a finished exec no longer takes.
func execStateError(err error, finished string) error {
	switch {
	case errors.Is(err, store.ErrExecNotDelivered):
		return badField(http.StatusConflict, "exec_id", "this exec was not delivered to its worker yet")
	case errors.Is(err, store.ErrExecFinished):
		return badField(http.StatusConflict, "exec_id", "this exec has finished: %s", finished)
	}
	return nil
}

// maxDeliveredExecs bounds the execs deliveredExecs remembers: far more
// than run at once on any fleet this serves; past it the oldest go (a
// forgotten one costs its report one read).
const maxDeliveredExecs = 1 << 16

// deliveredExecs remembers the execs this process handed to their worker,
// until their result is stored: what authorizeExec needs of each (its
// worker and namespace, and that it was running), so the result of every
// exec delivered here is authorized without reading its row. Safe for
// concurrent use.
type deliveredExecs struct {
	mu    sync.Mutex
	max   int
	m     map[string]store.Exec
	order []string // ids in the order noted; some may be forgotten already
}

func newDeliveredExecs(max int) *deliveredExecs {
	return &deliveredExecs{max: max, m: map[string]store.Exec{}}
}

// note remembers exec id, delivered to worker workerID of namespace ns.
func (d *deliveredExecs) note(id, ns, workerID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.m[id]; ok {
		return
	}
	for len(d.m) >= d.max && len(d.order) > 0 {
		delete(d.m, d.order[0])
		d.order = d.order[1:]
	}
	d.m[id] = store.Exec{ID: id, Namespace: ns, WorkerID: workerID, State: operatorapi.ExecRunning}
	d.order = append(d.order, id)
	if len(d.order) > 2*d.max {
		// Mostly forgotten ids: keep the ones still remembered.
		live := d.order[:0]
		for _, x := range d.order {
			if _, ok := d.m[x]; ok {
				live = append(live, x)
			}
		}
		d.order = live
	}
}

// get returns what is remembered of exec id.
func (d *deliveredExecs) get(id string) (store.Exec, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.m[id]
	return e, ok
}

// forget drops exec id: its result is stored (or it is gone).
func (d *deliveredExecs) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.m, id)
}

var errUnknownExec = badField(http.StatusNotFound, "exec_id", "unknown exec")

func decodeExecResult(body []byte, asJSON bool) (messages.ExecResult, error) {
	var res messages.ExecResult
	if !asJSON {
		m, err := scanMap(body)
		if err != nil {
			return res, err
		}
		if err := runChecks(m, execResultChecks); err != nil {
			return res, err
		}
		if err := decodeTyped(body, &res); err != nil {
			return res, err
		}
		code, _ := m.Get("exit_code")
		return res, checkExitCode(code)
	}
	// Only exit_code is kept apart, to tell it missing from zero; the
	// decoder steps over every other key without allocating.
	var probe struct {
		ExitCode json.RawMessage `json:"exit_code"`
	}
	if err := decodeJSON(body, &probe); err != nil {
		return res, err
	}
	if v := bytes.TrimSpace(probe.ExitCode); len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return res, badField(http.StatusUnprocessableEntity, "exit_code", "missing")
	}
	if err := decodeJSON(body, &res); err != nil {
		return res, err
	}
	return res, nil
}

// checkExitCode refuses an exit code the typed decoder would silently wrap.
func checkExitCode(v messages.Value) error {
	n, ok := v.Int()
	if !ok || n < -1<<31 || n > 1<<31-1 {
		return badField(http.StatusUnprocessableEntity, "exit_code", "must be a 32-bit integer")
	}
	return nil
}

// handleExecChunk appends streamed output to a running exec.
func (s *Server) handleExecChunk(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("exec_id")
	fail := func(err error) { writeDaemonError(w, err) }
	const finished = "output is taken only while it runs"
	p, ok := s.authorizeExec(w, r, id, finished, fail)
	if !ok {
		return
	}
	body, err := readBody(w, r, limitExecChunk)
	if err != nil {
		fail(err)
		return
	}
	if !s.finishSignature(w, r, p, body) {
		return
	}
	total, err := s.st.AppendOutput(r.Context(), id, body)
	if err != nil {
		if rerr := execStateError(err, finished); rerr != nil {
			s.log.Info().Err(err).Str("exec_id", id).Msg("exec chunk refused")
			fail(rerr)
			return
		}
		if isNotFound(err) {
			fail(errUnknownExec)
			return
		}
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec chunk: store")
		fail(err)
		return
	}
	if len(body) > 0 {
		s.wake.broadcast(execKey(id))
	}
	s.log.Debug().Str("exec_id", id).Int("bytes", len(body)).Int64("total", total).Msg("exec output")
	writeMsgpack(w, http.StatusOK, map[string]any{"ok": true, "total": total})
}
