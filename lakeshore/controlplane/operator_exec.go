package controlplane

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// What a streamed exec's daemon is told: ship output at least this often,
// or as soon as this much has piled up.
const (
	streamFlushMs    = 50
	streamFlushBytes = 32 << 10
)

// buildExec validates an operator's exec request and makes the command body.
func (s *Server) buildExec(r *http.Request, req operatorapi.ExecRequest, execID string) (*messages.Exec, error) {
	if strings.TrimSpace(req.Command) == "" {
		return nil, badField(http.StatusBadRequest, "command", "no command was given: send the shell command to run")
	}
	if math.IsNaN(req.TimeoutS) || req.TimeoutS < 0 || req.TimeoutS > 365*24*3600 {
		return nil, badField(http.StatusBadRequest, "timeoutS", "must be between 0 (none) and one year in seconds")
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return nil, badField(http.StatusBadRequest, "env", "variable %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	e := &messages.Exec{ExecID: execID, Command: req.Command, Env: req.Env, Stdin: string(req.Stdin)}
	if e.Env == nil {
		e.Env = map[string]string{}
	}
	if req.Workdir != "" {
		e.Workdir = &req.Workdir
	}
	if req.TimeoutS > 0 {
		t := req.TimeoutS
		e.TimeoutS = &t
	}
	if req.Stream {
		e.Log = &messages.LogSink{
			StdoutURL:  s.currentPublicURL(r.Host) + "/v1/daemon/exec/" + execID + "/chunk",
			FlushMs:    streamFlushMs,
			FlushBytes: streamFlushBytes,
		}
	}
	return e, nil
}

// submitExec queues req for wk and answers. repick, for an exec routed to
// a queue, picks another member when wk turns out to be a single-job
// daemon that another job took meanwhile. wk with no state is a worker
// addressed by id and not read (byWorkerID): the enqueue tells the rest
// of it, and false means no worker of its namespace has that id, or a
// single-job one refused the exec; nothing was queued or answered.
func (s *Server) submitExec(w http.ResponseWriter, r *http.Request, wk store.Worker, req operatorapi.ExecRequest, repick workerPicker) bool {
	unread := wk.State == ""
	wait, err := parseWait(r.URL.Query().Get("wait"), s.waitCap)
	if err != nil {
		writeOperatorError(w, err)
		return true
	}
	id := newExecID()
	body, err := s.buildExec(r, req, id)
	if err != nil {
		writeOperatorError(w, err)
		return true
	}
	newExec := &store.NewExec{ID: id, Namespace: wk.Namespace, Command: req.Command, Stream: req.Stream}
	// A waiting submission subscribes before the exec exists: whatever
	// happens to it after the enqueue wakes the wait, so the wait needs
	// no first look at an exec it knows is queued and silent.
	var first *subscription
	if wait > 0 {
		woken, release := s.wake.subscribe(execKey(id))
		first = &subscription{woken: woken, release: release, end: s.waiting.watch(id)}
		defer release()
		defer s.waiting.unwatch(id)
	}
	c, err := s.enqueue(r, wk, messages.KindExec, body, newExec, nil)
	if unread {
		var taken *singleJobConflict
		if errors.Is(err, errNoSuchWorker) || errors.As(err, &taken) {
			// Not found, or refused with a message that names the
			// worker's label: the caller reads the worker and
			// submits again.
			return false
		}
		wk = s.withSeen(store.Worker{ID: wk.ID, Namespace: c.Worker.Namespace, Label: c.Worker.Label, State: c.Worker.State,
			LastSeenAt: c.Worker.LastSeenAt, HibernatingUntil: c.Worker.HibernatingUntil})
	}
	for skip := map[string]bool{}; repick != nil; {
		var taken *singleJobConflict
		if !errors.As(err, &taken) {
			break
		}
		skip[wk.ID] = true
		if wk, err = repick(skip); err != nil {
			break
		}
		_, err = s.enqueue(r, wk, messages.KindExec, body, newExec, nil)
	}
	if err != nil {
		writeOperatorError(w, err)
		return true
	}
	now := s.now()
	seen := wk.LastSeenAt
	acc := operatorapi.ExecAccepted{ExecID: id, WorkerID: wk.ID, Label: wk.Label, WorkerState: s.derivedState(wk, now), LastSeenAt: &seen}
	if wk.HibernatingUntil != nil && wk.HibernatingUntil.After(now) {
		acc.HibernatingUntil = wk.HibernatingUntil
	}
	if wait == 0 {
		writeJSON(w, http.StatusAccepted, acc)
		return true
	}
	// The id goes out before the wait, so a client that loses the
	// connection while waiting still knows which exec to follow. Only an
	// end or output ends this wait: delivery to the daemon, which would
	// wake a read, is no news to someone waiting for the command's output.
	w.Header().Set("Content-Type", operatorapi.ContentTypeNDJSON)
	w.WriteHeader(http.StatusAccepted)
	enc := json.NewEncoder(w)
	if err := enc.Encode(acc); err != nil {
		return true
	}
	if err := http.NewResponseController(w).Flush(); err != nil {
		s.log.Warn().Err(err).Str("exec_id", id).Msg("cannot flush the accepted exec before waiting")
	}
	e, err := s.awaitExecFrom(r, wk.Namespace, id, wait, 0, true, first)
	if err != nil {
		return true // the client carries on with RouteGetExec
	}
	view, err := s.execView(r, e, 0)
	if err != nil {
		s.log.Error().Err(err).Str("exec_id", id).Msg("exec snapshot after submission")
		return true
	}
	_ = enc.Encode(view)
	return true
}

func (s *Server) handleWorkerExec(w http.ResponseWriter, r *http.Request) {
	if wk, ok := s.byWorkerID(r); ok {
		// Addressed by id: the enqueue finds the worker and tells what
		// the answer shows of it, with no read first. An id that names
		// no worker of the namespace may still be a label (or name
		// nothing): that goes the way of every label, below.
		req, err := readExecRequest(w, r)
		if err != nil {
			writeOperatorError(w, err)
			return
		}
		if s.submitExec(w, r, wk, req, nil) {
			return
		}
		s.execByLabel(w, r, req)
		return
	}
	wk, err := s.resolveWorker(r)
	var req operatorapi.ExecRequest
	if err == nil {
		req, err = readExecRequest(w, r)
	}
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	s.submitExec(w, r, wk, req, nil)
}

// execByLabel submits req for the worker the path names, read first.
func (s *Server) execByLabel(w http.ResponseWriter, r *http.Request, req operatorapi.ExecRequest) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	s.submitExec(w, r, wk, req, nil)
}

// byWorkerID returns the worker the request's path names when the name is
// shaped as a worker id (24 hex digits, newWorkerID), with only its id and
// namespace known (unread): the enqueue finds it and fills in the rest.
func (s *Server) byWorkerID(r *http.Request) (store.Worker, bool) {
	id := r.PathValue("id")
	if len(id) != 24 || strings.Trim(id, "0123456789abcdef") != "" {
		return store.Worker{}, false
	}
	ns, err := namespace(r)
	if err != nil {
		return store.Worker{}, false
	}
	return store.Worker{ID: id, Namespace: ns}, true
}

func (s *Server) handleQueueExec(w http.ResponseWriter, r *http.Request) {
	pick, req, err := s.queueExec(w, r)
	var wk store.Worker
	if err == nil {
		wk, err = pick(nil)
	}
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	s.submitExec(w, r, wk, req, pick)
}

// workerPicker picks the worker for a queue's exec, passing over those in
// skip.
type workerPicker func(skip map[string]bool) (store.Worker, error)

func readExecRequest(w http.ResponseWriter, r *http.Request) (operatorapi.ExecRequest, error) {
	var req operatorapi.ExecRequest
	body, err := readBody(w, r, limitCommand)
	if err != nil {
		return req, err
	}
	return req, decodeJSON(body, &req)
}

// queueExec reads an exec for a queue and returns how to pick the worker
// to run it.
func (s *Server) queueExec(w http.ResponseWriter, r *http.Request) (workerPicker, operatorapi.ExecRequest, error) {
	ns, err := namespace(r)
	if err != nil {
		return nil, operatorapi.ExecRequest{}, err
	}
	req, err := readExecRequest(w, r)
	if err != nil {
		return nil, req, err
	}
	if req.Queue == "" {
		return nil, req, badField(http.StatusBadRequest, "queue", "no queue was given: name the queue whose members may run the exec")
	}
	if _, err := s.buildExec(r, req, "check"); err != nil {
		return nil, req, err
	}
	all, err := s.listWorkers(r.Context(), ns)
	if err != nil {
		return nil, req, err
	}
	open, err := s.st.OpenExecs(r.Context(), ns)
	if err != nil {
		return nil, req, err
	}
	now := s.now()
	return func(skip map[string]bool) (store.Worker, error) {
		wk, ok := s.pickWorker(all, open, req.Queue, now, skip)
		if !ok {
			return store.Worker{}, badField(http.StatusConflict, "queue",
				"no eligible worker in queue %q: none of the %d workers in namespace %q is active, seen in the last %v, awake, a member, and free to take a job (a single-job daemon takes one)",
				req.Queue, len(all), ns, s.staleAfter)
		}
		return wk, nil
	}, req, nil
}

// pickWorker routes to the least busy eligible worker: not gone, not stale,
// active, not hibernating, not a single-job daemon that has its job, not in
// skip, and a member of queue (store.Worker.InQueue, the rule invocation
// claims follow too).
// Ties go to the most recently seen, then the smallest id.
func (s *Server) pickWorker(all []store.Worker, open map[string]int, queue string, now time.Time, skip map[string]bool) (store.Worker, bool) {
	var cands []store.Worker
	for _, w := range all {
		if s.derivedState(w, now) != operatorapi.StateActive || w.HasJob() || skip[w.ID] {
			continue
		}
		if w.HibernatingUntil != nil && w.HibernatingUntil.After(now) {
			continue
		}
		if w.InQueue(queue) {
			cands = append(cands, w)
		}
	}
	if len(cands) == 0 {
		return store.Worker{}, false
	}
	load := func(w store.Worker) int { return open[w.ID] + len(w.Running) }
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if la, lb := load(a), load(b); la != lb {
			return la < lb
		}
		if !a.LastSeenAt.Equal(b.LastSeenAt) {
			return a.LastSeenAt.After(b.LastSeenAt)
		}
		return a.ID < b.ID
	})
	return cands[0], true
}

