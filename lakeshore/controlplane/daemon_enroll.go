package controlplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"nymph/identity"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// How a hello is admitted, and which refusal each path produces (HTTP 200
// with reject{code, message}, except where a 401 or 422 is named). "Signed"
// means at least one X-LS-* header is present; "key" is the key the
// X-LS-Key-Id header names; "dle_" is an enrollment token as the bearer;
// "public_key" is HelloRequest.public_key.
//
// Every credential is checked before the body is read, and a refusal
// decided then leaves the body unread (the connection is closed): the
// signature headers and the key they name, a dle_ token (its state), a
// bearer. Only a hello that passed them is read, and decoded (a 422 for a
// body that fails validation), and its signature checked.
//
// Signed, and the key is stored and current: a re-hello. No token is
// needed and a dle_ bearer is ignored, not consumed.
//   - the signature does not verify over the body, or is replayed
//     .................................................. enroll_signature_invalid
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
//   - no X-LS-* header, or some X-LS-* header missing, or (once read) no
//     public_key ....................................... enroll_signature_required
//   - signature headers malformed or outside the clock skew
//     .................................................. enroll_signature_invalid
//   - public_key malformed, or X-LS-Key-Id ≠ KeyID(public_key)  key_id_mismatch
//   - signature not verifying, or replayed ............ enroll_signature_invalid
//   - the key was enrolled before and is revoked (a revoked key never
//     comes back; the daemon must make a new one) ....... enroll_signature_invalid
//   - the key is current for another worker ............ key_id_mismatch
//   - otherwise the token is consumed (atomically: of two hellos racing
//     with one token, the loser gets enroll_token_consumed), the key becomes
//     the worker's current key (replacing any previous one) and key_id is
//     returned.
//
// Signed, no dle_ bearer, and the key is not admitted:
//   - the key is unknown or revoked ................... enroll_token_required
//   - any other signature failure ..................... enroll_signature_invalid
//
// Unsigned, no dle_ bearer: the bearer must be valid (else 401). Then
//   - public_key present: the worker has a current key  enrollment_signature_required
//     else ............................................ enroll_token_required
//   - no public_key (the legacy hello): the worker having a current key,
//     or RequireSignatures, is enrollment_signature_required; then the
//     token rules (below); otherwise the legacy hello.
//
// The token rules of a legacy hello (store.Hello.TokenID): a daemon token
// minted for one daemon is bound to the worker of its first hello.
//   - the token is bound to another worker ........... token_bound_elsewhere
//   - the worker is bound to another token, neither revoked nor expired;
//     also for a fleet token or the shared bootstrap token
//     .................................................. worker_bound_to_another_token
//
// protocol_mismatch is decided after admission, before anything is stored.
// A refused hello writes nothing.

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
	return func(w http.ResponseWriter, r *http.Request) {
		tok, _ := bearer(r)
		enrollTok := strings.HasPrefix(tok, enrollTokenPrefix)
		if !hasSignature(r) && !enrollTok {
			s.unsignedHello(w, r, next)
			return
		}
		// rejectUnread refuses from the headers alone.
		rejectUnread := func(rej *helloReject) {
			closeUnread(w)
			s.helloVerdict(w, r, nil, rej)
		}
		var (
			key     store.Key
			found   bool
			pending *identity.Pending
			err     error
		)
		if hasSignature(r) {
			key, found, pending, err = s.beginSigned(r)
			if err != nil && !errors.Is(err, identity.ErrUnauthenticated) {
				s.log.Error().Err(err).Msg("hello: verify signature")
				closeUnread(w)
				writeDaemonError(w, err)
				return
			}
		}
		if pending != nil {
			s.signedHello(w, r, key, pending, next)
			return
		}
		if !enrollTok {
			// Signed, and the key not admitted.
			if errors.Is(err, identity.ErrUnknownKey) || errors.Is(err, identity.ErrRevokedKey) {
				s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: key not enrolled")
				rejectUnread(reject(messages.RejectEnrollTokenRequired,
					"the signing key is not enrolled (or was revoked); enroll a new key with a fresh enrollment token (lakeshore token create --enroll)"))
				return
			}
			s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: signature refused")
			rejectUnread(reject(messages.RejectEnrollSignatureInvalid, "the hello's signature was refused; check the daemon's clock and key"))
			return
		}
		// An enrollment: the token first, then the signature's headers.
		t, rej, terr := s.enrollToken(r, tok)
		switch {
		case terr != nil:
			closeUnread(w)
			writeDaemonError(w, terr)
			return
		case rej != nil:
			rejectUnread(rej)
			return
		case !hasSignature(r), errors.Is(err, identity.ErrMissingHeader):
			rejectUnread(reject(messages.RejectEnrollSignatureRequired, "an enrollment hello must be signed, with all four signature headers, by the key in public_key"))
			return
		case !errors.Is(err, identity.ErrUnknownKey) && !errors.Is(err, identity.ErrRevokedKey):
			s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: enrollment signature refused")
			rejectUnread(reject(messages.RejectEnrollSignatureInvalid, "the enrollment signature was refused; check the daemon's clock and key"))
			return
		}
		body, req, ok := s.readHello(w, r)
		if !ok {
			return
		}
		revoked := found && errors.Is(err, identity.ErrRevokedKey)
		hi, rej := s.enrollHello(r, t, req, body, revoked)
		if rej != nil {
			s.helloVerdict(w, r, &req, rej)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), helloIdentityCtx{}, hi))
		next(w, r, daemonPrincipal{namespace: t.Namespace})
	}
}

