package controlplane

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// namespace reads and checks {ns}.
func namespace(r *http.Request) (string, error) {
	ns := r.PathValue("ns")
	if !validNamespace(ns) {
		return "", badField(http.StatusBadRequest, "ns", "must be 1-63 letters, digits, '.', '_' or '-'")
	}
	return ns, nil
}

var errNoSuchWorker = badField(http.StatusNotFound, "id", "no such worker")

// resolveWorker finds {id} in the namespace: a worker id, else a label that
// names exactly one worker.
func (s *Server) resolveWorker(r *http.Request) (store.Worker, error) {
	ns, err := namespace(r)
	if err != nil {
		return store.Worker{}, err
	}
	id := r.PathValue("id")
	if id == "" || len(id) > 256 {
		return store.Worker{}, errNoSuchWorker
	}
	w, err := s.worker(r.Context(), ns, id)
	if err == nil {
		return w, nil
	}
	if !isNotFound(err) {
		return store.Worker{}, err
	}
	// By label, from the index: a fleet's size does not weigh on every
	// `daemon exec <label>`.
	found, err := s.st.WorkersByLabel(r.Context(), ns, id)
	if err != nil {
		return store.Worker{}, err
	}
	switch len(found) {
	case 1:
		return s.withSeen(found[0]), nil
	case 0:
		return store.Worker{}, errNoSuchWorker
	default:
		return store.Worker{}, badField(http.StatusConflict, "id", "label %q names %d workers; use an id", id, len(found))
	}
}

// derivedState is the stored state, or stale when the worker has not been
// seen for the stale window (operatorapi.StaleAfter unless configured).
func (s *Server) derivedState(w store.Worker, now time.Time) string {
	// A pending worker has never been seen: its machine is still booting.
	if w.State != operatorapi.StateGone && w.State != operatorapi.StatePending && now.Sub(w.LastSeenAt) > s.staleAfter {
		return operatorapi.StateStale
	}
	return w.State
}

func (s *Server) workerView(w store.Worker, now time.Time) operatorapi.Worker {
	v := operatorapi.Worker{
		ID:          w.ID,
		Namespace:   w.Namespace,
		MachineID:   w.MachineID,
		Label:       w.Label,
		State:       s.derivedState(w, now),
		StoredState: w.State,
		Tags:        w.Tags,
		Queues:      w.Queues,
		Runners:     w.Capabilities.Runners,
		Capabilities: operatorapi.Capabilities{
			Runners: w.Capabilities.Runners, MaxInvocations: w.Capabilities.MaxInvocations, Workdir: w.Capabilities.Workdir,
		},
		Versions:     json.RawMessage(w.Versions),
		PollQueue:    w.PollQueue,
		CreatedAt:    w.CreatedAt,
		LastSeenAt:   w.LastSeenAt,
		Hibernating:  w.HibernatingUntil,
		SetupPending: w.SetupPending,
		Running:      make([]operatorapi.InvocationStatus, 0, len(w.Running)),
		Keys:         []operatorapi.KeyInfo{},
		Provider:     w.Provider,
		InstanceID:   w.InstanceID,
	}
	v.SingleJob, v.SingleJobTaken = w.SingleJob, w.HasJob()
	if !json.Valid(v.Versions) {
		v.Versions = json.RawMessage("{}")
	}
	for _, inv := range w.Running {
		v.Running = append(v.Running, operatorapi.InvocationStatus{
			InvocationID: inv.InvocationID, State: inv.State, StartedAt: inv.StartedAt, StdoutTail: inv.StdoutTail,
		})
	}
	return v
}

