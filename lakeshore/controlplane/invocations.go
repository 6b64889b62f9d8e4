package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// Function invocations: operators submit them to a queue; a daemon polling
// a matching queue and advertising the runner claims them at poll time
// (store.ClaimInvocations, one transaction) and receives them as run
// commands through its command queue and cursor, so an abandoned poll loses
// nothing; its ack finishes them. An invocation whose daemon is lost
// (restarted, stale, removed, gone, or no longer reporting it) is failed
// with WorkerLost (see lost.go).

// limitSubmit admits base64 args of up to messages.MaxPayload bytes plus
// the rest of the request; larger args are refused as 413 after decoding.
const limitSubmit = (messages.MaxPayload+2)/3*4 + 1<<20

// maxScript bounds a script submitted inline.
const maxScript = 1 << 20

var (
	invQueueRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$`) })
	pyDottedRe = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$`)
	})
	userNameRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$`) })
)

// scriptModule names the function of a script invocation, as "_setup"
// names a setup's.
const scriptModule = "_script"

func invocationKey(id string) string { return "i:" + id }

// submission is a validated InvocationRequest.
type submission struct {
	queue    string
	runner   string
	function messages.FunctionRef
	config   messages.RunConfig
	script   *string
	asUser   *string
	parent   *string
	root     *string
	args     []byte
	argsKey  string
}

// validateInvocation checks an operator's request and names the field at
// fault.
func validateInvocation(req operatorapi.InvocationRequest) (submission, error) {
	sub := submission{queue: req.Queue, config: req.RunConfig.Wire(), args: req.Args, argsKey: req.ArgsKey}
	if sub.queue == "" {
		sub.queue = operatorapi.DefaultQueue
	}
	if !invQueueRe().MatchString(sub.queue) {
		return sub, badField(http.StatusBadRequest, "queue",
			"%q must start with a letter or digit and contain only letters, digits and . _ : / - (at most 128); a '*' belongs on the daemon's side", sub.queue)
	}
	if r := sub.config.Runner; r != nil && *r != "" {
		if !slices.Contains(messages.RunnerKinds, *r) {
			return sub, badField(http.StatusBadRequest, "runConfig.runner", "unknown runner kind %q; want one of %s",
				*r, strings.Join(messages.RunnerKinds, ", "))
		}
		sub.runner = *r
	} else {
		sub.config.Runner = nil
	}
	if img := sub.config.Image; img != "" && (len(img) > 512 || strings.IndexFunc(img, badImageRune) >= 0) {
		return sub, badField(http.StatusBadRequest, "runConfig.image", "must be an image reference without spaces or control characters (at most 512)")
	}
	if sub.runner == "docker" && sub.config.Image == "" {
		return sub, badField(http.StatusBadRequest, "runConfig.image", "runConfig.image is required for the docker runner")
	}
	if t := sub.config.TimeoutS; math.IsNaN(t) || t < 0 || t > 365*24*3600 {
		return sub, badField(http.StatusBadRequest, "runConfig.timeoutS", "must be between 0 (none) and one year in seconds")
	}
	for k, v := range sub.config.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return sub, badField(http.StatusBadRequest, "runConfig.env", "variable %q: names must be non-empty without '=' or NUL, values without NUL", k)
		}
	}
	if len(sub.config.Env) == 0 {
		sub.config.Env = nil
	}
	if wd := sub.config.Workdir; len(wd) > 4096 || strings.ContainsRune(wd, 0) {
		return sub, badField(http.StatusBadRequest, "runConfig.workdir", "must be a path without NUL (at most 4096 bytes)")
	}

	switch {
	case req.Function != "" && req.Script != "":
		return sub, badField(http.StatusBadRequest, "script", "give either function or script, not both")
	case req.Script != "":
		if len(req.Script) > maxScript {
			return sub, badField(http.StatusRequestEntityTooLarge, "script", "larger than %d bytes", maxScript)
		}
		script := req.Script
		sub.script = &script
		sub.function = messages.FunctionRef{Module: scriptModule, Qualname: "script"}
	case req.Function != "":
		fn, err := parseFunction(req.Function, sub.runner)
		if err != nil {
			return sub, err
		}
		sub.function = fn
	default:
		return sub, badField(http.StatusBadRequest, "function", `missing: give function ("module:qualname") or script`)
	}

	if u := req.AsUser; u != "" {
		if !userNameRe().MatchString(u) {
			return sub, badField(http.StatusBadRequest, "asUser", "%q is not a user name", u)
		}
		sub.asUser = &u
	}
	for _, f := range []struct {
		name string
		v    string
		dst  **string
	}{{"parentInvocationId", req.ParentInvocationID, &sub.parent}, {"rootInvocationId", req.RootInvocationID, &sub.root}} {
		if f.v == "" {
			continue
		}
		if !validPathID(f.v) {
			return sub, badField(http.StatusBadRequest, f.name, "must be 1-128 letters, digits, '.', '_', ':' or '-'")
		}
		v := f.v
		*f.dst = &v
	}
	if len(req.Args) > messages.MaxPayload {
		return sub, badField(http.StatusRequestEntityTooLarge, "args", "%d bytes is over the %d byte payload limit", len(req.Args), messages.MaxPayload)
	}
	if req.ArgsKey != "" {
		if len(req.Args) > 0 {
			return sub, badField(http.StatusBadRequest, "argsKey", "give either args or argsKey, not both")
		}
		if !payloadKeyRe().MatchString(req.ArgsKey) {
			return sub, badField(http.StatusBadRequest, "argsKey", "not a payload key")
		}
	}
	return sub, nil
}

func badImageRune(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }

// parseFunction reads "module:qualname". The python runner wants dotted
// identifiers on both sides; the others take the module as a command and
// the qualname as its argument, and accept a bare module.
func parseFunction(s, runner string) (messages.FunctionRef, error) {
	const field = "function"
	if len(s) > 1024 || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return messages.FunctionRef{}, badField(http.StatusBadRequest, field, "must be at most 1024 characters without control characters")
	}
	module, qualname, colon := strings.Cut(s, ":")
	bareOK := runner != "" && runner != "python"
	switch {
	case !colon && !bareOK:
		return messages.FunctionRef{}, badField(http.StatusBadRequest, field, `%q is not "module:qualname"`, s)
	case strings.TrimSpace(module) == "" || module != strings.TrimSpace(module):
		return messages.FunctionRef{}, badField(http.StatusBadRequest, field, `%q: the module before ':' is empty or padded with spaces`, s)
	case colon && !bareOK && qualname == "":
		return messages.FunctionRef{}, badField(http.StatusBadRequest, field, `%q: the qualname after ':' is empty`, s)
	}
	if runner == "python" && (!pyDottedRe().MatchString(module) || !pyDottedRe().MatchString(qualname)) {
		return messages.FunctionRef{}, badField(http.StatusBadRequest, field,
			`%q: the python runner wants "package.module:Name.attr" with Python identifiers`, s)
	}
	return messages.FunctionRef{Module: module, Qualname: qualname}, nil
}

func (s *Server) handleSubmitInvocation(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	if r.ContentLength > limitSubmit {
		writeOperatorError(w, badField(http.StatusRequestEntityTooLarge, "body",
			"%d bytes is more than args of the %d byte payload limit can take", r.ContentLength, messages.MaxPayload))
		return
	}
	body, err := readBody(w, r, limitSubmit)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.InvocationRequest
	if err := decodeJSON(body, &req); err != nil {
		var fe *fieldError
		if errors.As(err, &fe) && fe.field == "body" && strings.Contains(fe.msg, "base64") {
			err = badField(http.StatusBadRequest, "args", "must be base64: %s", fe.msg)
		}
		writeOperatorError(w, err)
		return
	}
	sub, err := validateInvocation(req)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	id := newULID()
	run := &messages.Run{
		InvocationID: id, Function: sub.function, RunConfig: sub.config, ArgsBlob: messages.Bytes{},
		ParentInvocationID: sub.parent, RootInvocationID: sub.root, Script: sub.script, AsUser: sub.asUser,
	}
	argsSize := int64(len(sub.args))
	switch {
	case sub.argsKey != "":
		m, err := s.payloads.stat(r.Context(), ns, sub.argsKey)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) && fe.status == http.StatusNotFound {
				err = badField(http.StatusBadRequest, "argsKey", "no payload %q in namespace %q; upload it first", sub.argsKey, ns)
			}
			writeOperatorError(w, err)
			return
		}
		run.PayloadRef = &messages.PayloadRef{Bucket: operatorapi.PayloadBucket, Key: sub.argsKey, Size: uint64(m.Size), ContentType: m.ContentType}
		if m.SHA256 != "" {
			sum := m.SHA256
			run.PayloadRef.SHA256 = &sum
		}
		argsSize = m.Size
	case len(sub.args) > messages.InlineThreshold:
		sub.argsKey = "args-" + strings.ToLower(id)
		ref, err := s.storeArgs(r.Context(), ns, sub.argsKey, id, sub.args)
		if err != nil {
			s.log.Error().Err(err).Str("invocation_id", id).Msg("storing large args")
			writeOperatorError(w, err)
			return
		}
		run.PayloadRef = ref
		sub.args = nil
	default:
		run.ArgsBlob = messages.Bytes(sub.args)
	}
	cmd, err := messages.EncodeCommand(id, messages.KindRun, run)
	if err != nil {
		writeOperatorError(w, badField(http.StatusBadRequest, "body", "cannot encode the run command: %v", err))
		return
	}
	rc, _ := json.Marshal(sub.config)
	now := s.now()
	inv, err := s.st.CreateInvocation(r.Context(), store.NewInvocation{
		ID: id, Namespace: ns, Queue: sub.queue, Module: sub.function.Module, Qualname: sub.function.Qualname,
		Runner: sub.runner, RunConfig: rc, Args: nonNilArgs(sub.args, sub.argsKey), ArgsKey: sub.argsKey, ArgsSize: argsSize,
		Script: sub.script, AsUser: sub.asUser, ParentInvocationID: sub.parent, RootInvocationID: sub.root,
		RunBody: cmd.Body, Now: now,
	})
	if err != nil {
		s.log.Error().Err(err).Str("invocation_id", id).Msg("create invocation")
		writeOperatorError(w, err)
		return
	}
	eligible := s.wakeEligible(r.Context(), ns, sub.queue, sub.runner, now)
	s.log.Info().Str("invocation_id", id).Str("namespace", ns).Str("queue", sub.queue).Str("runner", sub.runner).
		Str("function", sub.function.Module+":"+sub.function.Qualname).Int64("args_size", argsSize).
		Bool("payload_ref", run.PayloadRef != nil).Int("eligible_workers", eligible).Msg("invocation queued")
	writeJSON(w, http.StatusCreated, operatorapi.InvocationSubmitted{Invocation: invocationView(inv, false), EligibleWorkers: eligible})
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

func nonNilArgs(args []byte, key string) []byte {
	if key != "" {
		return nil
	}
	if args == nil {
		return []byte{}
	}
	return args
}

// canTake mirrors the eligibility ClaimInvocations applies, for waking
// parked polls and for telling the operator whether anyone will take it.
func (s *Server) canTake(w store.Worker, queue, runner string, now time.Time) bool {
	if s.derivedState(w, now) != operatorapi.StateActive || len(w.Capabilities.Runners) == 0 {
		return false
	}
	if w.HibernatingUntil != nil && w.HibernatingUntil.After(now) {
		return false
	}
	if runner != "" && !slices.Contains(w.Capabilities.Runners, runner) {
		return false
	}
	return w.InQueue(queue)
}

// wakeEligible wakes the parked polls of every worker that could take an
// invocation of queue and runner, and counts them.
func (s *Server) wakeEligible(ctx context.Context, ns, queue, runner string, now time.Time) int {
	all, err := s.listWorkers(ctx, ns)
	if err != nil {
		s.log.Error().Err(err).Msg("listing workers to wake")
		return 0
	}
	n := 0
	for _, w := range all {
		if s.canTake(w, queue, runner, now) {
			n++
			s.due(w.ID, true)
		}
	}
	return n
}

// dispatch claims what the polling worker can take; the run commands then
// go out with the poll's batch. It returns how many it claimed, and ok
// false when the claim failed.
func (s *Server) dispatch(ctx context.Context, workerID string, log zerolog.Logger) (n int, ok bool) {
	invs, err := s.st.ClaimInvocations(ctx, store.Claim{WorkerID: workerID, Limit: pollBatch, Now: s.now(), NewID: newULID})
	if err != nil {
		if !isNotFound(err) && ctx.Err() == nil {
			log.Error().Err(err).Msg("claiming invocations")
		}
		return 0, false
	}
	for _, inv := range invs {
		s.wake.broadcast(invocationKey(inv.ID))
		log.Info().Str("invocation_id", inv.ID).Str("queue", inv.Queue).Str("command_id", inv.CommandID).Msg("invocation dispatched")
	}
	if len(invs) > 0 {
		// Their run commands are new to the memos of this worker the
		// other replicas keep.
		s.wake.publishOnly(workerKey(workerID))
	}
	return len(invs), true
}

// reportRunning records a poll's invocation statuses and fails what the
// worker has stopped reporting for longer than the stale window. It
// returns how many invocations the store has running on the worker (ok
// false: unknown, the store failed).
func (s *Server) reportRunning(ctx context.Context, workerID string, running []store.InvocationStatus, log zerolog.Logger) (n int, ok bool) {
	lost, n, err := s.st.ReportRunning(ctx, store.RunningReport{WorkerID: workerID, Statuses: running, Now: s.now(), MissingGrace: s.staleAfter})
	if err != nil {
		if ctx.Err() == nil {
			log.Error().Err(err).Msg("recording invocation statuses")
		}
		return 0, false
	}
	for _, l := range lost {
		s.failLost(ctx, l)
	}
	return n, true
}

// invocationView turns a row into the operator's view.
func invocationView(inv store.Invocation, withResult bool) operatorapi.Invocation {
	v := operatorapi.Invocation{
		ID: inv.ID, Namespace: inv.Namespace, Queue: inv.Queue,
		Function: messages.FunctionRef{Module: inv.Module, Qualname: inv.Qualname},
		ArgsSize: inv.ArgsSize, ArgsKey: inv.ArgsKey, State: inv.State,
		WorkerID: inv.WorkerID, WorkerLabel: inv.WorkerLabel,
		CreatedAt: inv.CreatedAt, StartedAt: inv.StartedAt, FinishedAt: inv.FinishedAt,
		ResultSize: inv.ResultSize, StdoutTail: inv.StdoutTail,
	}
	if inv.Script != nil {
		v.Script = *inv.Script
	}
	if inv.AsUser != nil {
		v.AsUser = *inv.AsUser
	}
	if inv.ParentInvocationID != nil {
		v.ParentInvocationID = *inv.ParentInvocationID
	}
	if inv.RootInvocationID != nil {
		v.RootInvocationID = *inv.RootInvocationID
	}
	var rc messages.RunConfig
	_ = json.Unmarshal(inv.RunConfig, &rc)
	v.RunConfig = operatorapi.RunConfigOf(rc)
	if len(inv.Error) > 0 {
		var e messages.AckError
		if json.Unmarshal(inv.Error, &e) == nil {
			v.Error = &e
		}
	}
	if withResult && inv.State == operatorapi.InvocationSucceeded {
		v.Result = inv.Result
		if v.Result == nil {
			v.Result = []byte{}
		}
	}
	return v
}

var errNoSuchInvocation = badField(http.StatusNotFound, "inv_id", "no such invocation")

func (s *Server) handleGetInvocation(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	id := r.PathValue("inv_id")
	wait, err := parseWait(r.URL.Query().Get("wait"), min(s.waitCap, operatorapi.MaxWait))
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	if !validPathID(id) {
		writeOperatorError(w, errNoSuchInvocation)
		return
	}
	s.sweepLostInvocations(r.Context())
	timer := time.NewTimer(wait)
	defer timer.Stop()
	first := ""
	for {
		woken, release := s.wake.subscribe(invocationKey(id))
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
		if first == "" {
			first = inv.State
		}
		if wait == 0 || inv.State != first || operatorapi.InvocationTerminal(inv.State) {
			release()
			writeJSON(w, http.StatusOK, invocationView(inv, true))
			return
		}
		switch s.park(invocationKey(id), woken, release, timer.C, r.Context().Done()) {
		case parkOver:
			wait = 0
		case parkGone:
			return
		}
	}
}

func (s *Server) handleListInvocations(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	q := r.URL.Query()
	f := store.InvocationFilter{Namespace: ns, State: q.Get("state"), Queue: q.Get("queue"), Limit: operatorapi.DefaultListLimit}
	switch f.State {
	case "", operatorapi.InvocationQueued, operatorapi.InvocationRunning, operatorapi.InvocationSucceeded,
		operatorapi.InvocationFailed, operatorapi.InvocationKilled, operatorapi.InvocationCancelled:
	default:
		writeOperatorError(w, badField(http.StatusBadRequest, "state", "must be one of queued, running, succeeded, failed, killed, cancelled"))
		return
	}
	if len(f.Queue) > 256 {
		writeOperatorError(w, badField(http.StatusBadRequest, "queue", "longer than 256 bytes"))
		return
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > operatorapi.MaxListLimit {
			writeOperatorError(w, badField(http.StatusBadRequest, "limit", "must be an integer from 1 to %d", operatorapi.MaxListLimit))
			return
		}
		f.Limit = n
	}
	s.sweepLostInvocations(r.Context())
	all, err := s.st.ListInvocations(r.Context(), f)
	if err != nil {
		s.log.Error().Err(err).Msg("list invocations")
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.InvocationList{Invocations: make([]operatorapi.Invocation, 0, len(all))}
	for _, inv := range all {
		out.Invocations = append(out.Invocations, invocationView(inv, false))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) handleCancelInvocation(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	id := r.PathValue("inv_id")
	if !validPathID(id) {
		writeOperatorError(w, errNoSuchInvocation)
		return
	}
	if _, err := readBody(w, r, limitSmall); err != nil {
		writeOperatorError(w, err)
		return
	}
	errJSON, _ := json.Marshal(messages.AckError{Type: operatorapi.ErrorTypeCancelled, Message: "cancelled by an operator before a daemon started it"})
	inv, cancelled, err := s.st.CancelInvocation(r.Context(), ns, id, errJSON, s.now())
	if isNotFound(err) {
		writeOperatorError(w, errNoSuchInvocation)
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("invocation_id", id).Msg("cancel invocation")
		writeOperatorError(w, err)
		return
	}
	if cancelled {
		s.wake.broadcast(invocationKey(id))
		s.metrics.observeInvocation(inv)
		s.log.Info().Str("invocation_id", id).Msg("invocation cancelled before dispatch")
		writeJSON(w, http.StatusOK, operatorapi.CancelInvocationResponse{Invocation: invocationView(inv, true), Cancelled: true})
		return
	}
	if inv.State != operatorapi.InvocationRunning {
		writeOperatorError(w, badField(http.StatusConflict, "inv_id", "invocation %s is already %s", id, inv.State))
		return
	}
	c, err := s.enqueue(r, store.Worker{ID: inv.WorkerID}, messages.KindCancel, &messages.Cancel{InvocationID: &inv.ID}, nil, nil)
	if errors.Is(err, errNoSuchWorker) {
		s.failLost(r.Context(), store.LostInvocation{ID: inv.ID, Namespace: inv.Namespace, WorkerID: inv.WorkerID,
			WorkerLabel: inv.WorkerLabel, Reason: store.LostRemoved})
		if cur, err := s.st.Invocation(r.Context(), ns, id); err == nil {
			inv = cur
		}
		writeJSON(w, http.StatusOK, operatorapi.CancelInvocationResponse{Invocation: invocationView(inv, true)})
		return
	}
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("invocation_id", id).Str("worker_id", inv.WorkerID).Str("command_id", c.ID).Msg("cancel sent to the daemon")
	writeJSON(w, http.StatusAccepted, operatorapi.CancelInvocationResponse{Invocation: invocationView(inv, true), CommandID: c.ID})
}

func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }
