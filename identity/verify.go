package identity

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrUnauthenticated matches (errors.Is) every rejection below, so a server
// can answer 401 for those and treat anything else Verify returns — a failing
// key store — as its own fault.
var ErrUnauthenticated = errors.New("identity: request not authenticated")

// authError is the type of the rejection sentinels; each matches itself and
// ErrUnauthenticated.
type authError string

func (e authError) Error() string { return string(e) }

func (e authError) Is(target error) bool { return target == ErrUnauthenticated }

// Reasons a signed request is refused. Verify wraps them with %w and a
// detail naming the header; match with errors.Is.
var (
	ErrMissingHeader        error = authError("identity: signature header missing")
	ErrDuplicateHeader      error = authError("identity: signature header repeated")
	ErrMalformedHeader      error = authError("identity: signature header malformed")
	ErrSkew                 error = authError("identity: timestamp outside the allowed clock skew")
	ErrBadSignatureEncoding error = authError("identity: signature is not 64 bytes of unpadded base64url")
	ErrUnknownKey           error = authError("identity: unknown key")
	ErrRevokedKey           error = authError("identity: key revoked")
	ErrBadSignature         error = authError("identity: signature does not verify")
	ErrReplay               error = authError("identity: nonce replayed")
	ErrKeyIDMismatch        error = authError("identity: key id does not match the public key")
)

// KeyLookup resolves a key id to its stored public key. It returns an error
// matching ErrUnknownKey (or a nil key and nil error) when the id is not
// enrolled. Any other error is a store failure: Verify returns it wrapped,
// and it does not match ErrUnauthenticated, so the caller can answer 5xx.
type KeyLookup interface {
	LookupKey(ctx context.Context, keyID string) (pub ed25519.PublicKey, revoked bool, err error)
}

// DefaultMaxSkew is how far a request's timestamp may be from the
// verifier's clock, either way.
const DefaultMaxSkew = 300 * time.Second

// Defaults of the replay cache (see Verifier). A pair costs about 100
// bytes, so the whole cache stays under about 100 MB.
const (
	// DefaultNonceCapacity bounds the pairs kept in all windows together.
	DefaultNonceCapacity = 1_000_000
	// DefaultKeyWindow bounds one key's window. A nonce is kept until its
	// timestamp leaves the skew window, at most 2 x 300 s after it was
	// accepted; a daemon signs a few requests a second (a poll per 20 s
	// when idle; acks, events, chunks and results while jobs run), so
	// 16,384 holds ten minutes of 27 a second.
	DefaultKeyWindow = 16_384
	// DefaultMaxKeys bounds the windows kept (one per key recently heard).
	DefaultMaxKeys = 100_000
)

// Option configures a Verifier.
type Option func(*Verifier)

// WithMaxSkew sets the accepted clock skew, rounded down to whole seconds.
// Values under one second keep DefaultMaxSkew.
func WithMaxSkew(d time.Duration) Option {
	return func(v *Verifier) {
		if s := int64(d / time.Second); s >= 1 {
			v.skew = s
		}
	}
}

// WithNonceCapacity sets how many nonces the replay cache holds in all.
// Values under one keep DefaultNonceCapacity.
func WithNonceCapacity(n int) Option {
	return func(v *Verifier) {
		if n >= 1 {
			v.capacity = n
		}
	}
}

// WithKeyWindow sets how many nonces one key's window holds. Values under
// one keep DefaultKeyWindow.
func WithKeyWindow(n int) Option {
	return func(v *Verifier) {
		if n >= 1 {
			v.perKey = n
		}
	}
}

// WithMaxKeys sets how many keys have a window at once. Values under one
// keep DefaultMaxKeys.
func WithMaxKeys(n int) Option {
	return func(v *Verifier) {
		if n >= 1 {
			v.maxKeys = n
		}
	}
}