func (s *Server) handleListWorkers(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	f, err := parseWorkerFilter(r.URL.Query())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	all, err := s.listWorkers(r.Context(), ns)
	if err != nil {
		s.log.Error().Err(err).Msg("list workers")
		writeOperatorError(w, err)
		return
	}
	now := s.now()
	// Filtered and counted on the rows; only the page becomes views, with
	// its keys and outcomes read.
	counts := map[string]int{}
	var page []store.Worker
	total := 0
	for _, wk := range all {
		state := s.derivedState(wk, now)
		counts[state]++
		if !f.match(wk, state) {
			continue
		}
		if total >= f.offset && (f.limit == 0 || len(page) < f.limit) {
			page = append(page, wk)
		}
		total++
	}
	out := operatorapi.WorkerList{Workers: make([]operatorapi.Worker, 0, len(page)), Total: total,
		Counts: make([]operatorapi.StateCount, 0, len(operatorapi.States))}
	for _, st := range operatorapi.States {
		out.Counts = append(out.Counts, operatorapi.StateCount{State: st, Count: counts[st]})
	}
	for _, wk := range page {
		out.Workers = append(out.Workers, s.workerView(wk, now))
	}
	s.withKeys(r.Context(), ns, out.Workers)
	s.withOutcomes(r.Context(), ns, out.Workers, false)
	s.withOpenExecs(r.Context(), ns, out.Workers)
	writeJSON(w, http.StatusOK, out)
}

// workerFilter is RouteListWorkers' query: zero fields match everything,
// a zero limit takes every match.
type workerFilter struct {
	state, queue, labelPrefix string
	limit, offset             int
}

func (f workerFilter) match(w store.Worker, state string) bool {
	if f.state != "" && state != f.state {
		return false
	}
	if f.labelPrefix != "" && !strings.HasPrefix(w.Label, f.labelPrefix) {
		return false
	}
	return f.queue == "" || slices.Contains(w.Queues, f.queue)
}

// parseWorkerFilter validates the query; a queue or prefix with odd
// characters is no error (it matches nothing), one too long or with a
// control character is.
func parseWorkerFilter(q url.Values) (workerFilter, error) {
	f := workerFilter{state: q.Get(operatorapi.WorkerQueryState), queue: q.Get(operatorapi.WorkerQueryQueue),
		labelPrefix: q.Get(operatorapi.WorkerQueryLabelPrefix)}
	if f.state != "" && !slices.Contains(operatorapi.States, f.state) {
		return f, badField(http.StatusBadRequest, operatorapi.WorkerQueryState, "must be one of %s", strings.Join(operatorapi.States, ", "))
	}
	for name, v := range map[string]string{operatorapi.WorkerQueryQueue: f.queue, operatorapi.WorkerQueryLabelPrefix: f.labelPrefix} {
		if len(v) > operatorapi.MaxWorkerFilter {
			return f, badField(http.StatusBadRequest, name, "at most %d bytes", operatorapi.MaxWorkerFilter)
		}
		if strings.ContainsFunc(v, unicode.IsControl) || !utf8.ValidString(v) {
			return f, badField(http.StatusBadRequest, name, "must be printable UTF-8")
		}
	}
	limit, err := queryInt(q.Get(operatorapi.WorkerQueryLimit), operatorapi.WorkerQueryLimit, 0, 0, operatorapi.MaxWorkerPage)
	if err != nil {
		return f, err
	}
	offset, err := queryInt(q.Get(operatorapi.WorkerQueryOffset), operatorapi.WorkerQueryOffset, 0, 0, math.MaxInt32)
	if err != nil {
		return f, err
	}
	f.limit, f.offset = int(limit), int(offset)
	return f, nil
}

func (s *Server) handleGetWorker(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	v := []operatorapi.Worker{s.workerView(wk, s.now())}
	s.withKeys(r.Context(), wk.Namespace, v)
	s.withOutcomes(r.Context(), wk.Namespace, v, true)
	s.withOpenExecs(r.Context(), wk.Namespace, v)
	writeJSON(w, http.StatusOK, v[0])
}