func (s *Server) handleGetExec(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	id := r.PathValue("exec_id")
	q := r.URL.Query()
	wait, err := parseWait(q.Get("wait"), s.waitCap)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	offset := int64(0)
	if v := q.Get("offset"); v != "" {
		offset, err = strconv.ParseInt(v, 10, 64)
		if err != nil || offset < 0 {
			writeOperatorError(w, badField(http.StatusBadRequest, "offset", "must be a non-negative integer"))
			return
		}
	}
	if !validPathID(id) {
		writeOperatorError(w, badField(http.StatusNotFound, "exec_id", "no such exec"))
		return
	}
	e, err := s.awaitExec(r, ns, id, wait, offset, false)
	if err != nil {
		if r.Context().Err() == nil {
			writeOperatorError(w, err)
		}
		return
	}
	view, err := s.execView(r, e, offset)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, view)
}

// awaitExec reads exec id of namespace ns once something is there for a
// reader at offset: it has finished, or has output past offset, or wait
// has passed (or the server is closing), or, unless onlyNews, anything
// about it changed. An exec of another namespace is not found.
func (s *Server) awaitExec(r *http.Request, ns, id string, wait time.Duration, offset int64, onlyNews bool) (store.Exec, error) {
	return s.awaitExecFrom(r, ns, id, wait, offset, onlyNews, nil)
}