// WithKeyRate throttles each key on its own: a token bucket of burst
// requests refilled at perSecond. A validly signed request past it is
// refused with a *ThrottledError (ErrThrottled) and its nonce is not
// recorded. A rate not above zero, or a burst under one, throttles nothing
// (the default).
func WithKeyRate(perSecond float64, burst int) Option {
	return func(v *Verifier) { v.rate, v.burst = perSecond, burst }
}

// NonceLedger records nonces durably, where the verifiers of every replica
// and of every later process see them, so a request replayed to another
// replica or after a restart is refused too.
//
// Concurrency: UseNonce is called concurrently; of two calls recording the
// same pair, exactly one reports it fresh.
type NonceLedger interface {
	// UseNonce records (keyID, nonce) until expires and reports whether
	// the pair was new. It returns once the record is durable.
	UseNonce(ctx context.Context, keyID, nonce string, expires time.Time) (bool, error)
}

// WithNonceLedger adds a durable ledger to the in-memory cache, which still
// answers first and so catches replays to this process without a round
// trip. Every nonce the cache accepts is then recorded in the ledger before
// Verify returns.
func WithNonceLedger(l NonceLedger) Option {
	return func(v *Verifier) { v.ledger = l }
}

// Verifier checks signed requests on the control plane.
//
// Concurrency: a Verifier is safe for concurrent use by any number of
// goroutines, and must be shared — one per process, across every route that
// accepts signatures — because replay protection and the throttle live in
// its in-memory nonce cache. Key lookups and signature checks run unlocked;
// only the final check-and-record of the nonce holds a mutex, so of two
// concurrent copies of one request exactly one is accepted. A NonceLedger
// (WithNonceLedger) makes the protection outlive the process and span
// replicas.
//
// The cache is partitioned by key: each key has a window of its own
// (WithKeyWindow), so no key's traffic can evict another key's nonces, and
// its own token bucket (WithKeyRate). The number of windows (WithMaxKeys)
// and of nonces in all (WithNonceCapacity) are bounded too; past them the
// least recently used windows go first. Without a ledger a dropped nonce
// makes its key refuse every timestamp at or before it: under load the
// accepted window narrows from the past instead of letting a replay
// through. With one, a dropped nonce is still refused by the ledger.
type Verifier struct {
	lookup   KeyLookup
	skew     int64
	capacity int
	perKey   int
	maxKeys  int
	rate     float64
	burst    int
	nonces   *nonceWindows
	ledger   NonceLedger
}

// NewVerifier returns a Verifier that resolves key ids through lookup.
func NewVerifier(lookup KeyLookup, opts ...Option) *Verifier {
	v := &Verifier{
		lookup: lookup, skew: int64(DefaultMaxSkew / time.Second),
		capacity: DefaultNonceCapacity, perKey: DefaultKeyWindow, maxKeys: DefaultMaxKeys,
	}
	for _, o := range opts {
		o(v)
	}
	v.nonces = newNonceWindows(v.perKey, v.maxKeys, v.capacity, v.skew, v.ledger != nil, v.rate, v.burst)
	return v
}

// Verify checks req's signature headers against body (the exact bytes
// received) at time now and returns the signing key's id. In order: the four
// headers each present exactly once and well-formed, the timestamp within
// the skew, the signature 64 bytes, the key enrolled and not revoked, the
// signature valid over Canonical, and the nonce unseen. The nonce is
// recorded only once the signature has verified. It is Begin then
// Pending.Finish.
func (v *Verifier) Verify(ctx context.Context, req *http.Request, body []byte, now time.Time) (string, error) {
	p, err := v.Begin(ctx, req, now)
	if err != nil {
		return "", err
	}
	return p.Finish(ctx, body)
}

// Pending is a signed request whose headers and key have been checked and
// whose body has not been read yet. It is used by one goroutine, once.
type Pending struct {
	v   *Verifier
	req *http.Request
	h   sigHeaders
	pub ed25519.PublicKey
	now time.Time
}

// KeyID is the id of the stored key the request claims to be signed by.
func (p *Pending) KeyID() string { return p.h.keyID }