// readHello reads and validates a hello's body (a 422 naming the field
// when it fails, answered here), and leaves it in r.Body for handleHello.
func (s *Server) readHello(w http.ResponseWriter, r *http.Request) ([]byte, messages.HelloRequest, bool) {
	body, err := readBody(w, r, limitHello)
	if err != nil {
		writeDaemonError(w, err)
		return nil, messages.HelloRequest{}, false
	}
	keepBody(r, body)
	req, err := parseHello(body)
	if err != nil {
		s.log.Info().Err(err).Msg("hello refused as malformed")
		writeDaemonError(w, err)
		return nil, req, false
	}
	return body, req, true
}

// signedHello is a hello signed by a stored, current key: its body is read
// only now, and its signature checked over it.
func (s *Server) signedHello(w http.ResponseWriter, r *http.Request, key store.Key, pending *identity.Pending, next daemonHandler) {
	body, err := readBody(w, r, limitHello)
	if err != nil {
		writeDaemonError(w, err)
		return
	}
	keepBody(r, body)
	if _, err := pending.Finish(r.Context(), body); err != nil {
		if !errors.Is(err, identity.ErrUnauthenticated) {
			s.log.Error().Err(err).Msg("hello: verify signature")
			writeDaemonError(w, err)
			return
		}
		s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: signature refused")
		s.helloVerdict(w, r, nil, reject(messages.RejectEnrollSignatureInvalid, "the hello's signature was refused; check the daemon's clock and key"))
		return
	}
	req, err := parseHello(body)
	if err != nil {
		s.log.Info().Err(err).Msg("hello refused as malformed")
		writeDaemonError(w, err)
		return
	}
	hi, rej, err := s.signedRehello(r.Context(), req, key)
	if err != nil {
		s.log.Error().Err(err).Str("key_id", key.ID).Msg("hello: check the key's worker")
		writeDaemonError(w, err)
		return
	}
	if rej != nil {
		s.helloVerdict(w, r, &req, rej)
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), helloIdentityCtx{}, hi))
	next(w, r, daemonPrincipal{namespace: key.Namespace})
}

// unsignedHello is a hello with neither a signature nor a dle_ bearer: its
// bearer is checked before its body is read.
func (s *Server) unsignedHello(w http.ResponseWriter, r *http.Request, next daemonHandler) {
	p, err := s.authenticateDaemon(r)
	if err != nil {
		closeUnread(w)
		s.writeBearerError(w, r, err)
		return
	}
	_, req, ok := s.readHello(w, r)
	if !ok {
		return
	}
	if req.PublicKey != "" {
		s.helloVerdict(w, r, &req, s.unsignedIdentityHello(r, p, req))
		return
	}
	_, err = s.ident.keys.CurrentKeyOf(r.Context(), p.namespace, req.MachineID, req.Label)
	switch {
	case err == nil:
		s.helloVerdict(w, r, &req, reject(messages.RejectEnrollmentSignatureRequired,
			"this daemon has an enrolled key; its hello must be signed by it"))
	case !isNotFound(err):
		s.log.Error().Err(err).Msg("hello: look up the worker's key")
		writeDaemonError(w, err)
	case s.ident.requireSigs:
		s.helloVerdict(w, r, &req, reject(messages.RejectEnrollmentSignatureRequired,
			"this control plane requires signed daemons; enable [identity] and enroll with a token from 'lakeshore token create --enroll'"))
	default:
		next(w, r, p)
	}
}

