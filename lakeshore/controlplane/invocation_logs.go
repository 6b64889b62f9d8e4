package controlplane

import (
	"net/http"
	"strconv"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// handleInvocationLogs answers one page of a run's output from a cursor;
// with wait it long-polls until there is output after the cursor, the
// invocation's state changes (it is claimed, it ends) or the wait is over.
func (s *Server) handleInvocationLogs(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	id := r.PathValue("inv_id")
	q := r.URL.Query()
	wait, err := parseWait(q.Get("wait"), min(s.waitCap, operatorapi.MaxWait))
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	after, err := queryInt(q.Get("after"), "after", 0, 0, 1<<62)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	maxBytes, err := queryInt(q.Get("max_bytes"), "max_bytes", operatorapi.DefaultLogBytes, 1, operatorapi.MaxLogBytes)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	if !validPathID(id) {
		writeOperatorError(w, errNoSuchInvocation)
		return
	}
	// Only invocations, as the invocation reads do: `run` and `logs
	// --follow` call this all the time, and execs are the ticker's.
	s.sweepLostInvocations(r.Context())
	timer := time.NewTimer(wait)
	defer timer.Stop()
	first := ""
	for {
		// Subscribed before reading, so nothing that lands in between is
		// missed.
		woken, release := s.wakeEither(logKey(id), invocationKey(id))
		inv, err := s.st.Invocation(r.Context(), ns, id)
		if isNotFound(err) {
			release()
			writeOperatorError(w, errNoSuchInvocation)
			return
		}
		if err != nil {
			release()
			writeOperatorError(w, err)
			return
		}
		evs, more, err := s.st.InvocationLog(r.Context(), store.LogQuery{InvocationID: id, Kind: messages.EventInvocationLog,
			After: after, MaxEvents: operatorapi.MaxLogEvents, MaxBytes: int(maxBytes)})
		if err != nil {
			release()
			s.log.Error().Err(err).Str("invocation_id", id).Msg("read invocation log")
			writeOperatorError(w, err)
			return
		}
		if first == "" {
			first = inv.State
		}
		if wait == 0 || len(evs) > 0 || inv.State != first || operatorapi.InvocationTerminal(inv.State) {
			release()
			writeJSON(w, http.StatusOK, s.logsView(inv, evs, after, more))
			return
		}
		switch s.park(logKey(id), woken, release, timer.C, r.Context().Done()) {
		case parkOver:
			wait = 0
		case parkGone:
			return
		}
	}
}

// wakeEither subscribes to two keys at once: the channel closes at the
// first broadcast on either.
func (s *Server) wakeEither(a, b string) (<-chan struct{}, func()) {
	wa, ra := s.wake.subscribe(a)
	wb, rb := s.wake.subscribe(b)
	out, stop := make(chan struct{}), make(chan struct{})
	go func() {
		select {
		case <-wa:
			close(out)
		case <-wb:
			close(out)
		case <-stop:
		}
	}()
	var released bool
	return out, func() {
		if !released {
			released = true
			close(stop)
			ra()
			rb()
		}
	}
}

func (s *Server) logsView(inv store.Invocation, evs []store.Event, after int64, more bool) operatorapi.InvocationLogs {
	out := operatorapi.InvocationLogs{InvocationID: inv.ID, State: inv.State, Events: make([]operatorapi.LogEvent, 0, len(evs)),
		Next: after, More: more}
	for _, e := range evs {
		var d messages.LogData
		if err := messages.Unmarshal(e.Data, &d); err != nil {
			// Checked when it was posted; a row that does not decode is
			// skipped rather than failing the whole page.
			s.log.Error().Err(err).Str("invocation_id", inv.ID).Str("event_id", e.ID).Msg("stored log event does not decode")
		} else {
			out.Events = append(out.Events, operatorapi.LogEvent{Seq: *e.Seq, Stream: d.Stream, Data: nonNilBytes(d.Data),
				TS: e.TS, Dropped: d.Dropped})
		}
		out.Next = *e.Seq
	}
	return out
}

// queryInt reads an integer query parameter within [lo, hi]; empty is def.
func queryInt(v, name string, def, lo, hi int64) (int64, error) {
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < lo || n > hi {
		return 0, badField(http.StatusBadRequest, name, "must be an integer from %d to %d", lo, hi)
	}
	return n, nil
}
