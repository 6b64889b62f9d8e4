package controlplane

import (
	"errors"
	"net/http"
	"runtime"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// enqueue stores a command for wk and wakes its long-poll. body nil is sent
// as nil (reset_backoff, rotate_key).
func (s *Server) enqueue(r *http.Request, wk store.Worker, kind string, body any, exec *store.NewExec, hibernateUntil *time.Time) (store.Command, error) {
	id := newULID()
	cmd, err := messages.EncodeCommand(id, kind, body)
	if err != nil {
		return store.Command{}, badField(http.StatusBadRequest, "body", "cannot encode the %s command: %v", kind, err)
	}
	nc := store.NewCommand{
		ID: id, WorkerID: wk.ID, Namespace: wk.Namespace, Kind: kind, Body: cmd.Body, Now: s.now(), HibernateUntil: hibernateUntil,
	}
	// An exec for a daemon whose poll is parked here goes straight to it
	// (handoff.go).
	var offer *handoff
	if kind == messages.KindExec {
		if offer = s.handoffs.claim(wk.ID); offer != nil {
			defer offer.fill(nil, 0, time.Time{})
			after := offer.after
			nc.DeliverAfter = &after
		}
	}
	c, err := s.st.Enqueue(r.Context(), nc, exec)
	handed := false
	if offer != nil {
		if handed = err == nil && c.DeliveredAt != nil; handed {
			// Queued first, as for any poll: should the answer never
			// be written (the daemon went away), the memo still has
			// the command due to the next poll.
			s.presence.queued(wk.ID)
			offer.fill([]store.Command{c}, s.presence.current(wk.ID, nc.Now), *c.DeliveredAt)
		} else {
			offer.fill(nil, 0, time.Time{})
		}
	}
	if isNotFound(err) {
		return store.Command{}, errNoSuchWorker
	}
	var held *store.SingleJobError
	if errors.As(err, &held) {
		s.log.Info().Str("worker_id", wk.ID).Str("kind", kind).Str("job", held.Job).Msg("refused: a single-job worker that has its job")
		return store.Command{}, &singleJobConflict{held: held, label: wk.Label}
	}
	if err != nil {
		s.log.Error().Err(err).Str("worker_id", wk.ID).Str("kind", kind).Msg("enqueue")
		return store.Command{}, err
	}
	if handed {
		// Queued in the memo already; the wake brings the poll its
		// answer, and the other replicas hear of the command as ever.
		s.announceQueued(wk.ID)
		// The poll's answer starts the daemon's work; this request's
		// log line and its first bytes to the operator can wait. On
		// one processor (serve --procs auto, at low load) the woken
		// poll otherwise ran only once this goroutine blocked: 0.1 ms
		// later on every back-to-back exec (perf, in turns).
		runtime.Gosched()
	} else {
		s.due(wk.ID, false)
	}
	ev := s.log.Info().Str("worker_id", wk.ID).Str("command_id", c.ID).Str("kind", kind).Int64("seq", c.Seq)
	if exec != nil {
		ev = ev.Str("exec_id", exec.ID)
	}
	ev.Msg("command queued")
	return c, nil
}

// singleJobConflict is the 409 of a job for a single-job worker that
// already has its job; it keeps the store's refusal for a caller that
// routes the job elsewhere.
type singleJobConflict struct {
	held  *store.SingleJobError
	label string
}

func (e *singleJobConflict) Error() string { return e.fieldError().Error() }

func (e *singleJobConflict) fieldError() *fieldError {
	what := "already took its job (" + e.held.Job + ")"
	if !e.held.Delivered {
		what = "already has its job queued (" + e.held.Job + ")"
	}
	return badField(http.StatusConflict, "id", "daemon %s is single-job (keep_alive_s = 0) and %s; it takes no other job",
		e.label, what)
}

// As lets writeOperatorError find the 409 (a *fieldError) in it.
func (e *singleJobConflict) As(target any) bool {
	if fe, ok := target.(**fieldError); ok {
		*fe = e.fieldError()
		return true
	}
	return false
}

// queueCommand is the shared shape of the setup/hibernate/reset/cancel
// routes: resolve the worker, decode the JSON body, build the command.
func (s *Server) queueCommand(w http.ResponseWriter, r *http.Request, kind string,
	build func(body []byte, wk store.Worker) (any, *time.Time, error)) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	body, err := readBody(w, r, limitCommand)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	cmdBody, until, err := build(body, wk)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	c, err := s.enqueue(r, wk, kind, cmdBody, nil, until)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	writeJSON(w, http.StatusAccepted, operatorapi.Queued{CommandID: c.ID, WorkerID: wk.ID, Kind: kind})
}