// handleKillWorker terminates the worker's instance through the provider
// that launched it (unless terminate=false), then removes the row; a
// daemon still running gets 404 on its next poll.
func (s *Server) handleKillWorker(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	// The instance first: a row removed before a failed terminate would
	// leave a machine running that nothing names any more.
	out := operatorapi.KillResponse{Deleted: wk.ID, Provider: wk.Provider, InstanceID: wk.InstanceID}
	if r.URL.Query().Get("terminate") == "false" {
		out.Note = "--no-terminate: the row only; the instance, if any, is left running"
	} else if out.Terminated, out.Note, err = s.terminateInstance(r.Context(), wk); err != nil {
		writeOperatorError(w, err)
		return
	}
	err = s.st.DeleteWorker(r.Context(), wk.Namespace, wk.ID)
	if isNotFound(err) {
		writeOperatorError(w, errNoSuchWorker)
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("worker_id", wk.ID).Msg("kill worker")
		writeOperatorError(w, err)
		return
	}
	s.forget(wk.ID)
	s.log.Info().Str("worker_id", wk.ID).Str("label", wk.Label).Msg("worker killed")
	s.sweepLost(r.Context())
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleCleanup(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.CleanupRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	h := req.OlderThanHours
	if math.IsNaN(h) || h <= 0 || h > operatorapi.MaxCleanupHours {
		writeOperatorError(w, badField(http.StatusBadRequest, "olderThanHours",
			"must be more than 0 and at most %d hours, got %v", operatorapi.MaxCleanupHours, h))
		return
	}
	now := s.now()
	cutoff := now.Add(-time.Duration(h * float64(time.Hour)))
	// The removal reads the stored last seen: write what memory has.
	s.flushPresence(r.Context(), s.log)
	all, err := s.listWorkers(r.Context(), ns)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	byID := map[string]store.Worker{}
	var ids []string
	for _, wk := range all {
		byID[wk.ID] = wk
		if wk.LastSeenAt.Before(cutoff) {
			ids = append(ids, wk.ID)
		}
	}
	if !req.DryRun {
		ids, err = s.st.DeleteWorkersSeenBefore(r.Context(), ns, cutoff)
		if err != nil {
			s.log.Error().Err(err).Msg("cleanup")
			writeOperatorError(w, err)
			return
		}
	}
	out := operatorapi.CleanupResponse{DryRun: req.DryRun, Deleted: []operatorapi.Worker{}}
	for _, id := range ids {
		wk, ok := byID[id]
		if !ok {
			wk = store.Worker{ID: id, Namespace: ns, State: operatorapi.StateGone, Tags: []string{}, Queues: []string{},
				Capabilities: store.Capabilities{Runners: []string{}}}
		}
		out.Deleted = append(out.Deleted, s.workerView(wk, now))
		if !req.DryRun {
			s.forget(id)
		}
	}
	out.Count = len(out.Deleted)
	if !req.DryRun && out.Count > 0 {
		s.sweepLost(r.Context())
	}
	s.log.Info().Float64("older_than_hours", h).Bool("dry_run", req.DryRun).Int("count", out.Count).Msg("cleanup")
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleListCommands(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	cmds, err := s.st.ListCommands(r.Context(), wk.ID)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	out := make([]operatorapi.CommandInfo, 0, len(cmds))
	for _, c := range cmds {
		out = append(out, operatorapi.CommandInfo{ID: c.ID, Kind: c.Kind, State: c.State(), CreatedAt: c.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

// withOpenExecs fills each view's OpenExecs with one grouped read; a
// failed read leaves them 0 and is logged, like the other extras.
func (s *Server) withOpenExecs(ctx context.Context, ns string, ws []operatorapi.Worker) {
	if len(ws) == 0 {
		return
	}
	open, err := s.st.OpenExecs(ctx, ns)
	if err != nil {
		s.log.Error().Err(err).Msg("count open execs")
		return
	}
	for i := range ws {
		ws[i].OpenExecs = open[ws[i].ID]
	}
}
