package controlplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"nymph/identity"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// identityState is the control plane's half of daemon identity: the one
// Verifier of the process (its per-key nonce windows and throttle, in front
// of the nonces committed to the store, are the replay protection, so
// hello, /keys and the guarded routes must share it) and the policy knobs.
type identityState struct {
	verifier    *identity.Verifier
	keys        store.Keys
	requireSigs bool
	maxAge      time.Duration
	// rotating holds the key ids this process already queued an age-based
	// rotate_key for, so a busy daemon does not get one per poll.
	rotating sync.Map
}

func newIdentityState(keys store.Keys, cache *caches, requireSigs bool, maxAge time.Duration, opts ...identity.Option) *identityState {
	return &identityState{
		verifier:    identity.NewVerifier(keyLookup{keys: keys, cache: cache}, opts...),
		keys:        keys,
		requireSigs: requireSigs,
		maxAge:      max(maxAge, 0),
	}
}

// keyLookup resolves key ids for the Verifier. A request that wants the
// whole key row (its worker, its namespace) puts a *keyCapture in the
// context, which saves a second read of the same row.
type keyLookup struct {
	keys  store.Keys
	cache *caches
}

type keyCapture struct {
	key store.Key
	ok  bool
}

type keyCaptureCtx struct{}

func (l keyLookup) LookupKey(ctx context.Context, keyID string) (ed25519.PublicKey, bool, error) {
	k, ok := l.cache.key(keyID)
	if !ok {
		epoch := l.cache.mark()
		var err error
		k, err = l.keys.Key(ctx, keyID)
		if errors.Is(err, store.ErrNotFound) {
			return nil, false, identity.ErrUnknownKey
		}
		if err != nil {
			return nil, false, err
		}
		l.cache.putKey(k, epoch)
	}
	if c, _ := ctx.Value(keyCaptureCtx{}).(*keyCapture); c != nil {
		c.key, c.ok = k, true
	}
	return ed25519.PublicKey(k.PublicKey), k.RevokedAt != nil, nil
}

// signatureHeaders are the four X-LS-* headers.
var signatureHeaders = [...]string{identity.HeaderKeyID, identity.HeaderTimestamp, identity.HeaderNonce, identity.HeaderSignature}

// hasSignature reports whether any signature header is present, under any
// spelling. One is enough to make the request a signed one: a partial set
// is then refused rather than treated as unsigned.
func hasSignature(r *http.Request) bool {
	for name := range r.Header {
		for _, h := range signatureHeaders {
			if strings.EqualFold(name, h) {
				return true
			}
		}
	}
	return false
}

// beginSigned checks a signed request's headers and the stored key they
// name, before its body is read, and returns the key row. found reports
// whether the key id named a stored key, which is also true when the key
// is revoked (for /keys' retry path). The signature itself is checked by
// the Pending's Finish, once the body is read.
func (s *Server) beginSigned(r *http.Request) (key store.Key, found bool, pending *identity.Pending, err error) {
	c := &keyCapture{}
	ctx := context.WithValue(r.Context(), keyCaptureCtx{}, c)
	pending, err = s.ident.verifier.Begin(ctx, r, s.now())
	if err != nil {
		return c.key, c.ok, nil, err
	}
	if !c.ok || c.key.ID != pending.KeyID() {
		return store.Key{}, false, nil, fmt.Errorf("key %q looked up but its row was not captured", pending.KeyID())
	}
	return c.key, true, pending, nil
}