func (s *Server) handleSetup(w http.ResponseWriter, r *http.Request) {
	s.queueCommand(w, r, messages.KindSetup, func(body []byte, _ store.Worker) (any, *time.Time, error) {
		var req operatorapi.SetupRequest
		if err := decodeJSON(body, &req); err != nil {
			return nil, nil, err
		}
		if req.Script == "" {
			return nil, nil, badField(http.StatusBadRequest, "script", "no setup script was given: send the script's text (lakeshore daemon setup --script PATH)")
		}
		setup := &messages.Setup{Script: req.Script, Sudo: req.Sudo, RefreshCapabilities: req.RefreshCapabilities}
		if req.Name != "" {
			setup.Name = &req.Name
		}
		return setup, nil, nil
	})
}

// maxHibernate bounds a hibernate deadline to something a clock can hold.
const maxHibernate = 10 * 365 * 24 * time.Hour

func (s *Server) handleHibernate(w http.ResponseWriter, r *http.Request) {
	s.queueCommand(w, r, messages.KindHibernate, func(body []byte, _ store.Worker) (any, *time.Time, error) {
		var req operatorapi.HibernateRequest
		if err := decodeJSON(body, &req); err != nil {
			return nil, nil, err
		}
		now := s.now()
		if req.UntilEpochS == 0 {
			return nil, nil, badField(http.StatusBadRequest, "untilEpochS", "no deadline was given: send it in unix seconds (lakeshore daemon hibernate --until +30m)")
		}
		if req.UntilEpochS <= now.Unix() {
			return nil, nil, badField(http.StatusBadRequest, "untilEpochS", "deadline %s is in the past (it is now %s); give a later one",
				time.Unix(req.UntilEpochS, 0).UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		if req.UntilEpochS > now.Add(maxHibernate).Unix() {
			return nil, nil, badField(http.StatusBadRequest, "untilEpochS", "deadline is more than ten years away")
		}
		until := time.Unix(req.UntilEpochS, 0).UTC()
		return &messages.Hibernate{UntilEpochS: messages.Epoch(req.UntilEpochS)}, &until, nil
	})
}

// handleWake queues a wake: a hibernate whose deadline is now (see
// operatorapi.Woken for why that and not a new kind).
func (s *Server) handleWake(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	body, err := readBody(w, r, limitCommand)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var ignored struct{}
	if err := decodeJSON(body, &ignored); err != nil {
		writeOperatorError(w, err)
		return
	}
	now := time.Unix(s.now().Unix(), 0).UTC()
	c, err := s.enqueue(r, wk, messages.KindHibernate, &messages.Hibernate{UntilEpochS: messages.Epoch(now.Unix())}, nil, &now)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.Woken{Queued: operatorapi.Queued{CommandID: c.ID, WorkerID: wk.ID, Kind: messages.KindHibernate}}
	// The hibernation in force is the one delivered, not one the wake
	// withdrew; the store says which as it queues the wake.
	out.HibernatingUntil = c.Ends
	writeJSON(w, http.StatusAccepted, out)
}

func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	s.queueCommand(w, r, messages.KindResetBackoff, func(body []byte, _ store.Worker) (any, *time.Time, error) {
		// Any object will do; a struct takes none of its keys.
		var ignored struct{}
		return nil, nil, decodeJSON(body, &ignored)
	})
}

func (s *Server) handleCancel(w http.ResponseWriter, r *http.Request) {
	s.queueCommand(w, r, messages.KindCancel, func(body []byte, wk store.Worker) (any, *time.Time, error) {
		var req operatorapi.CancelRequest
		if err := decodeJSON(body, &req); err != nil {
			return nil, nil, err
		}
		if req.ExecID == "" && req.InvocationID == "" {
			return nil, nil, badField(http.StatusBadRequest, "execId", "one of execId or invocationId is required")
		}
		c := &messages.Cancel{}
		if req.ExecID != "" {
			if !validPathID(req.ExecID) {
				return nil, nil, badField(http.StatusNotFound, "execId", "no such exec on this worker")
			}
			e, err := s.st.Exec(r.Context(), req.ExecID)
			if isNotFound(err) || (err == nil && e.WorkerID != wk.ID) {
				return nil, nil, badField(http.StatusNotFound, "execId", "no such exec on this worker")
			}
			if err != nil {
				return nil, nil, err
			}
			c.ExecID = &req.ExecID
		}
		if req.InvocationID != "" {
			c.InvocationID = &req.InvocationID
		}
		return c, nil, nil
	})
}