// subscription is a wake-up channel taken before the exec's state it
// guards was read.
type subscription struct {
	woken   <-chan struct{}
	release func()
	// end, when set, is where a result this process stores puts the
	// finished exec (waitingExecs).
	end *finishedSlot
}

// awaitExecFrom is awaitExec whose first read waits for the first news on
// first, a subscription taken when the exec was known to be queued with
// no output (nil: read at once).
func (s *Server) awaitExecFrom(r *http.Request, ns, id string, wait time.Duration, offset int64, onlyNews bool, first *subscription) (store.Exec, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	key := execStateKey(id)
	if onlyNews {
		key = execKey(id)
	}
	waited, timedOut := false, false
	if first != nil && wait > 0 {
		switch s.park(key, first.woken, first.release, timer.C, r.Context().Done()) {
		case parkOver:
			timedOut = true
		case parkGone:
			return store.Exec{}, r.Context().Err()
		}
		waited = true
		if e, ok := first.end.get(); ok && e.Namespace == ns {
			// Its result was stored here: the exec as it finished, with
			// no read.
			return e, nil
		}
	}
	for {
		woken, release := s.wake.subscribe(key)
		e, err := s.st.Exec(r.Context(), id)
		if err == nil && e.Namespace != ns {
			err = fmt.Errorf("exec in another namespace: %w", store.ErrNotFound)
		}
		if isNotFound(err) {
			release()
			return store.Exec{}, badField(http.StatusNotFound, "exec_id", "no such exec")
		}
		if err != nil {
			release()
			return store.Exec{}, err
		}
		if (waited && !onlyNews) || timedOut || wait == 0 || e.State == operatorapi.ExecFinished || e.OutputLen > offset {
			release()
			return e, nil
		}
		switch s.park(key, woken, release, timer.C, r.Context().Done()) {
		case parkOver:
			timedOut = true
		case parkGone:
			return store.Exec{}, r.Context().Err()
		}
		waited = true
	}
}

