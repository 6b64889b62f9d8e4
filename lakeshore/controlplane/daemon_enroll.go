package controlplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// How a hello is admitted, and which refusal each path produces (HTTP 200
// with reject{code, message}, except where a 401 or 422 is named). "Signed"
// means at least one X-LS-* header is present; "key" is the key the
// X-LS-Key-Id header names; "dle_" is an enrollment token as the bearer;
// "public_key" is HelloRequest.public_key.
//
// Signed, and the key is stored and current (Verifier.Verify succeeds):
// a re-hello. No token is needed and a dle_ bearer is ignored, not consumed.
//   - public_key present but not that key ........... key_id_mismatch
//   - the key belongs to another worker (other machine_id/label or
//     namespace), or its worker row is gone and the hello's worker has a
//     different current key ........................... key_id_mismatch
//   - otherwise accepted; a key whose worker row was deleted moves to the
//     row the hello re-creates.
//
// With a dle_ bearer, not a re-hello: enrollment, checked in this order.
//   - token unknown, revoked, or not an enrollment token  invalid_enroll_token
//   - token already consumed ........................... enroll_token_consumed
//   - token past its expiry ............................ enroll_token_expired
//   - no public_key, no X-LS-* header, or some X-LS-* header missing
//     .................................................. enroll_signature_required
//   - public_key malformed, or X-LS-Key-Id ≠ KeyID(public_key)  key_id_mismatch
//   - signature malformed, wrong length, outside the clock skew,
//     replayed, or not verifying ........................ enroll_signature_invalid
//   - the key was enrolled before and is revoked (a revoked key never
//     comes back; the daemon must make a new one) ....... enroll_signature_invalid
//   - the key is current for another worker ............ key_id_mismatch
//   - otherwise the token is consumed (atomically: of two hellos racing
//     with one token, the loser gets enroll_token_consumed), the key becomes
//     the worker's current key (replacing any previous one) and key_id is
//     returned.
//
// Signed, no dle_ bearer, and Verify fails:
//   - the key is unknown or revoked ................... enroll_token_required
//   - any other signature failure ..................... enroll_signature_invalid
//
// Unsigned, no dle_ bearer:
//   - public_key present: the worker has a current key  enrollment_signature_required
//     else ............................................ enroll_token_required
//   - no public_key (the legacy hello): the bearer must be valid (else
//     401); then the worker having a current key, or RequireSignatures, is
//     enrollment_signature_required; otherwise the legacy hello.
//
// A body that fails validation is a 422 on the signed and dle_ paths, and
// on the others after the bearer check (401 first). protocol_mismatch is
// decided after admission, before anything is stored.

// helloIdentity is what helloAuth decided, for storeHello.
type helloIdentity struct {
	// enroll, when set, is bound to the hello's worker, consuming its token.
	enroll *enrollment
	// key, when set, signed this hello; rebindFrom is its worker when that
	// row is gone.
	key        *store.Key
	rebindFrom string
}

type enrollment struct {
	tokenID   string
	namespace string
	keyID     string
	pub       ed25519.PublicKey
}

type helloIdentityCtx struct{}

// helloReject is a refusal decided before the hello reaches the store.
type helloReject struct{ messages.Reject }

func reject(code, format string, args ...any) *helloReject {
	return &helloReject{messages.Reject{Code: code, Message: fmt.Sprintf(format, args...)}}
}

// maxBearerLen bounds a token before it is hashed and looked up.
const maxBearerLen = 512

