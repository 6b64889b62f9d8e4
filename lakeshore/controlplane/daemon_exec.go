package controlplane

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"

	"nymph/messages"
)

// The exec result and chunk callbacks carry no bearer: the unguessable
// exec id in the path is what authenticates them.

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
	asJSON := false
	fail := func(err error) {
		if asJSON {
			writeOperatorError(w, err)
		} else {
			writeDaemonError(w, err)
		}
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
	asJSON = isJSON(r.Header.Get("Content-Type"), body)
	if !asJSON && len(body) > limitExecResult {
		fail(badField(http.StatusRequestEntityTooLarge, "body", "larger than %d bytes", limitExecResult))
		return
	}
	if !validPathID(id) {
		fail(errUnknownExec)
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
	applied, err := s.st.FinishExec(r.Context(), id, stored, s.now())
	if isNotFound(err) {
		fail(errUnknownExec)
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec result: store")
		fail(err)
		return
	}
	if applied {
		s.wake.broadcast(execKey(id))
		s.log.Info().Str("exec_id", id).Int32("exit_code", res.ExitCode).Uint64("duration_ms", res.DurationMs).Msg("exec finished")
	} else {
		s.log.Debug().Str("exec_id", id).Msg("repeated exec result ignored")
	}
	ok := map[string]any{"ok": true, "duplicate": !applied}
	if asJSON {
		writeJSON(w, http.StatusOK, ok)
	} else {
		writeMsgpack(w, http.StatusOK, ok)
	}
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

func (s *Server) handleExecChunk(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("exec_id")
	body, err := readBody(w, r, limitExecChunk)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	if !validPathID(id) {
		writeDaemonError(w, errUnknownExec)
		return
	}
	total, err := s.st.AppendOutput(r.Context(), id, body)
	if isNotFound(err) {
		writeDaemonError(w, errUnknownExec)
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec chunk: store")
		writeDaemonError(w, err)
		return
	}
	if len(body) > 0 {
		s.wake.broadcast(execKey(id))
	}
	s.log.Debug().Str("exec_id", id).Int("bytes", len(body)).Int64("total", total).Msg("exec output")
	writeMsgpack(w, http.StatusOK, map[string]any{"ok": true, "total": total})
}
