package controlplane

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"nymph/lakeshore/store"
	"nymph/messages"
)

// sessionTTLS is what hello advertises; the session token is not persisted.
const sessionTTLS = 86400

var helloChecks = []check{
	{path: "machine_id", required: true, kind: kNonEmpty},
	{path: "label", required: true, kind: kString},
	{path: "tags", required: true, kind: kStrings},
	{path: "lanes", kind: kStrings},
	{path: "capabilities", required: true, kind: kMap},
	{path: "capabilities.runners", required: true, kind: kStrings},
	{path: "capabilities.max_invocations", kind: kUint32},
	{path: "capabilities.workdir", kind: kString},
	{path: "versions", required: true, kind: kMap},
	{path: "versions.daemon", required: true, kind: kString},
	{path: "versions.protocol", required: true, kind: kString},
	{path: "public_key", kind: kString},
	{path: "incarnation", kind: kString},
}

// maxIncarnation bounds the process name a hello may carry (nymph sends a
// 26-character ULID).
const maxIncarnation = 128

func (s *Server) handleHello(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
	body, err := readBody(w, r, limitHello)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	req, versions, err := decodeHello(body)
	if err != nil {
		s.log.Info().Err(err).Msg("hello refused as malformed")
		writeDaemonError(w, err)
		return
	}
	now := s.now()
	epoch := messages.Epoch(now.Unix())
	if *req.Versions.Protocol != messages.ProtocolVersion {
		s.log.Warn().Str("machine_id", req.MachineID).Str("label", req.Label).Str("protocol", *req.Versions.Protocol).
			Msg("hello rejected: protocol mismatch")
		writeMsgpack(w, http.StatusOK, &messages.HelloResponse{
			SessionTTLS: sessionTTLS,
			Reject: &messages.Reject{Code: messages.RejectProtocolMismatch,
				Message: "this control plane speaks protocol " + messages.ProtocolVersion + ", the daemon " + strconv.Quote(*req.Versions.Protocol)},
			ServerTimeEpochS: &epoch,
		})
		return
	}
	newID := newWorkerID(now)
	welcome, keysEpoch := s.presence.expect(newID, now), s.caches.mark()
	wk, created, keyID, rej, err := s.storeHello(r.Context(), store.Hello{
		NewID:     newID,
		Namespace: p.namespace,
		MachineID: req.MachineID,
		Label:     req.Label,
		Tags:      req.Tags,
		Queues:    req.Lanes,
		Capabilities: store.Capabilities{
			Runners:        req.Capabilities.Runners,
			MaxInvocations: req.Capabilities.MaxInvocations,
			Workdir:        req.Capabilities.Workdir,
		},
		Versions:    versions,
		Incarnation: req.Incarnation,
		SingleJob:   req.SingleJob,
		Now:         now,
		// The token rules: a hello its bearer admitted binds a daemon
		// token to its worker; a keyed one has no bearer here (p names
		// neither).
		TokenID: boundTokenID(p),
		// A launched daemon's first hello takes over the row its launch
		// made (state pending), found through the token minted for it.
		Adopt: boundTokenID(p),
		Fleet: p.fleet,
	})
	// made: this hello created the worker it expected.
	made := err == nil && rej == nil && created && wk.ID == newID
	if !made {
		s.presence.drop(newID)
	}
	if err != nil {
		s.log.Error().Err(err).Str("machine_id", req.MachineID).Msg("hello: store")
		writeDaemonError(w, err)
		return
	}
	if rej != nil {
		s.helloVerdict(w, r, &req, &helloReject{*rej})
		return
	}
	// Its state, incarnation, queues or key may have changed; its token
	// may be bound now, or to it instead of a worker that was removed.
	if made {
		// Nothing here could know a worker made just now: rather than
		// forget it (changed), remember it. Its memo and whether it has a
		// key are what its first poll would read; a fleet booting
		// together sends every first poll at once.
		s.wake.publishOnly(workerKey(wk.ID))
		s.presence.welcome(wk, welcome, now)
		if has, known := createdKeyed(r, keyID); known {
			s.caches.putWorkerHasKey(wk.ID, has, keysEpoch)
		}
	} else {
		s.changed(wk.ID)
	}
	if id := boundTokenID(p); id != "" {
		s.announce(tokenAnnouncement(id))
	}
	s.log.Info().Str("worker_id", wk.ID).Str("machine_id", wk.MachineID).Str("label", wk.Label).
		Bool("created", created).Str("daemon_version", *req.Versions.Daemon).Str("incarnation", req.Incarnation).Bool("single_job", wk.SingleJob).Msg("hello")
	if !created {
		// The hello may come from a new process of this worker: what the
		// old one had received is lost now (the store tells by
		// incarnation), and whoever waits on it should hear at once.
		s.sweepLost(r.Context())
	}
	session := newULID()
	cursor := strconv.FormatInt(wk.AckedSeq, 10)
	writeMsgpack(w, http.StatusOK, &messages.HelloResponse{
		WorkerID:           &wk.ID,
		SessionToken:       &session,
		SessionTTLS:        sessionTTLS,
		Config:             map[string]any{},
		Cursor:             &cursor,
		ServerTimeEpochS:   &epoch,
		KeyID:              keyID,
		KeyRotationMaxAgeS: s.keyRotationMaxAgeS(),
		HibernateWake:      true,
	})
}

// createdKeyed says whether a worker its hello created has a key: the
// key it enrolled (keyID), none for a hello without an identity; unknown
// otherwise.
func createdKeyed(r *http.Request, keyID *string) (has, known bool) {
	hi, _ := r.Context().Value(helloIdentityCtx{}).(*helloIdentity)
	switch {
	case keyID != nil:
		return true, true
	case hi == nil:
		return false, true
	}
	return false, false
}

// decodeHello checks and decodes a hello body, and renders its versions
// as the JSON the worker row keeps.
func decodeHello(body []byte) (messages.HelloRequest, []byte, error) {
	var req messages.HelloRequest
	m, err := scanMap(body)
	if err == nil {
		err = runChecks(m, helloChecks)
	}
	// The probes are free-form (whatever a daemon found), so the versions
	// map is decoded into interface values, and its lists (gpu) into
	// structs: its cost is bounded before either decode.
	v, _ := m.Get("versions")
	if err == nil {
		err = genericBounded("versions", v)
	}
	if err == nil {
		err = decodeTyped(body, &req)
	}
	if err == nil && len(req.Incarnation) > maxIncarnation {
		err = badField(http.StatusUnprocessableEntity, "incarnation", "longer than %d bytes", maxIncarnation)
	}
	if err != nil {
		return req, nil, err
	}
	versions, err := versionsJSON(v)
	return req, versions, err
}

// versionsJSON renders a bounded versions map as JSON.
func versionsJSON(v messages.Value) ([]byte, error) {
	var m map[string]any
	if err := messages.Unmarshal(v, &m); err != nil {
		return nil, badField(http.StatusUnprocessableEntity, "versions", "not a map with string keys: %v", err)
	}
	b, err := json.Marshal(jsonSafe(m))
	if err != nil {
		return []byte("{}"), nil
	}
	return b, nil
}

// boundTokenID is the token a hello made with p binds: a minted daemon
// token that is not a fleet one.
func boundTokenID(p daemonPrincipal) string {
	if p.fleet {
		return ""
	}
	return p.tokenID
}

// errUnknownWorker is the 404 of daemon routes naming a worker that is not
// (or no longer) registered.
var errUnknownWorker = badField(http.StatusNotFound, "worker_id", "unknown worker; say hello again")

func isNotFound(err error) bool { return errors.Is(err, store.ErrNotFound) }