// helloAuth admits a hello; see the table above.
func (s *Server) helloAuth(next daemonHandler) http.HandlerFunc {
	legacy := s.daemonAuth(func(w http.ResponseWriter, r *http.Request, p daemonPrincipal) {
		s.legacyHello(w, r, p, next)
	})
	return func(w http.ResponseWriter, r *http.Request) {
		tok, _ := bearer(r)
		enrollTok := strings.HasPrefix(tok, enrollTokenPrefix)
		signed := hasSignature(r)
		body, err := readBody(w, r, limitHello)
		if err != nil {
			writeDaemonError(w, err)
			return
		}
		keepBody(r, body)
		req, verr := parseHello(body)
		if verr != nil && !signed && !enrollTok {
			legacy(w, r) // 401 before 422, as on every bearer route
			return
		}
		if verr != nil {
			s.log.Info().Err(verr).Msg("hello refused as malformed")
			writeDaemonError(w, verr)
			return
		}
		if !signed && !enrollTok {
			if req.PublicKey == "" {
				legacy(w, r)
				return
			}
			s.helloVerdict(w, r, req, s.unsignedIdentityHello(r, req))
			return
		}

		var hi *helloIdentity
		var rej *helloReject
		ns := operatorapi.DefaultNamespace
		switch {
		case signed:
			key, found, err := s.verifySigned(r, body)
			switch {
			case err == nil:
				ns = key.Namespace
				hi, rej, err = s.signedRehello(r.Context(), req, key)
				if err != nil {
					s.log.Error().Err(err).Str("key_id", key.ID).Msg("hello: check the key's worker")
					writeDaemonError(w, err)
					return
				}
			case !errors.Is(err, identity.ErrUnauthenticated):
				s.log.Error().Err(err).Msg("hello: verify signature")
				writeDaemonError(w, err)
				return
			case enrollTok:
				revoked := found && errors.Is(err, identity.ErrRevokedKey)
				hi, ns, rej, err = s.enrollHello(r, tok, req, body, revoked)
				if err != nil {
					writeDaemonError(w, err)
					return
				}
			case errors.Is(err, identity.ErrUnknownKey), errors.Is(err, identity.ErrRevokedKey):
				s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: key not enrolled")
				rej = reject(messages.RejectEnrollTokenRequired,
					"the signing key is not enrolled (or was revoked); enroll a new key with a fresh enrollment token (lakeshore token create --enroll)")
			default:
				s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: signature refused")
				rej = reject(messages.RejectEnrollSignatureInvalid, "the hello's signature was refused; check the daemon's clock and key")
			}
		default:
			hi, ns, rej, err = s.enrollHello(r, tok, req, body, false)
			if err != nil {
				writeDaemonError(w, err)
				return
			}
		}
		if rej != nil {
			s.helloVerdict(w, r, req, rej)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), helloIdentityCtx{}, hi))
		next(w, r, daemonPrincipal{namespace: ns})
	}
}

// parseHello runs the same validation handleHello does.
func parseHello(body []byte) (messages.HelloRequest, error) {
	req, _, err := decodeHello(body)
	return req, err
}

// helloVerdict writes a refusal, or a 503 when deciding failed.
func (s *Server) helloVerdict(w http.ResponseWriter, r *http.Request, req messages.HelloRequest, rej *helloReject) {
	if rej == nil {
		writeDaemonError(w, errors.New("no verdict"))
		return
	}
	s.log.Warn().Str("machine_id", req.MachineID).Str("label", req.Label).Str("remote", r.RemoteAddr).
		Str("code", rej.Code).Str("message", rej.Message).Msg("hello rejected")
	s.writeHelloReject(w, &rej.Reject)
}

// writeHelloReject answers a hello with a refusal: HTTP 200 and reject set.
func (s *Server) writeHelloReject(w http.ResponseWriter, rej *messages.Reject) {
	epoch := messages.Epoch(s.now().Unix())
	writeMsgpack(w, http.StatusOK, &messages.HelloResponse{
		SessionTTLS:        sessionTTLS,
		Config:             map[string]any{},
		Reject:             rej,
		KeyRotationMaxAgeS: s.keyRotationMaxAgeS(),
		ServerTimeEpochS:   &epoch,
	})
}

// legacyHello is the bearer-authenticated hello without public_key or
// signature.
func (s *Server) legacyHello(w http.ResponseWriter, r *http.Request, p daemonPrincipal, next daemonHandler) {
	body, err := readBody(w, r, limitHello)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	keepBody(r, body)
	req, verr := parseHello(body)
	if verr != nil {
		next(w, r, p) // the route answers 422 naming the field
		return
	}
	_, err = s.ident.keys.CurrentKeyOf(r.Context(), p.namespace, req.MachineID, req.Label)
	switch {
	case err == nil:
		s.helloVerdict(w, r, req, reject(messages.RejectEnrollmentSignatureRequired,
			"this daemon has an enrolled key; its hello must be signed by it"))
	case !isNotFound(err):
		s.log.Error().Err(err).Msg("hello: look up the worker's key")
		writeDaemonError(w, err)
	case s.ident.requireSigs:
		s.helloVerdict(w, r, req, reject(messages.RejectEnrollmentSignatureRequired,
			"this control plane requires signed daemons; enable [identity] and enroll with a token from 'lakeshore token create --enroll'"))
	default:
		next(w, r, p)
	}
}

