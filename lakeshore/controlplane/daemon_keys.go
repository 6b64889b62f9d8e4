package controlplane

import (
	"errors"
	"net/http"

	"nymph/identity"
	"nymph/lakeshore/store"
	"nymph/messages"
)

var keysChecks = []check{
	{path: "worker_id", required: true, kind: kNonEmpty},
	{path: "public_key", required: true, kind: kString},
	{path: "key_id", required: true, kind: kString},
}

// handleKeys is POST /v1/daemon/keys: a daemon replaces its key, signed by
// the outgoing one. A bad or missing signature is a 401 (reason logged);
// a well-signed request the server will not apply is KeysResponse.reject
// with code key_id_mismatch (public_key malformed, key_id not its id, the
// new key equal to the current one, or already enrolled). On acceptance the
// new key is current and the old one revoked in one transaction.
//
// The daemon switches keys only once it has read the acceptance, so an
// acceptance lost on the way would strand it with a revoked key. A repeat
// of the same rotation, signed by the key it replaced, is therefore
// answered with the same acceptance as long as the new key is still
// current; it changes nothing.
//
// The signature's headers and its key are checked before the body is read;
// a refusal leaves the body unread.
func (s *Server) handleKeys(w http.ResponseWriter, r *http.Request) {
	if !hasSignature(r) {
		closeUnread(w)
		s.refuse(w, r, "unsigned_key_rotation", nil)
		return
	}
	key, found, pending, err := s.beginSigned(r)
	if errors.Is(err, identity.ErrRevokedKey) && found && key.ReplacedBy != "" {
		s.repeatRotation(w, r, key, err)
		return
	}
	if err != nil {
		closeUnread(w)
		s.refuseSignature(w, r, err)
		return
	}
	body, err := readBody(w, r, limitKeys)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	if _, err := pending.Finish(r.Context(), body); err != nil {
		s.refuseSignature(w, r, err)
		return
	}
	req, err := parseKeys(body)
	if err != nil {
		s.log.Info().Err(err).Str("key_id", key.ID).Msg("key rotation refused as malformed")
		writeDaemonError(w, err)
		return
	}
	if req.WorkerID != key.WorkerID {
		s.refuse(w, r, "worker_id_not_the_keys_worker", nil)
		return
	}
	log := s.log.With().Str("worker_id", key.WorkerID).Str("key_id", key.ID).Str("new_key_id", req.KeyID).Logger()
	refuseRotation := func(msg string) {
		log.Warn().Str("message", msg).Msg("key rotation rejected")
		writeMsgpack(w, http.StatusOK, &messages.KeysResponse{Reject: &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: msg}})
	}
	pub, err := identity.ParsePublicKey(req.PublicKey)
	switch {
	case err != nil:
		refuseRotation(err.Error())
		return
	case identity.KeyID(pub) != req.KeyID:
		refuseRotation("key_id is not the id of public_key (" + identity.KeyID(pub) + ")")
		return
	case req.KeyID == key.ID:
		refuseRotation("the new key is the current key")
		return
	}
	err = s.ident.keys.RotateKey(r.Context(), key.ID, store.Key{
		ID: req.KeyID, WorkerID: key.WorkerID, Namespace: key.Namespace, PublicKey: pub, CreatedAt: s.now(),
	})
	s.announce(keysAnnouncement(key.WorkerID))
	switch {
	case errors.Is(err, store.ErrKeyExists):
		refuseRotation("the new key was enrolled before; make a fresh one")
		return
	case errors.Is(err, store.ErrKeyNotCurrent):
		s.refuse(w, r, "key_replaced_meanwhile", err)
		return
	case err != nil:
		log.Error().Err(err).Msg("key rotation: store")
		writeDaemonError(w, err)
		return
	}
	s.ident.rotating.Delete(key.ID)
	log.Info().Msg("daemon key rotated")
	writeMsgpack(w, http.StatusOK, &messages.KeysResponse{KeyID: &req.KeyID})
}

// repeatRotation answers a rotation repeated with the key it retired. Its
// headers are checked against that key before the body is read.
func (s *Server) repeatRotation(w http.ResponseWriter, r *http.Request, old store.Key, verr error) {
	pending, err := s.ident.verifier.BeginWithKey(old.PublicKey, r, s.now())
	if err != nil {
		closeUnread(w)
		s.refuse(w, r, authReason(err), err)
		return
	}
	body, err := readBody(w, r, limitKeys)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	req, err := parseKeys(body)
	if err != nil || req.KeyID != old.ReplacedBy || req.WorkerID != old.WorkerID {
		s.refuse(w, r, authReason(verr), verr)
		return
	}
	cur, err := s.ident.keys.CurrentKey(r.Context(), old.WorkerID)
	if err != nil || cur.ID != req.KeyID {
		s.refuse(w, r, authReason(verr), verr)
		return
	}
	if _, err := pending.Finish(r.Context(), body); err != nil {
		s.refuse(w, r, authReason(err), err)
		return
	}
	s.log.Info().Str("worker_id", old.WorkerID).Str("key_id", old.ID).Str("new_key_id", req.KeyID).Msg("repeated key rotation acknowledged again")
	writeMsgpack(w, http.StatusOK, &messages.KeysResponse{KeyID: &req.KeyID})
}

func parseKeys(body []byte) (messages.KeysRequest, error) {
	var req messages.KeysRequest
	return req, decodeChecked(body, keysChecks, &req)
}