// authReason names why identity refused a request, for the log only.
func authReason(err error) string {
	for _, r := range []struct {
		err  error
		name string
	}{
		{identity.ErrMissingHeader, "missing_header"},
		{identity.ErrDuplicateHeader, "duplicate_header"},
		{identity.ErrMalformedHeader, "malformed_header"},
		{identity.ErrSkew, "clock_skew"},
		{identity.ErrBadSignatureEncoding, "bad_signature_encoding"},
		{identity.ErrUnknownKey, "unknown_key"},
		{identity.ErrRevokedKey, "revoked_key"},
		{identity.ErrBadSignature, "bad_signature"},
		{identity.ErrReplay, "replay"},
		{identity.ErrKeyIDMismatch, "key_id_mismatch"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return "unauthenticated"
}

// refuse answers 401 with a body that says nothing about why; the reason
// goes to the log.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, reason string, err error) {
	ev := s.log.Info().Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("reason", reason)
	if kid := r.Header.Get(identity.HeaderKeyID); kid != "" && len(kid) <= 128 {
		ev = ev.Str("key_id", kid)
	}
	if err != nil {
		ev = ev.Err(err)
	}
	ev.Msg("daemon request refused")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = io.WriteString(w, "unauthorized\n")
}

// bodyWorkerID returns the worker_id of a msgpack map body, "" when there
// is none (or the body is not a map; the route reports that itself). It
// reads the bytes in place.
func bodyWorkerID(body []byte) string {
	m, err := messages.ScanValue(body)
	if err != nil {
		return ""
	}
	return strField(m, "worker_id")
}

// signedAuth guards the daemon routes that name their worker in the body:
// /v1/daemon/poll, /ack, /event, /result-chunk and the daemon's presign.
//
// Before the body is read (authorizeDaemon): with any X-LS-* header the
// headers and the stored, unrevoked key they name; without, a valid bearer
// that a hello has bound to a worker, or a fleet one (a token no hello has
// bound yet is a 403: a daemon says hello first). Then the body is read
// under limit, the signature checked against it, and a worker_id in the
// body must be the one the credential acts for (actsFor).
func (s *Server) signedAuth(limit int64, next daemonHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, ok := s.authorizeDaemon(w, r)
		if !ok {
			return
		}
		if p.key == nil && !p.fleet && p.workerID == "" {
			closeUnread(w)
			s.log.Info().Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("token_id", p.tokenID).Msg("daemon request refused: token not bound yet")
			writeDaemonError(w, badField(http.StatusForbidden, "authorization",
				"this token is not bound to a worker yet: a daemon says hello with it first"))
			return
		}
		body, err := readBody(w, r, limit)
		if err != nil {
			writeDaemonError(w, err)
			return
		}
		if !s.finishSignature(w, r, p, body) || !s.actsFor(w, r, p, bodyWorkerID(body)) {
			return
		}
		keepBody(r, body)
		if p.key != nil {
			s.rotateIfOld(r, *p.key)
		}
		next(w, r, p)
	}
}

// authorizeDaemon checks a daemon request's credential from its headers
// alone, before its body is read: with any X-LS-* header, the signature
// headers and the stored, unrevoked key they name; without one, a valid
// bearer, unless the server requires signatures. A refusal is answered
// here, the body unread: a 401 whose reason is logged, not sent (or a 503
// when the store failed).
func (s *Server) authorizeDaemon(w http.ResponseWriter, r *http.Request) (daemonPrincipal, bool) {
	if hasSignature(r) {
		key, _, pending, err := s.beginSigned(r)
		if err != nil {
			closeUnread(w)
			s.refuseSignature(w, r, err)
			return daemonPrincipal{}, false
		}
		return daemonPrincipal{namespace: key.Namespace, workerID: key.WorkerID, key: &key, pending: pending}, true
	}
	if s.ident.requireSigs {
		closeUnread(w)
		s.refuse(w, r, "signature_required", nil)
		return daemonPrincipal{}, false
	}
	p, err := s.authenticateDaemon(r)
	if err != nil {
		closeUnread(w)
		s.writeBearerError(w, r, err)
		return daemonPrincipal{}, false
	}
	return p, true
}

// refuseSignature answers a signature the verifier refused (401), or a
// verification the store failed (503).
func (s *Server) refuseSignature(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, identity.ErrUnauthenticated) {
		s.refuse(w, r, authReason(err), err)
		return
	}
	if errors.Is(err, identity.ErrThrottled) {
		// A key sending faster than any daemon would: its own 429, no
		// fault of ours.
		s.log.Info().Err(err).Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Msg("daemon request throttled")
		writeDaemonError(w, err)
		return
	}
	s.log.Error().Err(err).Msg("verify a signed daemon request")
	writeDaemonError(w, err)
}