// execView is what an operator sees of e, with output from offset.
func (s *Server) execView(r *http.Request, e store.Exec, offset int64) (operatorapi.Exec, error) {
	out := operatorapi.Exec{
		ExecID: e.ID, WorkerID: e.WorkerID, Command: e.Command, State: e.State, CreatedAt: e.CreatedAt,
		Offset: offset, NextOffset: offset,
	}
	if offset < e.OutputLen {
		data, err := s.st.Output(r.Context(), e.ID, offset, outputPage)
		if err != nil {
			return out, err
		}
		out.Output = data
		out.NextOffset = offset + int64(len(data))
	}
	if e.State == operatorapi.ExecFinished && len(e.Result) > 0 {
		var res messages.ExecResult
		if err := messages.Unmarshal(e.Result, &res); err != nil {
			s.log.Error().Err(err).Str("exec_id", e.ID).Msg("stored exec result does not decode")
		} else {
			v := operatorapi.ExecResultOf(res)
			out.Result = &v
		}
	}
	return out, nil
}

// parseWait reads the wait query parameter: seconds, at most max.
func parseWait(v string, max time.Duration) (time.Duration, error) {
	if v == "" {
		return 0, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, badField(http.StatusBadRequest, "wait", "must be a non-negative number of seconds")
	}
	return min(time.Duration(math.Min(f, 1e6)*float64(time.Second)), max), nil
}

func (s *Server) handleListExecs(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	q := r.URL.Query()
	f := store.ExecFilter{Namespace: ns, WorkerID: q.Get("worker")}
	if f.WorkerID != "" && !validPathID(f.WorkerID) {
		writeOperatorError(w, badField(http.StatusBadRequest, "worker", "must be a worker id"))
		return
	}
	limit, err := queryInt(q.Get("limit"), "limit", operatorapi.DefaultListLimit, 1, operatorapi.MaxListLimit)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	f.Limit = int(limit)
	all, err := s.st.ListExecs(r.Context(), f)
	if err != nil {
		s.log.Error().Err(err).Msg("list execs")
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.ExecList{Execs: make([]operatorapi.ExecSummary, 0, len(all))}
	for _, e := range all {
		v := operatorapi.ExecSummary{ExecID: e.ID, WorkerID: e.WorkerID, Command: e.Command, State: e.State,
			CreatedAt: e.CreatedAt, StartedAt: e.StartedAt, FinishedAt: e.FinishedAt}
		if e.State == operatorapi.ExecFinished && len(e.Result) > 0 {
			var res messages.ExecResult
			if err := messages.Unmarshal(e.Result, &res); err == nil {
				v.ExitCode, v.Error = &res.ExitCode, res.Error
			}
		}
		out.Execs = append(out.Execs, v)
	}
	writeJSON(w, http.StatusOK, out)
}

// waitingExecs hands the exec a result finishes to the submission of this
// process that waits for it, so its answer needs no read of the row the
// result just wrote. Only submissions that wait are watched, from before
// the enqueue to their answer. Safe for concurrent use.
type waitingExecs struct {
	mu sync.Mutex
	m  map[string]*finishedSlot
}

// finishedSlot is one watched exec: set once it finished here.
type finishedSlot struct {
	e atomic.Pointer[store.Exec]
}

func (w *waitingExecs) watch(id string) *finishedSlot {
	slot := &finishedSlot{}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.m == nil {
		w.m = map[string]*finishedSlot{}
	}
	w.m[id] = slot
	return slot
}

func (w *waitingExecs) unwatch(id string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, id)
}

// finish gives e, just finished, to the submission watching it, if any.
func (w *waitingExecs) finish(e store.Exec) {
	w.mu.Lock()
	slot := w.m[e.ID]
	w.mu.Unlock()
	if slot != nil {
		slot.e.Store(&e)
	}
}

// get returns the finished exec, if it finished here; a nil slot has none.
func (f *finishedSlot) get() (store.Exec, bool) {
	if f == nil {
		return store.Exec{}, false
	}
	if e := f.e.Load(); e != nil {
		return *e, true
	}
	return store.Exec{}, false
}
