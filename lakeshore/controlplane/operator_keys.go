package controlplane

import (
	"context"
	"net/http"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// handleRotateKey queues rotate_key on a worker that has a key to rotate.
func (s *Server) handleRotateKey(w http.ResponseWriter, r *http.Request) {
	s.queueCommand(w, r, messages.KindRotateKey, func(body []byte, wk store.Worker) (any, *time.Time, error) {
		// Any object will do; a struct takes none of its keys.
		var ignored struct{}
		if err := decodeJSON(body, &ignored); err != nil {
			return nil, nil, err
		}
		_, err := s.ident.keys.CurrentKey(r.Context(), wk.ID)
		if isNotFound(err) {
			return nil, nil, badField(http.StatusConflict, "id", "daemon %s has no enrolled key to rotate", wk.ID)
		}
		return nil, nil, err
	})
}

// handleRevokeKey revokes a worker's current key, or the one named. The
// next signed request with it is refused.
func (s *Server) handleRevokeKey(w http.ResponseWriter, r *http.Request) {
	wk, err := s.resolveWorker(r)
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	var req operatorapi.RevokeKeyRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	if len(req.KeyID) > 128 {
		writeOperatorError(w, badField(http.StatusBadRequest, "keyId", "longer than 128 bytes"))
		return
	}
	k, err := s.ident.keys.RevokeKey(r.Context(), wk.ID, req.KeyID, s.now())
	s.announce(keysAnnouncement(wk.ID))
	if isNotFound(err) {
		if req.KeyID == "" {
			writeOperatorError(w, badField(http.StatusNotFound, "keyId", "daemon %s has no unrevoked key", wk.ID))
		} else {
			writeOperatorError(w, badField(http.StatusNotFound, "keyId", "daemon %s has no key %q", wk.ID, req.KeyID))
		}
		return
	}
	if err != nil {
		s.log.Error().Err(err).Str("worker_id", wk.ID).Msg("revoke key")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("worker_id", wk.ID).Str("key_id", k.ID).Msg("daemon key revoked")
	writeJSON(w, http.StatusOK, operatorapi.RevokeKeyResponse{WorkerID: wk.ID, Key: keyInfo(k)})
}

func keyInfo(k store.Key) operatorapi.KeyInfo {
	return operatorapi.KeyInfo{KeyID: k.ID, CreatedAt: k.CreatedAt, RevokedAt: k.RevokedAt}
}

// withKeys fills Worker.Keys of views from one read of the namespace's
// keys. A failed read leaves them empty and is logged: the rows are still
// worth showing.
func (s *Server) withKeys(ctx context.Context, ns string, views []operatorapi.Worker) {
	ks, err := s.ident.keys.NamespaceKeys(ctx, ns)
	if err != nil {
		s.log.Error().Err(err).Str("namespace", ns).Msg("list daemon keys")
		return
	}
	byWorker := map[string][]operatorapi.KeyInfo{}
	for _, k := range ks {
		byWorker[k.WorkerID] = append(byWorker[k.WorkerID], keyInfo(k))
	}
	for i := range views {
		if infos := byWorker[views[i].ID]; infos != nil {
			views[i].Keys = infos
		}
	}
}