// unsignedIdentityHello refuses a hello that carries public_key but neither
// a signature nor an enrollment token.
func (s *Server) unsignedIdentityHello(r *http.Request, req messages.HelloRequest) *helloReject {
	ns := operatorapi.DefaultNamespace
	if p, err := s.authenticateDaemon(r); err == nil {
		ns = p.namespace
	}
	_, err := s.ident.keys.CurrentKeyOf(r.Context(), ns, req.MachineID, req.Label)
	switch {
	case err == nil:
		return reject(messages.RejectEnrollmentSignatureRequired, "this daemon has an enrolled key; its hello must be signed by it")
	case isNotFound(err):
		return reject(messages.RejectEnrollTokenRequired,
			"public_key is not enrolled; present an enrollment token (lakeshore token create --enroll) as the bearer and sign the hello with the key")
	default:
		s.log.Error().Err(err).Msg("hello: look up the worker's key")
		return nil
	}
}

// signedRehello checks that a hello signed by a current key speaks for
// that key's worker.
func (s *Server) signedRehello(ctx context.Context, req messages.HelloRequest, key store.Key) (*helloIdentity, *helloReject, error) {
	if req.PublicKey != "" {
		pub, err := identity.ParsePublicKey(req.PublicKey)
		if err != nil || identity.KeyID(pub) != key.ID {
			return nil, reject(messages.RejectKeyIDMismatch, "public_key is not the key %s that signed the hello", key.ID), nil
		}
	}
	wk, err := s.st.Worker(ctx, "", key.WorkerID)
	switch {
	case err == nil:
		if wk.Namespace != key.Namespace || wk.MachineID != req.MachineID || wk.HelloLabel != req.Label {
			return nil, reject(messages.RejectKeyIDMismatch,
				"key %s is enrolled for daemon %q on machine %q; give each daemon its own key_file", key.ID, wk.HelloLabel, wk.MachineID), nil
		}
		return &helloIdentity{key: &key}, nil, nil
	case !isNotFound(err):
		return nil, nil, err
	}
	// The key's worker row was deleted (kill, cleanup): the daemon comes
	// back as a new row, unless that identity already has a key of its own.
	other, err := s.ident.keys.CurrentKeyOf(ctx, key.Namespace, req.MachineID, req.Label)
	switch {
	case err == nil && other.ID != key.ID:
		return nil, reject(messages.RejectKeyIDMismatch, "this daemon is enrolled with another key"), nil
	case err != nil && !isNotFound(err):
		return nil, nil, err
	}
	return &helloIdentity{key: &key, rebindFrom: key.WorkerID}, nil, nil
}

// enrollHello checks an enrollment hello up to, not including, consuming
// the token. revoked says the signing key is stored and revoked.
func (s *Server) enrollHello(r *http.Request, tok string, req messages.HelloRequest, body []byte, revoked bool) (*helloIdentity, string, *helloReject, error) {
	if len(tok) > maxBearerLen {
		return nil, "", reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	}
	t, err := s.st.TokenByHash(r.Context(), hashSecret(tok))
	switch {
	case isNotFound(err):
		return nil, "", reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	case err != nil:
		s.log.Error().Err(err).Msg("hello: look up enrollment token")
		return nil, "", nil, err
	case t.Kind != store.TokenEnroll || t.RevokedAt != nil:
		return nil, "", reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	case t.ConsumedAt != nil:
		return nil, "", reject(messages.RejectEnrollTokenConsumed, "this enrollment token was already used; mint a fresh one"), nil
	case t.ExpiresAt != nil && !s.now().Before(*t.ExpiresAt):
		return nil, "", reject(messages.RejectEnrollTokenExpired, "this enrollment token expired; mint a fresh one"), nil
	case req.PublicKey == "":
		return nil, "", reject(messages.RejectEnrollSignatureRequired, "an enrollment hello carries public_key and is signed by that key"), nil
	case !hasSignature(r):
		return nil, "", reject(messages.RejectEnrollSignatureRequired, "an enrollment hello must be signed by the key in public_key"), nil
	}
	pub, err := identity.ParsePublicKey(req.PublicKey)
	if err != nil {
		return nil, "", reject(messages.RejectKeyIDMismatch, "%v", err), nil
	}
	kid, err := s.ident.verifier.VerifyWithKey(r.Context(), pub, r, body, s.now())
	switch {
	case err == nil:
	case errors.Is(err, identity.ErrKeyIDMismatch):
		return nil, "", reject(messages.RejectKeyIDMismatch, "%s does not name public_key (its id is %s)", identity.HeaderKeyID, identity.KeyID(pub)), nil
	case errors.Is(err, identity.ErrMissingHeader):
		return nil, "", reject(messages.RejectEnrollSignatureRequired, "an enrollment hello needs all four signature headers"), nil
	default:
		s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: enrollment signature refused")
		return nil, "", reject(messages.RejectEnrollSignatureInvalid, "the enrollment signature was refused; check the daemon's clock and key"), nil
	}
	if revoked {
		return nil, "", revokedKeyReject(kid), nil
	}
	return &helloIdentity{enroll: &enrollment{tokenID: t.ID, namespace: t.Namespace, keyID: kid, pub: pub}}, t.Namespace, nil, nil
}

