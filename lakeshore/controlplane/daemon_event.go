package controlplane

import (
	"context"
	"net/http"
	"strings"

	"nymph/lakeshore/store"
	"nymph/messages"
)

// Events a daemon posts to /v1/daemon/event belong to something it was
// given: an invocation.* event to an invocation claimed by that worker, a
// setup.finished to a setup command of that worker, an ota.finished to an
// ota_update command of that worker (or, for an update the daemon started
// on its own, to its messages.AutoUpdateEventID, which names no command).
// The poster is the worker of the key that signed the request, or, for a
// bearer, the body's worker_id (the project's extra; signedAuth has already
// checked that it is the key's worker when both are there). Anything else
// is refused: 404 for what does not exist, 403 for what belongs to another
// worker, 422 naming the field of a malformed body.

var eventChecks = []check{
	{path: "invocation_id", required: true, kind: kNonEmpty},
	{path: "kind", required: true, kind: kNonEmpty},
	{path: "ts", kind: kNumber},
	{path: "worker_id", kind: kString},
}

var logDataChecks = []check{
	{path: "data", required: true, kind: kMap},
	{path: "data.stream", required: true, kind: kNonEmpty},
	{path: "data.seq", required: true, kind: kUint64},
	{path: "data.data", required: true, kind: kBytes},
	{path: "data.dropped", kind: kUint64},
}

var setupOutcomeChecks = []check{
	{path: "data", required: true, kind: kMap},
	{path: "data.name", kind: kString},
	{path: "data.state", required: true, kind: kNonEmpty},
	{path: "data.exit_code", required: true, kind: kInt32},
	{path: "data.duration_ms", kind: kUint64},
	{path: "data.output_tail", kind: kString},
	{path: "data.error", kind: kString},
}

var otaOutcomeChecks = []check{
	{path: "data", required: true, kind: kMap},
	{path: "data.source", kind: kString},
	{path: "data.version", kind: kString},
	{path: "data.outcome", required: true, kind: kNonEmpty},
	{path: "data.code", kind: kString},
	{path: "data.reason", kind: kString},
	{path: "data.sha256", kind: kString},
	{path: "data.applies", kind: kString},
}

// Event kinds an invocation has, besides invocation.log: stored as they
// come.
const (
	eventInvocationProgress = "invocation.progress"
	eventInvocationEvent    = "invocation.event"
)

func logKey(invocationID string) string { return "l:" + invocationID }

// handleEvent stores an event of an invocation, or the outcome of a setup
// or an update.
func (s *Server) handleEvent(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
	body, err := readBody(w, r, limitEvent)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	ev, seq, size, err := decodeEvent(body)
	if err != nil {
		s.log.Info().Err(err).Msg("event refused as malformed")
		writeDaemonError(w, err)
		return
	}
	wk, err := s.eventWorker(r.Context(), p, ev)
	if err == nil {
		err = s.checkEventScope(r.Context(), wk, ev)
	}
	if err != nil {
		s.log.Info().Err(err).Str("kind", ev.Kind).Str("invocation_id", ev.InvocationID).Str("worker_id", wk.ID).Msg("event refused")
		writeDaemonError(w, err)
		return
	}
	now := s.now()
	ts := now
	if ev.TS != 0 {
		ts = epochTime(ev.TS)
	}
	applied, err := s.st.SaveEvent(r.Context(), store.Event{
		ID: newULID(), InvocationID: ev.InvocationID, WorkerID: wk.ID, Kind: ev.Kind, Data: []byte(ev.Data),
		TS: ts, ReceivedAt: now, Seq: seq, Size: size,
	})
	if err != nil {
		s.log.Error().Err(err).Str("invocation_id", ev.InvocationID).Msg("event: store")
		writeDaemonError(w, err)
		return
	}
	switch ev.Kind {
	case messages.EventInvocationLog:
		if applied {
			s.wake.broadcast(logKey(ev.InvocationID))
		}
	case messages.EventSetupFinished, messages.EventOtaFinished:
		s.log.Info().Str("worker_id", wk.ID).Str("kind", ev.Kind).Str("command_id", ev.InvocationID).
			Bool("duplicate", !applied).Msg("outcome reported")
	}
	writeMsgpack(w, http.StatusOK, map[string]any{"ok": true, "duplicate": !applied})
}

