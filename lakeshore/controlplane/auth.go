package controlplane

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"nymph/atomicfile"
	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
)

const adminTokenFile = "admin-token"

// loadAdminToken returns the given token, else the one kept in dir, else a
// new one written there 0600 (created reports that case).
func loadAdminToken(dir, given string) (token string, created bool, err error) {
	if given = strings.TrimSpace(given); given != "" {
		return given, false, nil
	}
	path := filepath.Join(dir, adminTokenFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if t := strings.TrimSpace(string(b)); t != "" {
			return t, false, nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	token = newSecret("lsa_")
	if err := atomicfile.Write(path, []byte(token+"\n"), 0o600); err != nil {
		return "", false, fmt.Errorf("admin token: %w", err)
	}
	return token, true, nil
}

// bearer extracts the token of a single "Authorization: Bearer" header.
func bearer(r *http.Request) (string, bool) {
	vals := r.Header.Values("Authorization")
	if len(vals) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(vals[0]), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func sameSecret(a, b string) bool {
	return b != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

func hashSecret(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// adminAuth guards an operator route.
func (s *Server) adminAuth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := bearer(r)
		if !ok || !sameSecret(tok, s.adminToken) {
			closeUnread(w)
			w.Header().Set("WWW-Authenticate", `Bearer realm="lakeshore"`)
			writeJSON(w, http.StatusUnauthorized, operatorapi.Error{Error: "missing or wrong admin token", Field: "authorization"})
			return
		}
		next(w, r)
	}
}

// daemonPrincipal is who a daemon request authenticated as.
type daemonPrincipal struct {
	namespace string
	tokenID   string // the minted token of a bearer; empty otherwise
	// workerID is the worker the request may act for: the signing key's,
	// or the one its bearer is bound to. Empty for a fleet credential,
	// whose requests name their worker in the body, and for a token that
	// no hello has bound yet.
	workerID string
	// fleet: a fleet token or the shared bootstrap token. Its holders can
	// act for each other's workers (of its namespace); only a signature
	// tells daemons sharing one apart.
	fleet bool
	// key is the signing key, pending its signature, which needs the
	// body (finishSignature); both nil for a bearer.
	key     *store.Key
	pending *identity.Pending
}

type daemonHandler func(w http.ResponseWriter, r *http.Request, p daemonPrincipal)

// daemonAuth guards a daemon route with a bearer alone: the shared
// bootstrap token or a minted, unexpired, unrevoked daemon token. It runs
// before the body is read, and a refusal leaves the body unread.
func (s *Server) daemonAuth(next daemonHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.authenticateDaemon(r)
		if err != nil {
			closeUnread(w)
			s.writeBearerError(w, r, err)
			return
		}
		next(w, r, p)
	}
}

// writeBearerError answers a bearer authenticateDaemon refused.
func (s *Server) writeBearerError(w http.ResponseWriter, r *http.Request, err error) {
	var fe *fieldError
	if errors.As(err, &fe) {
		s.log.Info().Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("reason", fe.msg).Msg("daemon request refused")
		w.Header().Set("WWW-Authenticate", `Bearer realm="lakeshore"`)
	} else {
		s.log.Error().Err(err).Msg("daemon authentication failed")
	}
	writeDaemonError(w, err)
}

// closeUnread marks an answer given before the request's body was read:
// the connection is closed after it rather than drained, so a body the
// server refused is never read, however large.
func closeUnread(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
}

// tokenByHash reads a token through the token cache (caches.go).
func (s *Server) tokenByHash(ctx context.Context, hash string) (store.Token, error) {
	if t, ok := s.caches.token(hash); ok {
		return t, nil
	}
	epoch := s.caches.mark()
	t, err := s.st.TokenByHash(ctx, hash)
	if err != nil {
		return t, err
	}
	s.caches.putToken(t, epoch)
	return t, nil
}

// workerHasKey reports whether the worker has a current key (then only
// its signature speaks for it), through the cache.
func (s *Server) workerHasKey(ctx context.Context, workerID string) (bool, error) {
	if has, ok := s.caches.workerHasKey(workerID); ok {
		return has, nil
	}
	epoch := s.caches.mark()
	_, err := s.ident.keys.CurrentKey(ctx, workerID)
	switch {
	case err == nil:
		s.caches.putWorkerHasKey(workerID, true, epoch)
		return true, nil
	case isNotFound(err):
		s.caches.putWorkerHasKey(workerID, false, epoch)
		return false, nil
	}
	return false, err
}

func (s *Server) authenticateDaemon(r *http.Request) (daemonPrincipal, error) {
	unauthorized := func(reason string) error {
		return badField(http.StatusUnauthorized, "authorization", "%s", reason)
	}
	tok, ok := bearer(r)
	if !ok {
		return daemonPrincipal{}, unauthorized("missing bearer token")
	}
	if sameSecret(tok, s.daemonToken) {
		return daemonPrincipal{namespace: operatorapi.DefaultNamespace, fleet: true}, nil
	}
	if len(tok) > maxBearerLen {
		return daemonPrincipal{}, unauthorized("unknown token")
	}
	t, err := s.tokenByHash(r.Context(), hashSecret(tok))
	if errors.Is(err, store.ErrNotFound) {
		return daemonPrincipal{}, unauthorized("unknown token")
	}
	if err != nil {
		return daemonPrincipal{}, err
	}
	now := s.now()
	switch {
	case t.Kind != store.TokenDaemon:
		return daemonPrincipal{}, unauthorized("not a daemon token")
	case t.RevokedAt != nil:
		return daemonPrincipal{}, unauthorized("token revoked")
	case t.ExpiresAt != nil && !now.Before(*t.ExpiresAt):
		return daemonPrincipal{}, unauthorized("token expired")
	}
	p := daemonPrincipal{namespace: t.Namespace, tokenID: t.ID, fleet: t.Fleet}
	if !t.Fleet {
		p.workerID = t.WorkerID
	}
	return p, nil
}