// Begin does every check that needs no body: the headers, the clock skew,
// the signature's encoding, and the key enrolled and not revoked. A server
// calls it before it reads the body, so that a stranger's request costs
// no more than its headers; Finish then checks the body.
func (v *Verifier) Begin(ctx context.Context, req *http.Request, now time.Time) (*Pending, error) {
	h, err := v.parse(req, now)
	if err != nil {
		return nil, err
	}
	if v.lookup == nil {
		return nil, fmt.Errorf("identity: key %q: verifier has no key lookup: %w", h.keyID, ErrUnknownKey)
	}
	pub, revoked, err := v.lookup.LookupKey(ctx, h.keyID)
	switch {
	case errors.Is(err, ErrUnknownKey), err == nil && pub == nil:
		return nil, fmt.Errorf("identity: key %q: %w", h.keyID, ErrUnknownKey)
	case err != nil:
		return nil, fmt.Errorf("identity: look up key %q: %w", h.keyID, err)
	case len(pub) != ed25519.PublicKeySize:
		return nil, fmt.Errorf("identity: stored public key for %q is %d bytes, want %d", h.keyID, len(pub), ed25519.PublicKeySize)
	case revoked:
		return nil, fmt.Errorf("identity: key %q: %w", h.keyID, ErrRevokedKey)
	}
	return &Pending{v: v, req: req, h: h, pub: pub, now: now}, nil
}

// Finish checks the signature over body (the exact bytes received) and
// records the nonce, and returns the signing key's id.
func (p *Pending) Finish(ctx context.Context, body []byte) (string, error) {
	if err := p.v.check(ctx, p.req, body, p.h, p.pub, p.now); err != nil {
		return "", err
	}
	return p.h.keyID, nil
}

// BeginWithKey is Begin for a request signed by a key that is not stored
// yet (see VerifyWithKey): the key id header must equal KeyID(pub).
func (v *Verifier) BeginWithKey(pub ed25519.PublicKey, req *http.Request, now time.Time) (*Pending, error) {
	h, err := v.parse(req, now)
	if err != nil {
		return nil, err
	}
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("identity: public_key is %d bytes, want %d: %w", len(pub), ed25519.PublicKeySize, ErrKeyIDMismatch)
	}
	if want := KeyID(pub); h.keyID != want {
		return nil, fmt.Errorf("identity: %s %q, public_key has id %q: %w", HeaderKeyID, h.keyID, want, ErrKeyIDMismatch)
	}
	return &Pending{v: v, req: req, h: h, pub: pub, now: now}, nil
}

// VerifyWithKey is Verify for a request signed by a key that is not stored
// yet — the enrollment hello, which carries its own public_key. The key id
// header must equal KeyID(pub) (else ErrKeyIDMismatch); skew, signature and
// nonce are checked as in Verify, against the same nonce cache.
func (v *Verifier) VerifyWithKey(ctx context.Context, pub ed25519.PublicKey, req *http.Request, body []byte, now time.Time) (string, error) {
	p, err := v.BeginWithKey(pub, req, now)
	if err != nil {
		return "", err
	}
	return p.Finish(ctx, body)
}

type sigHeaders struct {
	keyID string
	ts    int64
	nonce string
	sig   []byte
}