// finishSignature checks p's signature against the body that was read;
// a bearer has none to check.
func (s *Server) finishSignature(w http.ResponseWriter, r *http.Request, p daemonPrincipal, body []byte) bool {
	if p.pending == nil {
		return true
	}
	if _, err := p.pending.Finish(r.Context(), body); err != nil {
		s.refuseSignature(w, r, err)
		return false
	}
	return true
}

// actsFor checks that p may speak for worker wid, named in a body. A key
// speaks for its worker only (else 401, as before). A bearer bound to a
// worker speaks for that one only: otherwise poll answers 403, which a
// daemon never meets (its hello binds its token to the worker it then
// polls as), and the routes whose posts the daemon keeps and retries on
// 401 and 403 answer 404, final: a daemon whose worker row was deleted and
// made again may still hold results addressed to the old one. A fleet
// credential may name any worker. No bearer speaks for a worker with an
// enrolled key: an enrolled daemon signs (401).
func (s *Server) actsFor(w http.ResponseWriter, r *http.Request, p daemonPrincipal, wid string) bool {
	if wid == "" {
		return true
	}
	if p.key != nil {
		if wid != p.key.WorkerID {
			s.refuse(w, r, "worker_id_not_the_keys_worker", fmt.Errorf("worker_id %q, key %s belongs to %s", wid, p.key.ID, p.key.WorkerID))
			return false
		}
		return true
	}
	if !p.fleet && wid != p.workerID {
		status := http.StatusNotFound
		if r.Pattern == routePoll {
			status = http.StatusForbidden
		}
		s.log.Info().Str("route", r.URL.Path).Str("remote", r.RemoteAddr).Str("token_id", p.tokenID).
			Str("worker_id", wid).Str("bound_to", p.workerID).Msg("daemon request refused: token bound to another worker")
		writeDaemonError(w, badField(status, "worker_id", "not the worker this token is bound to"))
		return false
	}
	has, err := s.workerHasKey(r.Context(), wid)
	switch {
	case err != nil:
		s.log.Error().Err(err).Str("worker_id", wid).Msg("look up the worker's key")
		writeDaemonError(w, err)
		return false
	case has:
		s.refuse(w, r, "unsigned_request_from_enrolled_worker", nil)
		return false
	}
	return true
}

// rotateIfOld queues a rotate_key for a key older than the configured
// maximum age, once per key and process, and not when one is already
// waiting in the worker's queue.
func (s *Server) rotateIfOld(r *http.Request, key store.Key) {
	if s.ident.maxAge <= 0 || s.now().Sub(key.CreatedAt) < s.ident.maxAge {
		return
	}
	if _, queued := s.ident.rotating.LoadOrStore(key.ID, struct{}{}); queued {
		return
	}
	cmds, err := s.st.ListCommands(r.Context(), key.WorkerID)
	if err != nil {
		s.ident.rotating.Delete(key.ID)
		s.log.Error().Err(err).Str("worker_id", key.WorkerID).Msg("list commands before an age rotation")
		return
	}
	for _, c := range cmds {
		if c.Kind == messages.KindRotateKey && c.AckedAt == nil {
			return
		}
	}
	if _, err := s.enqueue(r, store.Worker{ID: key.WorkerID}, messages.KindRotateKey, nil, nil, nil); err != nil {
		s.ident.rotating.Delete(key.ID)
		return
	}
	s.log.Info().Str("worker_id", key.WorkerID).Str("key_id", key.ID).Time("key_created_at", key.CreatedAt).
		Dur("max_age", s.ident.maxAge).Msg("key rotation queued: key too old")
}

// keyRotationMaxAgeS is what hello advertises.
func (s *Server) keyRotationMaxAgeS() uint64 {
	return uint64(s.ident.maxAge / time.Second)
}