// parseHello runs the same validation handleHello does.
func parseHello(body []byte) (messages.HelloRequest, error) {
	req, _, err := decodeHello(body)
	return req, err
}

// helloVerdict writes a refusal, or a 503 when deciding failed. req is nil
// for a hello refused before its body was read.
func (s *Server) helloVerdict(w http.ResponseWriter, r *http.Request, req *messages.HelloRequest, rej *helloReject) {
	if rej == nil {
		writeDaemonError(w, errors.New("no verdict"))
		return
	}
	ev := s.log.Warn().Str("remote", r.RemoteAddr).Str("code", rej.Code).Str("message", rej.Message)
	if req != nil {
		ev = ev.Str("machine_id", req.MachineID).Str("label", req.Label)
	}
	ev.Msg("hello rejected")
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

// unsignedIdentityHello refuses a hello that carries public_key but neither
// a signature nor an enrollment token.
func (s *Server) unsignedIdentityHello(r *http.Request, p daemonPrincipal, req messages.HelloRequest) *helloReject {
	_, err := s.ident.keys.CurrentKeyOf(r.Context(), p.namespace, req.MachineID, req.Label)
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

// enrollToken checks a dle_ bearer before the hello's body is read.
func (s *Server) enrollToken(r *http.Request, tok string) (store.Token, *helloReject, error) {
	if len(tok) > maxBearerLen {
		return store.Token{}, reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	}
	t, err := s.st.TokenByHash(r.Context(), hashSecret(tok))
	switch {
	case isNotFound(err):
		return t, reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	case err != nil:
		s.log.Error().Err(err).Msg("hello: look up enrollment token")
		return t, nil, err
	case t.Kind != store.TokenEnroll || t.RevokedAt != nil:
		return t, reject(messages.RejectInvalidEnrollToken, "unknown enrollment token"), nil
	case t.ConsumedAt != nil:
		return t, reject(messages.RejectEnrollTokenConsumed, "this enrollment token was already used; mint a fresh one"), nil
	case t.ExpiresAt != nil && !s.now().Before(*t.ExpiresAt):
		return t, reject(messages.RejectEnrollTokenExpired, "this enrollment token expired; mint a fresh one"), nil
	}
	return t, nil, nil
}

// enrollHello checks an enrollment hello, once its token passed
// enrollToken and its body was read, up to, not including, consuming the
// token. revoked says the signing key is stored and revoked.
func (s *Server) enrollHello(r *http.Request, t store.Token, req messages.HelloRequest, body []byte, revoked bool) (*helloIdentity, *helloReject) {
	if req.PublicKey == "" {
		return nil, reject(messages.RejectEnrollSignatureRequired, "an enrollment hello carries public_key and is signed by that key")
	}
	pub, err := identity.ParsePublicKey(req.PublicKey)
	if err != nil {
		return nil, reject(messages.RejectKeyIDMismatch, "%v", err)
	}
	kid, err := s.ident.verifier.VerifyWithKey(r.Context(), pub, r, body, s.now())
	switch {
	case err == nil:
	case errors.Is(err, identity.ErrKeyIDMismatch):
		return nil, reject(messages.RejectKeyIDMismatch, "%s does not name public_key (its id is %s)", identity.HeaderKeyID, identity.KeyID(pub))
	case errors.Is(err, identity.ErrMissingHeader):
		return nil, reject(messages.RejectEnrollSignatureRequired, "an enrollment hello needs all four signature headers")
	default:
		s.log.Info().Err(err).Str("reason", authReason(err)).Msg("hello: enrollment signature refused")
		return nil, reject(messages.RejectEnrollSignatureInvalid, "the enrollment signature was refused; check the daemon's clock and key")
	}
	if revoked {
		return nil, revokedKeyReject(kid)
	}
	return &helloIdentity{enroll: &enrollment{tokenID: t.ID, namespace: t.Namespace, keyID: kid, pub: pub}}, nil
}

func revokedKeyReject(kid string) *helloReject {
	return reject(messages.RejectEnrollSignatureInvalid,
		"key %s was revoked and cannot be enrolled again; delete the daemon's key_file so it makes a new key", kid)
}

// storeHello writes the hello's worker row, and with it whatever helloAuth
// decided about its key, in one store transaction: a hello refused there
// writes nothing. keyID is set when a key was enrolled just now.
func (s *Server) storeHello(ctx context.Context, h store.Hello) (wk store.Worker, created bool, keyID *string, rej *messages.Reject, err error) {
	hi, _ := ctx.Value(helloIdentityCtx{}).(*helloIdentity)
	switch {
	case hi != nil && hi.enroll != nil:
		return s.enroll(ctx, h, hi.enroll)
	case hi != nil && hi.key != nil:
		if hi.rebindFrom != "" {
			h.RebindKey = &store.KeyRebind{KeyID: hi.key.ID, From: hi.rebindFrom}
		}
		wk, created, err = s.st.Hello(ctx, h)
		if errors.Is(err, store.ErrKeyNotCurrent) {
			return wk, created, nil, &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "this daemon is enrolled with another key"}, nil
		}
		if err == nil && hi.rebindFrom != "" && wk.ID != hi.rebindFrom {
			// The key's cached row names its old worker.
			s.announce(keysAnnouncement(hi.rebindFrom))
			s.log.Info().Str("worker_id", wk.ID).Str("key_id", hi.key.ID).Str("from_worker_id", hi.rebindFrom).Msg("key moved to the re-created worker")
		}
		return wk, created, nil, nil, err
	default:
		wk, created, err = s.st.Hello(ctx, h)
		if rej := tokenReject(err, h); rej != nil {
			return wk, created, nil, rej, nil
		}
		if err == nil && h.TokenID != "" {
			s.log.Debug().Str("worker_id", wk.ID).Str("token_id", h.TokenID).Msg("token bound to its worker")
		}
		return wk, created, nil, nil, err
	}
}

// tokenReject is the refusal of a hello the token rules refused.
func tokenReject(err error, h store.Hello) *messages.Reject {
	switch {
	case errors.Is(err, store.ErrTokenBound):
		return &messages.Reject{Code: messages.RejectTokenBound, Message: fmt.Sprintf(
			"this daemon token belongs to another daemon (not machine %q, label %q): give each daemon a token of its own "+
				"(lakeshore token create), or mint one that a whole fleet shares (lakeshore token create --fleet)", h.MachineID, h.Label)}
	case errors.Is(err, store.ErrWorkerOwned):
		return &messages.Reject{Code: messages.RejectWorkerBound, Message: fmt.Sprintf(
			"daemon %q on machine %q belongs to another daemon token: start it with that token, or revoke that one "+
				"(lakeshore token list; lakeshore token revoke <id>) so a fresh token can take its place", h.Label, h.MachineID)}
	}
	return nil
}

// enroll consumes the token first — the atomic step that makes one of two
// racing hosts the winner before either touches a worker row — then writes
// the worker with its key, in one transaction. A failure after the token
// was consumed hands the token back.
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
	h.AddKey = &store.Key{ID: e.keyID, Namespace: e.namespace, PublicKey: e.pub, CreatedAt: now}
	h.Adopt = e.tokenID
	wk, created, err := s.st.Hello(ctx, h)
	if errors.Is(err, store.ErrKeyExists) {
		release()
		if k, kerr := s.ident.keys.Key(ctx, e.keyID); kerr == nil && k.RevokedAt != nil {
			return store.Worker{}, false, nil, &revokedKeyReject(e.keyID).Reject, nil
		}
		return store.Worker{}, false, nil, &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "this key is already enrolled for another daemon"}, nil
	}
	if err != nil {
		release()
		return store.Worker{}, false, nil, nil, err
	}
	s.log.Info().Str("worker_id", wk.ID).Str("key_id", e.keyID).Str("token_id", e.tokenID).Msg("daemon key enrolled")
	return wk, created, &e.keyID, nil, nil
}
