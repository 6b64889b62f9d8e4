package controlplane

import (
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
	tokenID   string // empty for the shared bootstrap token
	// workerID is the worker of the key that signed the request; empty
	// for a bearer, which names no worker (the body's worker_id does).
	workerID string
}

type daemonHandler func(w http.ResponseWriter, r *http.Request, p daemonPrincipal)

// daemonAuth guards a daemon route: the shared bootstrap token or a minted,
// unexpired, unrevoked daemon token.
func (s *Server) daemonAuth(next daemonHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, err := s.authenticateDaemon(r)
		if err != nil {
			var fe *fieldError
			if errors.As(err, &fe) {
				s.log.Info().Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("reason", fe.msg).Msg("daemon request refused")
				w.Header().Set("WWW-Authenticate", `Bearer realm="lakeshore"`)
			} else {
				s.log.Error().Err(err).Msg("daemon authentication failed")
			}
			writeDaemonError(w, err)
			return
		}
		next(w, r, p)
	}
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
		return daemonPrincipal{namespace: operatorapi.DefaultNamespace}, nil
	}
	if len(tok) > 512 {
		return daemonPrincipal{}, unauthorized("unknown token")
	}
	t, err := s.st.TokenByHash(r.Context(), hashSecret(tok))
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
	return daemonPrincipal{namespace: t.Namespace, tokenID: t.ID}, nil
}