// decodeEvent checks and decodes an event body and its data by kind, and
// returns the seq it is stored under (nil: none) and the output bytes it
// carries.
func decodeEvent(body []byte) (messages.Event, *int64, int64, error) {
	var ev messages.Event
	m, err := scanMap(body)
	if err == nil {
		err = runChecks(m, eventChecks)
	}
	if err != nil {
		return ev, nil, 0, err
	}
	kind := strField(m, "kind")
	var (
		seq  *int64
		size int64
	)
	switch kind {
	case messages.EventInvocationLog:
		if err := runChecks(m, logDataChecks); err != nil {
			return ev, nil, 0, err
		}
		d, _ := m.Get("data")
		if st := strField(d, "stream"); st != messages.StreamStdout && st != messages.StreamStderr {
			return ev, nil, 0, badField(http.StatusUnprocessableEntity, "data.stream", "must be stdout or stderr")
		}
		sv, _ := d.Get("seq")
		n, _ := sv.Int()
		seq = &n
		// The bytes of a bin or str, the elements of an array of bytes.
		data, _ := d.Get("data")
		size = int64(data.Len())
	case messages.EventSetupFinished:
		if err := runChecks(m, setupOutcomeChecks); err != nil {
			return ev, nil, 0, err
		}
		d, _ := m.Get("data")
		if st := strField(d, "state"); st != messages.StateSucceeded && st != messages.StateFailed {
			return ev, nil, 0, badField(http.StatusUnprocessableEntity, "data.state", "must be succeeded or failed")
		}
		seq = new(int64)
	case messages.EventOtaFinished:
		if err := runChecks(m, otaOutcomeChecks); err != nil {
			return ev, nil, 0, err
		}
		d, _ := m.Get("data")
		switch strField(d, "outcome") {
		case messages.OtaInstalled, messages.OtaAlreadyRunning, messages.OtaRefused:
		default:
			return ev, nil, 0, badField(http.StatusUnprocessableEntity, "data.outcome", "must be installed, already_running or refused")
		}
		seq = new(int64)
	case eventInvocationProgress, eventInvocationEvent:
	default:
		return ev, nil, 0, badField(http.StatusUnprocessableEntity, "kind", "unknown event kind %q; want %s, %s, %s, %s or %s", kind,
			messages.EventInvocationLog, eventInvocationProgress, eventInvocationEvent, messages.EventSetupFinished, messages.EventOtaFinished)
	}
	if err := decodeTyped(body, &ev); err != nil {
		return ev, nil, 0, err
	}
	if len(ev.Data) == 0 {
		ev.Data = []byte{0xc0}
	}
	return ev, seq, size, nil
}

// strField is the string at key of a checked map, "" when it is not one.
func strField(m messages.Value, key string) string {
	v, _ := m.Get(key)
	s, _ := v.Str()
	return string(s)
}

// eventWorker is the worker posting ev.
func (s *Server) eventWorker(ctx context.Context, p daemonPrincipal, ev messages.Event) (store.Worker, error) {
	id := p.workerID
	if id == "" {
		id = ev.WorkerID
	}
	if id == "" {
		return store.Worker{}, badField(http.StatusUnprocessableEntity, "worker_id",
			"missing: an unsigned event names the worker posting it")
	}
	wk, err := s.st.Worker(ctx, p.namespace, id)
	if isNotFound(err) {
		return store.Worker{ID: id}, badField(http.StatusNotFound, "worker_id", "unknown worker %q", id)
	}
	return wk, err
}

// checkEventScope refuses an event for something that is not the worker's.
func (s *Server) checkEventScope(ctx context.Context, wk store.Worker, ev messages.Event) error {
	id := ev.InvocationID
	switch {
	case strings.HasPrefix(ev.Kind, "invocation."):
		inv, err := s.st.Invocation(ctx, wk.Namespace, id)
		if isNotFound(err) {
			return badField(http.StatusNotFound, "invocation_id", "unknown invocation %q", id)
		}
		if err != nil {
			return err
		}
		if inv.WorkerID != wk.ID {
			return badField(http.StatusForbidden, "invocation_id", "invocation %q was not handed to worker %s", id, wk.ID)
		}
		return nil
	case ev.Kind == messages.EventOtaFinished && messages.IsAutoUpdateEventID(id):
		return nil
	}
	want := messages.KindSetup
	if ev.Kind == messages.EventOtaFinished {
		want = messages.KindOtaUpdate
	}
	c, err := s.st.Command(ctx, id)
	if isNotFound(err) {
		return badField(http.StatusNotFound, "invocation_id",
			"no command %q: the invocation_id of a %s is the command id of its %s", id, ev.Kind, want)
	}
	if err != nil {
		return err
	}
	if c.WorkerID != wk.ID {
		return badField(http.StatusForbidden, "invocation_id", "command %q was not sent to worker %s", id, wk.ID)
	}
	if c.Kind != want {
		return badField(http.StatusUnprocessableEntity, "kind", "command %q is a %s, not a %s: no %s for it", id, c.Kind, want, ev.Kind)
	}
	return nil
}
