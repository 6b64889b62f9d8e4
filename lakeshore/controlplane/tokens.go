package controlplane

import (
	"net/http"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

// Token lifetimes. An enrollment token is one-shot and short-lived by
// default; a daemon token lives until revoked unless a TTL is given.
const (
	defaultEnrollTTL = time.Hour
	maxTokenTTL      = 10 * 365 * 24 * time.Hour
)

// Secret prefixes: daemon bearer tokens and one-shot enrollment tokens.
const (
	daemonTokenPrefix = "dlt_"
	enrollTokenPrefix = "dle_"
)

// handleCreateToken mints a token and returns its secret, which is stored
// only as a sha256 and never shown again. A daemon token is minted unbound:
// the first hello made with it binds it to that hello's worker, unless it
// is a fleet token, which is never bound.
func (s *Server) handleCreateToken(w http.ResponseWriter, r *http.Request) {
	var req operatorapi.TokenRequest
	if err := readJSON(w, r, &req); err != nil {
		writeOperatorError(w, err)
		return
	}
	if req.Kind == "" {
		req.Kind = operatorapi.TokenDaemon
	}
	prefix := daemonTokenPrefix
	switch req.Kind {
	case operatorapi.TokenDaemon:
	case operatorapi.TokenEnroll:
		prefix = enrollTokenPrefix
	default:
		writeOperatorError(w, badField(http.StatusBadRequest, "kind", "must be %q or %q", operatorapi.TokenDaemon, operatorapi.TokenEnroll))
		return
	}
	ttl := time.Duration(req.TTLS) * time.Second
	if req.TTLS < 0 || ttl > maxTokenTTL || req.TTLS > int64(maxTokenTTL/time.Second) {
		writeOperatorError(w, badField(http.StatusBadRequest, "ttlS", "must be between 0 and ten years in seconds"))
		return
	}
	if len(req.Label) > 256 {
		writeOperatorError(w, badField(http.StatusBadRequest, "label", "longer than 256 bytes"))
		return
	}
	if req.Kind == operatorapi.TokenEnroll && ttl == 0 {
		ttl = defaultEnrollTTL
	}
	if req.Fleet && req.Kind != operatorapi.TokenDaemon {
		writeOperatorError(w, badField(http.StatusBadRequest, "fleet", "only a daemon token can be a fleet token"))
		return
	}
	now := s.now()
	secret := newSecret(prefix)
	t := store.Token{
		ID: newULID(), Kind: req.Kind, Namespace: operatorapi.DefaultNamespace, Label: req.Label,
		Hash: hashSecret(secret), CreatedAt: now, Fleet: req.Fleet,
	}
	if ttl > 0 {
		exp := now.Add(ttl).UTC()
		t.ExpiresAt = &exp
	}
	if err := s.st.CreateToken(r.Context(), t); err != nil {
		s.log.Error().Err(err).Msg("create token")
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("token_id", t.ID).Str("kind", t.Kind).Str("label", t.Label).Bool("fleet", t.Fleet).Msg("token minted")
	writeJSON(w, http.StatusCreated, operatorapi.TokenResponse{Token: secret, ID: t.ID, Kind: req.Kind, ExpiresAt: t.ExpiresAt, Fleet: t.Fleet})
}

func (s *Server) handleListTokens(w http.ResponseWriter, r *http.Request) {
	ts, err := s.st.ListTokens(r.Context())
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	out := operatorapi.TokenList{Tokens: make([]operatorapi.TokenInfo, 0, len(ts))}
	now := s.now()
	for _, t := range ts {
		out.Tokens = append(out.Tokens, tokenInfo(t, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// handleRevokeToken revokes a token at once: it is dropped from the token
// caches of every replica, so the next request made with it is refused.
// Revoking a revoked token answers it again.
func (s *Server) handleRevokeToken(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("token_id")
	if !validPathID(id) {
		writeOperatorError(w, badField(http.StatusNotFound, "token_id", "no such token"))
		return
	}
	t, err := s.st.RevokeToken(r.Context(), id, s.now())
	// Dropped from every replica's cache (caches.go), whatever the store
	// said: a revocation that failed half-way drops a row that is fine.
	s.announce(tokenAnnouncement(id))
	if isNotFound(err) {
		writeOperatorError(w, badField(http.StatusNotFound, "token_id", "no such token"))
		return
	}
	if err != nil {
		writeOperatorError(w, err)
		return
	}
	s.log.Info().Str("token_id", t.ID).Str("kind", t.Kind).Str("label", t.Label).Msg("token revoked")
	writeJSON(w, http.StatusOK, tokenInfo(t, s.now()))
}

// tokenInfo is what an operator sees of t at now.
func tokenInfo(t store.Token, now time.Time) operatorapi.TokenInfo {
	info := operatorapi.TokenInfo{ID: t.ID, Kind: t.Kind, Label: t.Label, State: operatorapi.TokenActive,
		CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, ConsumedAt: t.ConsumedAt, RevokedAt: t.RevokedAt,
		Fleet: t.Fleet, WorkerID: t.WorkerID}
	switch {
	case t.RevokedAt != nil:
		info.State = operatorapi.TokenRevoked
	case t.ConsumedAt != nil:
		info.State = operatorapi.TokenConsumed
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		info.State = operatorapi.TokenExpired
	}
	return info
}