// parse does every check that needs neither the key nor the body, so that
// garbage is refused before it reaches the key store.
func (v *Verifier) parse(req *http.Request, now time.Time) (sigHeaders, error) {
	var h sigHeaders
	if req == nil || req.URL == nil {
		return h, fmt.Errorf("identity: no request: %w", ErrMissingHeader)
	}
	vals := [4]string{}
	for i, name := range [4]string{HeaderKeyID, HeaderTimestamp, HeaderNonce, HeaderSignature} {
		s, err := single(req.Header, name)
		if err != nil {
			return h, err
		}
		vals[i] = s
	}
	keyID, tsText, nonce, sigText := vals[0], vals[1], vals[2], vals[3]

	if err := checkKeyID(keyID); err != nil {
		return h, fmt.Errorf("identity: %s: %w: %w", HeaderKeyID, err, ErrMalformedHeader)
	}
	ts, err := strconv.ParseInt(tsText, 10, 64)
	if err != nil || strconv.FormatInt(ts, 10) != tsText {
		return h, fmt.Errorf("identity: %s %q is not decimal unix seconds: %w", HeaderTimestamp, tsText, ErrMalformedHeader)
	}
	if _, err := decodeB64(nonce, nonceBytes, maxNonceBytes); err != nil {
		return h, fmt.Errorf("identity: %s: %w: %w", HeaderNonce, err, ErrMalformedHeader)
	}
	// Compared as bounds rather than |now-ts| so no timestamp can overflow.
	nowS := now.Unix()
	if ts < nowS-v.skew || ts > nowS+v.skew {
		return h, fmt.Errorf("identity: %s %d is outside %d s of server time %d: %w", HeaderTimestamp, ts, v.skew, nowS, ErrSkew)
	}
	sig, err := decodeB64(sigText, ed25519.SignatureSize, ed25519.SignatureSize)
	if err != nil {
		return h, fmt.Errorf("identity: %s: %w: %w", HeaderSignature, err, ErrBadSignatureEncoding)
	}
	return sigHeaders{keyID: keyID, ts: ts, nonce: nonce, sig: sig}, nil
}

// check verifies the signature, then records the nonce: in this process's
// cache (which also throttles the key), then in the ledger if there is one.
func (v *Verifier) check(ctx context.Context, req *http.Request, body []byte, h sigHeaders, pub ed25519.PublicKey, now time.Time) error {
	msg := Canonical(h.keyID, req.Method, requestPath(req.URL), req.URL.RawQuery, h.ts, h.nonce, body)
	if !ed25519.Verify(pub, msg, h.sig) {
		return fmt.Errorf("identity: key %q: %w", h.keyID, ErrBadSignature)
	}
	if err := v.nonces.remember(h.keyID, h.nonce, h.ts, now); err != nil {
		return fmt.Errorf("identity: key %q: %w", h.keyID, err)
	}
	if v.ledger == nil {
		return nil
	}
	// Kept until the timestamp leaves the window on every replica.
	fresh, err := v.ledger.UseNonce(ctx, h.keyID, h.nonce, time.Unix(h.ts+v.skew+1, 0))
	if err != nil {
		return fmt.Errorf("identity: key %q: record nonce: %w", h.keyID, err)
	}
	if !fresh {
		v.nonces.refund(h.keyID)
		return fmt.Errorf("identity: key %q: nonce %q already used (recorded by another replica or an earlier process): %w", h.keyID, h.nonce, ErrReplay)
	}
	return nil
}

// single returns the one value of header name. Names are matched
// case-insensitively over the whole map, so a header stored under a
// non-canonical key cannot smuggle in a second value.
func single(hdr http.Header, name string) (string, error) {
	var found []string
	for k, vs := range hdr {
		if strings.EqualFold(k, name) {
			found = append(found, vs...)
		}
	}
	switch {
	case len(found) == 0:
		return "", fmt.Errorf("identity: %s: %w", name, ErrMissingHeader)
	case len(found) > 1:
		return "", fmt.Errorf("identity: %s sent %d times: %w", name, len(found), ErrDuplicateHeader)
	case found[0] == "":
		return "", fmt.Errorf("identity: %s is empty: %w", name, ErrMissingHeader)
	}
	return found[0], nil
}

// maxKeyIDLen is generous for ids minted by KeyID (24 characters) while
// bounding what reaches the key store and the nonce cache.
const maxKeyIDLen = 128

// checkKeyID accepts visible ASCII except ',' — a comma is what a proxy
// leaves when it folds two header lines into one.
func checkKeyID(id string) error {
	if len(id) > maxKeyIDLen {
		return fmt.Errorf("%d characters, at most %d allowed", len(id), maxKeyIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c < 0x21 || c > 0x7e || c == ',' {
			return fmt.Errorf("character %q at offset %d is not allowed", c, i)
		}
	}
	return nil
}
