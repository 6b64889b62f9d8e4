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

func newIdentityState(keys store.Keys, requireSigs bool, maxAge time.Duration, opts ...identity.Option) *identityState {
	return &identityState{
		verifier:    identity.NewVerifier(keyLookup{keys: keys}, opts...),
		keys:        keys,
		requireSigs: requireSigs,
		maxAge:      max(maxAge, 0),
	}
}

// keyLookup resolves key ids for the Verifier. A request that wants the
// whole key row (its worker, its namespace) puts a *keyCapture in the
// context, which saves a second read of the same row.
type keyLookup struct{ keys store.Keys }

type keyCapture struct {
	key store.Key
	ok  bool
}

type keyCaptureCtx struct{}

func (l keyLookup) LookupKey(ctx context.Context, keyID string) (ed25519.PublicKey, bool, error) {
	k, err := l.keys.Key(ctx, keyID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, identity.ErrUnknownKey
	}
	if err != nil {
		return nil, false, err
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

// verifySigned checks a signed request against its stored key and returns
// the key row. found reports whether the key id named a stored key, which
// is also true when the key is revoked (for /keys' retry path).
func (s *Server) verifySigned(r *http.Request, body []byte) (key store.Key, found bool, err error) {
	c := &keyCapture{}
	ctx := context.WithValue(r.Context(), keyCaptureCtx{}, c)
	kid, err := s.ident.verifier.Verify(ctx, r, body, s.now())
	if err != nil {
		return c.key, c.ok, err
	}
	if !c.ok || c.key.ID != kid {
		return store.Key{}, false, fmt.Errorf("key %q verified but its row was not captured", kid)
	}
	return c.key, true, nil
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

// signedAuth guards /v1/daemon/poll, /ack and /event.
//
// With any X-LS-* header the request must verify against a stored,
// unrevoked key (the body is read once, here, hashed, and handed on), and a
// worker_id in the body must be that key's worker. Without one it needs a
// valid bearer, and is refused anyway when the server requires signatures
// or when the worker it names has an enrolled key — an enrolled daemon does
// not fall back to the bearer. Every refusal is a 401 whose reason is
// logged, not sent.
func (s *Server) signedAuth(limit int64, next daemonHandler) http.HandlerFunc {
	bearerOnly := s.daemonAuth(func(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
		body, err := readBody(w, r, limit)
		if err != nil {
			writeDaemonError(w, err)
			return
		}
		if wid := bodyWorkerID(body); wid != "" {
			_, err := s.ident.keys.CurrentKey(r.Context(), wid)
			switch {
			case err == nil:
				s.refuse(w, r, "unsigned_request_from_enrolled_worker", nil)
				return
			case !isNotFound(err):
				s.log.Error().Err(err).Str("worker_id", wid).Msg("look up the worker's key")
				writeDaemonError(w, err)
				return
			}
		}
		keepBody(r, body)
		next(w, r, p)
	})
	return func(w http.ResponseWriter, r *http.Request) {
		if !hasSignature(r) {
			if s.ident.requireSigs {
				s.refuse(w, r, "signature_required", nil)
				return
			}
			bearerOnly(w, r)
			return
		}
		body, err := readBody(w, r, limit)
		if err != nil {
			writeDaemonError(w, err)
			return
		}
		key, _, err := s.verifySigned(r, body)
		if err != nil {
			if errors.Is(err, identity.ErrUnauthenticated) {
				s.refuse(w, r, authReason(err), err)
				return
			}
			s.log.Error().Err(err).Msg("verify a signed daemon request")
			writeDaemonError(w, err)
			return
		}
		if wid := bodyWorkerID(body); wid != "" && wid != key.WorkerID {
			s.refuse(w, r, "worker_id_not_the_keys_worker", fmt.Errorf("worker_id %q, key %s belongs to %s", wid, key.ID, key.WorkerID))
			return
		}
		keepBody(r, body)
		s.rotateIfOld(r, key)
		next(w, r, daemonPrincipal{namespace: key.Namespace, workerID: key.WorkerID})
	}
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
