package controlplane

import (
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"unicode"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// queueNameRe is what an operator may create. Names daemons join (lanes,
// poll queues) are taken as they come, including '*' patterns.
var queueNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$`) })

// Limits of one membership edit.
const (
	maxQueueEdits   = 64
	maxQueueNameLen = 256
)

func queueView(q store.Queue) operatorapi.Queue {
	return operatorapi.Queue{Name: q.Name, CreatedAt: q.CreatedAt, Members: q.Members}
}

func (s *Server) handleCreateQueue(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.CreateQueueRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	if req.Name == "" {
		writeOperatorError(w, badField(http.StatusBadRequest, "name", "no queue name was given"))
		return
	}
	if !queueNameRe().MatchString(req.Name) {
		writeOperatorError(w, badField(http.StatusBadRequest, "name",
			"%q must start with a letter or digit and contain only letters, digits and . _ : - (at most 128)", req.Name))
		return
	}
	created, err := s.st.CreateQueue(r.Context(), ns, req.Name, s.now())
	if err != nil {
		s.log.Error().Err(err).Msg("create queue")
		writeOperatorError(w, err)
		return
	}
	all, err := s.st.ListQueues(r.Context(), ns)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.QueueCreated{Queue: operatorapi.Queue{Name: req.Name, Members: []string{}}, Created: created}
	for _, q := range all {
		if q.Name == req.Name {
			out.Queue = queueView(q)
		}
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.log.Info().Str("namespace", ns).Str("queue", req.Name).Msg("queue created")
	}
	writeJSON(w, status, out)
}

func (s *Server) handleListQueues(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	all, err := s.st.ListQueues(r.Context(), ns)
	if err != nil {
		s.log.Error().Err(err).Msg("list queues")
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.QueueList{Queues: make([]operatorapi.Queue, 0, len(all))}
	for _, q := range all {
		out.Queues = append(out.Queues, queueView(q))
	}
	writeJSON(w, http.StatusOK, out)
}

// checkQueueNames screens the names of one side of an edit.
func checkQueueNames(field string, names []string) error {
	for i, q := range names {
		f := field + "[" + strconv.Itoa(i) + "]"
		if q == "" {
			return badField(http.StatusBadRequest, f, "empty queue name")
		}
		if len(q) > maxQueueNameLen {
			return badField(http.StatusBadRequest, f, "longer than %d bytes", maxQueueNameLen)
		}
		if slices.ContainsFunc([]rune(q), func(c rune) bool { return unicode.IsControl(c) || c == unicode.ReplacementChar }) {
			return badField(http.StatusBadRequest, f, "contains control characters or invalid UTF-8")
		}
	}
	return nil
}

func (s *Server) handleEditWorkerQueues(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.QueueEditRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	switch {
	case len(req.Add) == 0 && len(req.Remove) == 0:
		writeOperatorError(w, badField(http.StatusBadRequest, "add", "nothing to change: give queues to add or remove"))
		return
	case len(req.Add)+len(req.Remove) > maxQueueEdits:
		writeOperatorError(w, badField(http.StatusBadRequest, "add", "at most %d queues per edit", maxQueueEdits))
		return
	}
	if err := checkQueueNames("add", req.Add); err != nil {
		writeOperatorError(w, err)
		return
	}
	if err := checkQueueNames("remove", req.Remove); err != nil {
		writeOperatorError(w, err)
		return
	}
	for _, q := range req.Add {
		if slices.Contains(req.Remove, q) {
			writeOperatorError(w, badField(http.StatusBadRequest, "remove", "queue %q is both added and removed", q))
			return
		}
	}
	updated, err := s.st.EditWorkerQueues(r.Context(), store.QueueEdit{Namespace: wk.Namespace, WorkerID: wk.ID, Add: req.Add, Remove: req.Remove})
	var uq *store.UnknownQueueError
	switch {
	case errors.As(err, &uq):
		writeOperatorError(w, badField(http.StatusBadRequest, "add",
			"queue %q does not exist in namespace %q: create it with `lakeshore queue create %s` or let a daemon join it", uq.Name, wk.Namespace, uq.Name))
		return
	case isNotFound(err):
		writeOperatorError(w, errNoSuchWorker)
		return
	case err != nil:
		s.log.Error().Err(err).Str("worker_id", wk.ID).Msg("edit worker queues")
		writeOperatorError(w, err)
		return
	}
	// Its memos go: it may claim from other queues now.
	s.changed(wk.ID)
	s.log.Info().Str("worker_id", wk.ID).Strs("added", req.Add).Strs("removed", req.Remove).
		Strs("queues", updated.Queues).Msg("worker queues edited")
	writeJSON(w, http.StatusOK, operatorapi.WorkerQueues{
		WorkerID: updated.ID, Queues: updated.Queues, Lanes: updated.Lanes,
		Added: updated.QueuesAdded, Removed: updated.QueuesRemoved,
	})
}