func revokedKeyReject(kid string) *helloReject {
	return reject(messages.RejectEnrollSignatureInvalid,
		"key %s was revoked and cannot be enrolled again; delete the daemon's key_file so it makes a new key", kid)
}

// storeHello writes the hello's worker row, and with it whatever helloAuth
// decided about its key. keyID is set when a key was enrolled just now.
func (s *Server) storeHello(ctx context.Context, h store.Hello) (wk store.Worker, created bool, keyID *string, rej *messages.Reject, err error) {
	hi, _ := ctx.Value(helloIdentityCtx{}).(*helloIdentity)
	switch {
	case hi != nil && hi.enroll != nil:
		return s.enroll(ctx, h, hi.enroll)
	case hi != nil && hi.key != nil:
		wk, created, err = s.st.Hello(ctx, h)
		if err != nil || hi.rebindFrom == "" || wk.ID == hi.rebindFrom {
			return wk, created, nil, nil, err
		}
		err = s.ident.keys.RebindKey(ctx, hi.key.ID, hi.rebindFrom, wk.ID)
		if errors.Is(err, store.ErrKeyNotCurrent) {
			return wk, created, nil, &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "this daemon is enrolled with another key"}, nil
		}
		if err != nil {
			return wk, created, nil, nil, err
		}
		s.log.Info().Str("worker_id", wk.ID).Str("key_id", hi.key.ID).Str("from_worker_id", hi.rebindFrom).Msg("key moved to the re-created worker")
		return wk, created, nil, nil, nil
	default:
		wk, created, err = s.st.Hello(ctx, h)
		return wk, created, nil, nil, err
	}
}

// enroll consumes the token first — the atomic step that makes one of two
// racing hosts the winner before either touches a worker row — then writes
// the worker and binds the key. A failure after the token was consumed
// hands the token back.
func (s *Server) enroll(ctx context.Context, h store.Hello, e *enrollment) (store.Worker, bool, *string, *messages.Reject, error) {
	now := s.now()
	err := s.ident.keys.ConsumeToken(ctx, e.tokenID, e.keyID, now)
	switch {
	case errors.Is(err, store.ErrTokenConsumed):
		return store.Worker{}, false, nil, &messages.Reject{Code: messages.RejectEnrollTokenConsumed, Message: "this enrollment token was already used; mint a fresh one"}, nil
	case errors.Is(err, store.ErrTokenExpired):
		return store.Worker{}, false, nil, &messages.Reject{Code: messages.RejectEnrollTokenExpired, Message: "this enrollment token expired; mint a fresh one"}, nil
	case isNotFound(err):
		return store.Worker{}, false, nil, &messages.Reject{Code: messages.RejectInvalidEnrollToken, Message: "unknown enrollment token"}, nil
	case err != nil:
		return store.Worker{}, false, nil, nil, err
	}
	release := func() {
		if err := s.ident.keys.ReleaseToken(context.WithoutCancel(ctx), e.tokenID, e.keyID); err != nil {
			s.log.Error().Err(err).Str("token_id", e.tokenID).Msg("hand back an enrollment token")
		}
	}
	wk, created, err := s.st.Hello(ctx, h)
	if err != nil {
		release()
		return store.Worker{}, false, nil, nil, err
	}
	err = s.ident.keys.AddKey(ctx, store.Key{ID: e.keyID, WorkerID: wk.ID, Namespace: e.namespace, PublicKey: e.pub, CreatedAt: now})
	if errors.Is(err, store.ErrKeyExists) {
		release()
		if k, kerr := s.ident.keys.Key(ctx, e.keyID); kerr == nil && k.RevokedAt != nil {
			return wk, created, nil, &revokedKeyReject(e.keyID).Reject, nil
		}
		return wk, created, nil, &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "this key is already enrolled for another daemon"}, nil
	}
	if err != nil {
		release()
		return store.Worker{}, false, nil, nil, err
	}
	s.log.Info().Str("worker_id", wk.ID).Str("key_id", e.keyID).Str("token_id", e.tokenID).Msg("daemon key enrolled")
	return wk, created, &e.keyID, nil, nil
}
