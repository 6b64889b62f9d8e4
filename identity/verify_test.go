package identity_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/identity"
)

var t0 = time.Unix(1_700_000_000, 0)

func seedKey(t testing.TB, b byte) *identity.Key {
	t.Helper()
	k, err := identity.NewKeyFromSeed(bytes.Repeat([]byte{b}, ed25519.SeedSize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

type storedKey struct {
	pub     ed25519.PublicKey
	revoked bool
}

// memKeys is the test's key store.
type memKeys struct {
	mu   sync.Mutex
	keys map[string]storedKey
	fail error
}

func newMemKeys(keys ...*identity.Key) *memKeys {
	m := &memKeys{keys: map[string]storedKey{}}
	for _, k := range keys {
		m.keys[k.ID()] = storedKey{pub: k.PublicKey()}
	}
	return m
}

func (m *memKeys) LookupKey(_ context.Context, keyID string) (ed25519.PublicKey, bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return nil, false, m.fail
	}
	e, ok := m.keys[keyID]
	if !ok {
		return nil, false, fmt.Errorf("no key %q: %w", keyID, identity.ErrUnknownKey)
	}
	return e.pub, e.revoked, nil
}

var _ identity.KeyLookup = (*memKeys)(nil)

type result struct {
	status int
	keyID  string
	err    error
}

// harness is a control plane in miniature: a real HTTP server that verifies
// every request at a fixed clock and reports what Verify said.
type harness struct {
	t       *testing.T
	srv     *httptest.Server
	results chan result
}

func newHarness(t *testing.T, v *identity.Verifier, now time.Time) *harness {
	h := &harness{t: t, results: make(chan result, 1)}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "read body", http.StatusBadRequest)
			return
		}
		id, err := v.Verify(r.Context(), r, body, now)
		status := http.StatusOK
		switch {
		case errors.Is(err, identity.ErrUnauthenticated):
			status = http.StatusUnauthorized
		case err != nil:
			status = http.StatusInternalServerError
		}
		h.results <- result{status: status, keyID: id, err: err}
		w.WriteHeader(status)
	}))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *harness) request(method, target string, body []byte) *http.Request {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+target, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	return req
}

func (h *harness) do(req *http.Request) result {
	h.t.Helper()
	resp, err := h.srv.Client().Do(req)
	if err != nil {
		h.t.Fatalf("send: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	select {
	case r := <-h.results:
		if r.status != resp.StatusCode {
			h.t.Fatalf("status %d on the wire, handler chose %d", resp.StatusCode, r.status)
		}
		return r
	case <-time.After(10 * time.Second):
		h.t.Fatal("handler never reported")
		return result{}
	}
}

// signed builds and signs a request; body is what gets signed and sent.
func (h *harness) signed(k *identity.Key, method, target string, body []byte, at time.Time) *http.Request {
	h.t.Helper()
	req := h.request(method, target, body)
	if err := k.SignRequest(req, body, at); err != nil {
		h.t.Fatal(err)
	}
	return req
}

func TestRoundTrip(t *testing.T) {
	k := seedKey(t, 1)
	h := newHarness(t, identity.NewVerifier(newMemKeys(k)), t0)
	cases := []struct {
		name, method, target string
		body                 []byte
	}{
		{"poll with body and query", http.MethodPost, "/v1/daemon/poll?wait=30&x=%20y", []byte{0x82, 0xa1, 'a', 0x01, 0xa1, 'b', 0xc0}},
		{"no body no query", http.MethodGet, "/v1/daemon/hello", nil},
		{"empty path is sent as /", http.MethodGet, "", nil},
		{"escaped path kept as sent", http.MethodPost, "/v1/daemon/exec/a%2Fb/result", []byte("x")},
		{"bare question mark", http.MethodPost, "/v1/daemon/ack?", []byte("y")},
		{"lower-case method", "post", "/v1/daemon/ack", []byte("z")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.do(h.signed(k, c.method, c.target, c.body, t0))
			if r.err != nil || r.keyID != k.ID() {
				t.Fatalf("got (%q, %v), want (%q, nil)", r.keyID, r.err, k.ID())
			}
		})
	}
}

func TestHeadersOnTheWire(t *testing.T) {
	k := seedKey(t, 1)
	req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
	if err := k.SignRequest(req, nil, t0); err != nil {
		t.Fatal(err)
	}
	if got := req.Header.Get(identity.HeaderKeyID); got != k.ID() {
		t.Errorf("key id header %q, want %q", got, k.ID())
	}
	if got := req.Header.Get(identity.HeaderTimestamp); got != "1700000000" {
		t.Errorf("timestamp header %q", got)
	}
	nonce, err := base64.RawURLEncoding.DecodeString(req.Header.Get(identity.HeaderNonce))
	if err != nil || len(nonce) < 16 {
		t.Errorf("nonce %q: %d bytes, %v", req.Header.Get(identity.HeaderNonce), len(nonce), err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(req.Header.Get(identity.HeaderSignature))
	if err != nil || len(sig) != ed25519.SignatureSize {
		t.Fatalf("signature %d bytes, %v", len(sig), err)
	}
	msg := identity.Canonical(k.ID(), "POST", "/v1/daemon/poll", "", t0.Unix(), req.Header.Get(identity.HeaderNonce), nil)
	if !ed25519.Verify(k.PublicKey(), msg, sig) {
		t.Fatal("signature does not verify over Canonical")
	}
	// Re-signing replaces rather than appends.
	if err := k.SignRequest(req, nil, t0); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{identity.HeaderKeyID, identity.HeaderTimestamp, identity.HeaderNonce, identity.HeaderSignature} {
		if n := len(req.Header.Values(name)); n != 1 {
			t.Errorf("%s has %d values after re-signing", name, n)
		}
	}
}

func TestCanonicalGolden(t *testing.T) {
	got := string(identity.Canonical("k_abc", "post", "/v1/daemon/poll", "a=1&b=2", 1700000000, "bm9uY2Vub25jZW5vbmNl", []byte("hello")))
	want := "LS-SIG\nv1\nk_abc\nPOST\n/v1/daemon/poll\na=1&b=2\n1700000000\nbm9uY2Vub25jZW5vbmNl\n" +
		"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	if got != want {
		t.Fatalf("canonical:\n%q\nwant\n%q", got, want)
	}
	empty := string(identity.Canonical("k", "GET", "/", "", 0, "n", nil))
	if want := "LS-SIG\nv1\nk\nGET\n/\n\n0\nn\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; empty != want {
		t.Fatalf("canonical without query or body: %q", empty)
	}
}

func TestRejections(t *testing.T) {
	k := seedKey(t, 1)
	other := seedKey(t, 2)
	revoked := seedKey(t, 3)
	stranger := seedKey(t, 4)
	keys := newMemKeys(k, other, revoked)
	keys.keys[revoked.ID()] = storedKey{pub: revoked.PublicKey(), revoked: true}
	h := newHarness(t, identity.NewVerifier(keys), t0)
	body := []byte("the body")

	set := func(name, value string) func(*http.Request) {
		return func(r *http.Request) { r.Header.Set(name, value) }
	}
	headers := []string{identity.HeaderKeyID, identity.HeaderTimestamp, identity.HeaderNonce, identity.HeaderSignature}
	sig63 := base64.RawURLEncoding.EncodeToString(make([]byte, 63))
	sig65 := base64.RawURLEncoding.EncodeToString(make([]byte, 65))

	type tc struct {
		name   string
		key    *identity.Key
		at     time.Time
		target string
		mutate func(*http.Request)
		send   []byte // body sent instead of the signed one
		want   error
	}
	cases := []tc{
		{name: "skew future", at: t0.Add(301 * time.Second), want: identity.ErrSkew},
		{name: "skew past", at: t0.Add(-301 * time.Second), want: identity.ErrSkew},
		{name: "skew future edge accepted", at: t0.Add(300 * time.Second)},
		{name: "skew past edge accepted", at: t0.Add(-300 * time.Second)},
		{name: "altered body", send: []byte("the bodY"), want: identity.ErrBadSignature},
		{name: "altered body to empty", send: []byte{}, want: identity.ErrBadSignature},
		{name: "altered path", mutate: func(r *http.Request) { r.URL.Path = "/v1/daemon/ack" }, want: identity.ErrBadSignature},
		{name: "altered query", target: "/v1/daemon/poll?a=1", mutate: func(r *http.Request) { r.URL.RawQuery = "a=2" }, want: identity.ErrBadSignature},
		{name: "query added", mutate: func(r *http.Request) { r.URL.RawQuery = "a=1" }, want: identity.ErrBadSignature},
		{name: "altered method", mutate: func(r *http.Request) { r.Method = http.MethodPut }, want: identity.ErrBadSignature},
		{name: "altered timestamp", mutate: set(identity.HeaderTimestamp, strconv.FormatInt(t0.Unix()+1, 10)), want: identity.ErrBadSignature},
		{name: "altered nonce", mutate: set(identity.HeaderNonce, "AAAAAAAAAAAAAAAAAAAAAA"), want: identity.ErrBadSignature},
		{name: "wrong key", key: other, mutate: set(identity.HeaderKeyID, k.ID()), want: identity.ErrBadSignature},
		{name: "unknown key", key: stranger, want: identity.ErrUnknownKey},
		{name: "revoked key", key: revoked, want: identity.ErrRevokedKey},
		{name: "signature not base64", mutate: set(identity.HeaderSignature, strings.Repeat("!", 86)), want: identity.ErrBadSignatureEncoding},
		{name: "signature standard alphabet", mutate: set(identity.HeaderSignature, strings.Repeat("+", 86)), want: identity.ErrBadSignatureEncoding},
		{name: "signature padded", mutate: set(identity.HeaderSignature, base64.URLEncoding.EncodeToString(make([]byte, 64))), want: identity.ErrBadSignatureEncoding},
		{name: "signature 63 bytes", mutate: set(identity.HeaderSignature, sig63), want: identity.ErrBadSignatureEncoding},
		{name: "signature 65 bytes", mutate: set(identity.HeaderSignature, sig65), want: identity.ErrBadSignatureEncoding},
		{name: "timestamp not decimal", mutate: set(identity.HeaderTimestamp, "17e8"), want: identity.ErrMalformedHeader},
		{name: "timestamp with plus sign", mutate: set(identity.HeaderTimestamp, "+1700000000"), want: identity.ErrMalformedHeader},
		{name: "timestamp with leading zero", mutate: set(identity.HeaderTimestamp, "01700000000"), want: identity.ErrMalformedHeader},
		{name: "timestamp in milliseconds", mutate: set(identity.HeaderTimestamp, "1700000000000"), want: identity.ErrSkew},
		{name: "nonce too short", mutate: set(identity.HeaderNonce, "AAAAAAAA"), want: identity.ErrMalformedHeader},
		{name: "nonce not base64url", mutate: set(identity.HeaderNonce, "AAAAAAAAAAAAAAAAAAAA/A"), want: identity.ErrMalformedHeader},
		{name: "nonce too long", mutate: set(identity.HeaderNonce, strings.Repeat("A", 100)), want: identity.ErrMalformedHeader},
		{name: "key id folded by a proxy", mutate: set(identity.HeaderKeyID, k.ID()+", "+k.ID()), want: identity.ErrMalformedHeader},
		{name: "key id too long", mutate: set(identity.HeaderKeyID, strings.Repeat("k", 200)), want: identity.ErrMalformedHeader},
	}
	for _, name := range headers {
		cases = append(cases,
			tc{name: "missing " + name, mutate: func(r *http.Request) { r.Header.Del(name) }, want: identity.ErrMissingHeader},
			tc{name: "empty " + name, mutate: set(name, ""), want: identity.ErrMissingHeader},
			tc{name: "duplicated " + name, mutate: func(r *http.Request) { r.Header.Add(name, r.Header.Get(name)) }, want: identity.ErrDuplicateHeader},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, at, target, send := c.key, c.at, c.target, c.send
			if key == nil {
				key = k
			}
			if at.IsZero() {
				at = t0
			}
			if target == "" {
				target = "/v1/daemon/poll"
			}
			if send == nil {
				send = body
			}
			req := h.signed(key, http.MethodPost, target, body, at)
			req.Body = io.NopCloser(bytes.NewReader(send))
			req.ContentLength = int64(len(send))
			if c.mutate != nil {
				c.mutate(req)
			}
			r := h.do(req)
			if c.want == nil {
				if r.err != nil {
					t.Fatalf("rejected: %v", r.err)
				}
				return
			}
			if !errors.Is(r.err, c.want) {
				t.Fatalf("got %v, want %v", r.err, c.want)
			}
			if r.status != http.StatusUnauthorized {
				t.Fatalf("status %d, want 401", r.status)
			}
		})
	}
}

func TestReplay(t *testing.T) {
	k := seedKey(t, 1)
	h := newHarness(t, identity.NewVerifier(newMemKeys(k)), t0)
	body := []byte("once")
	first := h.signed(k, http.MethodPost, "/v1/daemon/ack", body, t0)
	if r := h.do(first); r.err != nil {
		t.Fatalf("first: %v", r.err)
	}
	again := h.request(http.MethodPost, "/v1/daemon/ack", body)
	again.Header = first.Header.Clone()
	if r := h.do(again); !errors.Is(r.err, identity.ErrReplay) {
		t.Fatalf("replay: got %v, want ErrReplay", r.err)
	}
}

// A forged request carrying a real nonce must not burn that nonce, or
// anyone who sees a request in flight could get it refused.
func TestBadSignatureDoesNotRecordNonce(t *testing.T) {
	k := seedKey(t, 1)
	h := newHarness(t, identity.NewVerifier(newMemKeys(k)), t0)
	genuine := h.signed(k, http.MethodPost, "/v1/daemon/ack", []byte("real"), t0)
	forged := h.request(http.MethodPost, "/v1/daemon/ack", []byte("fake"))
	forged.Header = genuine.Header.Clone()
	if r := h.do(forged); !errors.Is(r.err, identity.ErrBadSignature) {
		t.Fatalf("forged: got %v", r.err)
	}
	if r := h.do(genuine); r.err != nil {
		t.Fatalf("genuine after forged: %v", r.err)
	}
}

func TestNonCanonicalHeaderKeyCountsAsDuplicate(t *testing.T) {
	k := seedKey(t, 1)
	v := identity.NewVerifier(newMemKeys(k))
	req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
	if err := k.SignRequest(req, nil, t0); err != nil {
		t.Fatal(err)
	}
	req.Header["x-ls-nonce"] = []string{"AAAAAAAAAAAAAAAAAAAAAA"}
	if _, err := v.Verify(context.Background(), req, nil, t0); !errors.Is(err, identity.ErrDuplicateHeader) {
		t.Fatalf("got %v, want ErrDuplicateHeader", err)
	}
}

func TestStoreFailureIsNotAnAuthFailure(t *testing.T) {
	k := seedKey(t, 1)
	keys := newMemKeys(k)
	storeDown := errors.New("database is locked")
	keys.fail = storeDown
	h := newHarness(t, identity.NewVerifier(keys), t0)
	r := h.do(h.signed(k, http.MethodPost, "/v1/daemon/poll", nil, t0))
	if !errors.Is(r.err, storeDown) || errors.Is(r.err, identity.ErrUnauthenticated) || r.status != http.StatusInternalServerError {
		t.Fatalf("got status %d, %v", r.status, r.err)
	}
}

func TestEverySentinelIsUnauthenticated(t *testing.T) {
	for _, e := range []error{
		identity.ErrMissingHeader, identity.ErrDuplicateHeader, identity.ErrMalformedHeader, identity.ErrSkew,
		identity.ErrBadSignatureEncoding, identity.ErrUnknownKey, identity.ErrRevokedKey, identity.ErrBadSignature,
		identity.ErrReplay, identity.ErrKeyIDMismatch,
	} {
		if !errors.Is(fmt.Errorf("ctx: %w", e), identity.ErrUnauthenticated) {
			t.Errorf("%v does not match ErrUnauthenticated", e)
		}
		if errors.Is(e, identity.ErrReplay) != (e == identity.ErrReplay) {
			t.Errorf("%v matches ErrReplay", e)
		}
	}
}

func TestVerifyWithKey(t *testing.T) {
	k := seedKey(t, 1)
	other := seedKey(t, 2)
	keys := newMemKeys() // nothing enrolled yet
	v := identity.NewVerifier(keys)
	hello := func(signer *identity.Key) *http.Request {
		body := []byte(signer.PublicKeyB64())
		req := httptest.NewRequest(http.MethodPost, "/v1/daemon/hello", bytes.NewReader(body))
		if err := signer.SignRequest(req, body, t0); err != nil {
			t.Fatal(err)
		}
		return req
	}
	body := []byte(k.PublicKeyB64())

	req := hello(k)
	pub, err := identity.ParsePublicKey(string(body))
	if err != nil {
		t.Fatal(err)
	}
	id, err := v.VerifyWithKey(context.Background(), pub, req, body, t0)
	if err != nil || id != k.ID() {
		t.Fatalf("enrollment: (%q, %v)", id, err)
	}
	if _, err := v.VerifyWithKey(context.Background(), pub, req, body, t0); !errors.Is(err, identity.ErrReplay) {
		t.Fatalf("enrollment replay: %v", err)
	}
	// Once stored, the same request is still a replay to Verify: one cache.
	keys.keys[k.ID()] = storedKey{pub: pub}
	if _, err := v.Verify(context.Background(), req, body, t0); !errors.Is(err, identity.ErrReplay) {
		t.Fatalf("replay through Verify: %v", err)
	}

	if _, err := v.VerifyWithKey(context.Background(), other.PublicKey(), hello(k), body, t0); !errors.Is(err, identity.ErrKeyIDMismatch) {
		t.Fatalf("other public key: %v", err)
	}
	if _, err := v.VerifyWithKey(context.Background(), ed25519.PublicKey{1, 2, 3}, hello(k), body, t0); !errors.Is(err, identity.ErrKeyIDMismatch) {
		t.Fatalf("short public key: %v", err)
	}
	// Claiming the right id but signed by another key.
	forged := hello(other)
	forged.Header.Set(identity.HeaderKeyID, k.ID())
	if _, err := v.VerifyWithKey(context.Background(), pub, forged, []byte(other.PublicKeyB64()), t0); !errors.Is(err, identity.ErrBadSignature) {
		t.Fatalf("forged enrollment: %v", err)
	}
	if _, err := v.VerifyWithKey(context.Background(), pub, hello(k), body, t0.Add(time.Hour)); !errors.Is(err, identity.ErrSkew) {
		t.Fatalf("stale enrollment: %v", err)
	}
}

func TestWithMaxSkew(t *testing.T) {
	k := seedKey(t, 1)
	v := identity.NewVerifier(newMemKeys(k), identity.WithMaxSkew(10*time.Second))
	for _, c := range []struct {
		off  time.Duration
		want error
	}{{10 * time.Second, nil}, {-10 * time.Second, nil}, {11 * time.Second, identity.ErrSkew}, {-11 * time.Second, identity.ErrSkew}} {
		req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := k.SignRequest(req, nil, t0.Add(c.off)); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(context.Background(), req, nil, t0); !errors.Is(err, c.want) {
			t.Errorf("offset %v: got %v, want %v", c.off, err, c.want)
		}
	}
}

// Every goroutine offers every request; each must be accepted exactly once.
func TestConcurrentVerify(t *testing.T) {
	const workers, requests = 8, 64
	k := seedKey(t, 1)
	v := identity.NewVerifier(newMemKeys(k))
	reqs := make([]*http.Request, requests)
	bodies := make([][]byte, requests)
	for i := range reqs {
		bodies[i] = []byte(fmt.Sprintf("body %d", i))
		reqs[i] = httptest.NewRequest(http.MethodPost, "/v1/daemon/poll?i="+strconv.Itoa(i), nil)
		if err := k.SignRequest(reqs[i], bodies[i], t0); err != nil {
			t.Fatal(err)
		}
	}
	accepted := make([]atomic.Int32, requests)
	var wg sync.WaitGroup
	errs := make(chan error, workers*requests)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < requests; j++ {
				i := (j + w*7) % requests
				_, err := v.Verify(context.Background(), reqs[i], bodies[i], t0)
				switch {
				case err == nil:
					accepted[i].Add(1)
				case !errors.Is(err, identity.ErrReplay):
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range accepted {
		if n := accepted[i].Load(); n != 1 {
			t.Errorf("request %d accepted %d times", i, n)
		}
	}
}

// A full cache must refuse, not forget: after eviction, the evicted
// request's replay is still refused.
func TestFullNonceCacheRefusesOldReplays(t *testing.T) {
	k := seedKey(t, 1)
	v := identity.NewVerifier(newMemKeys(k), identity.WithNonceCapacity(4))
	var first *http.Request
	for i := 0; i < 10; i++ {
		req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := k.SignRequest(req, nil, t0.Add(time.Duration(i-20)*time.Second)); err != nil {
			t.Fatal(err)
		}
		if _, err := v.Verify(context.Background(), req, nil, t0); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if first == nil {
			first = req
		}
	}
	if _, err := v.Verify(context.Background(), first, nil, t0); !errors.Is(err, identity.ErrReplay) {
		t.Fatalf("replay of an evicted nonce: %v", err)
	}
	// Fresh requests still pass.
	req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
	if err := k.SignRequest(req, nil, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), req, nil, t0); err != nil {
		t.Fatalf("fresh request: %v", err)
	}
}

// memLedger is an in-memory NonceLedger that two verifiers share, as two
// replicas share the store's.
type memLedger struct {
	mu   sync.Mutex
	seen map[string]time.Time
	err  error
}

func (l *memLedger) UseNonce(_ context.Context, keyID, nonce string, expires time.Time) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return false, l.err
	}
	k := keyID + "\n" + nonce
	if _, ok := l.seen[k]; ok {
		return false, nil
	}
	l.seen[k] = expires
	return true, nil
}

func TestNonceLedgerSharedByVerifiers(t *testing.T) {
	k := seedKey(t, 1)
	keys := newMemKeys(k)
	ledger := &memLedger{seen: map[string]time.Time{}}
	v1 := identity.NewVerifier(keys, identity.WithNonceLedger(ledger))
	v2 := identity.NewVerifier(keys, identity.WithNonceLedger(ledger))
	body := []byte("poll")
	req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", bytes.NewReader(body))
	if err := k.SignRequest(req, body, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := v1.Verify(context.Background(), req, body, t0); err != nil {
		t.Fatalf("first: %v", err)
	}
	if _, err := v2.Verify(context.Background(), req, body, t0); !errors.Is(err, identity.ErrReplay) {
		t.Fatalf("replayed to the other verifier: %v", err)
	}
	for _, exp := range ledger.seen {
		if !exp.After(t0.Add(identity.DefaultMaxSkew)) {
			t.Fatalf("kept until %v, before the timestamp leaves the window", exp)
		}
	}
	// A ledger that cannot record refuses the request: never a replay let through.
	ledger.err = errors.New("database down")
	req2 := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", bytes.NewReader(body))
	if err := k.SignRequest(req2, body, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := v2.Verify(context.Background(), req2, body, t0); err == nil {
		t.Fatal("accepted while the ledger was down")
	}
}

// Begin decides everything a stranger can get wrong from the headers alone,
// so a server can refuse before it reads a byte of the body; Finish then
// checks the body those headers signed.
func TestBeginRefusesBeforeTheBodyAndFinishChecksIt(t *testing.T) {
	k, stranger := seedKey(t, 1), seedKey(t, 2)
	v := identity.NewVerifier(newMemKeys(k))
	body := []byte("the body")
	newReq := func(signer *identity.Key) *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := signer.SignRequest(req, body, t0); err != nil {
			t.Fatal(err)
		}
		return req
	}
	if _, err := v.Begin(context.Background(), newReq(stranger), t0); !errors.Is(err, identity.ErrUnknownKey) {
		t.Fatalf("Begin with an unknown key: %v, want ErrUnknownKey", err)
	}
	if _, err := v.Begin(context.Background(), newReq(k), t0.Add(time.Hour)); !errors.Is(err, identity.ErrSkew) {
		t.Fatalf("Begin an hour late: %v, want ErrSkew", err)
	}
	p, err := v.Begin(context.Background(), newReq(k), t0)
	if err != nil || p.KeyID() != k.ID() {
		t.Fatalf("Begin: %v, key %q", err, p.KeyID())
	}
	if _, err := p.Finish(context.Background(), []byte("another body")); !errors.Is(err, identity.ErrBadSignature) {
		t.Fatalf("Finish over another body: %v, want ErrBadSignature", err)
	}
	p, _ = v.Begin(context.Background(), newReq(k), t0)
	if kid, err := p.Finish(context.Background(), body); err != nil || kid != k.ID() {
		t.Fatalf("Finish over the signed body: %q, %v", kid, err)
	}
	// BeginWithKey checks the claimed key id against the key carried along.
	if _, err := v.BeginWithKey(stranger.PublicKey(), newReq(k), t0); !errors.Is(err, identity.ErrKeyIDMismatch) {
		t.Fatalf("BeginWithKey with another key: %v, want ErrKeyIDMismatch", err)
	}
}

// One key past its rate is throttled on its own: a *ThrottledError, not an
// authentication failure; another key at the same instant is not.
func TestKeyRateThrottlesOnlyThatKey(t *testing.T) {
	flood, other := seedKey(t, 1), seedKey(t, 2)
	v := identity.NewVerifier(newMemKeys(flood, other), identity.WithKeyRate(1, 3))
	verify := func(k *identity.Key, now time.Time) error {
		req := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := k.SignRequest(req, nil, now); err != nil {
			t.Fatal(err)
		}
		_, err := v.Verify(context.Background(), req, nil, now)
		return err
	}
	for i := range 3 {
		if err := verify(flood, t0); err != nil {
			t.Fatalf("within the burst, %d: %v", i, err)
		}
	}
	err := verify(flood, t0)
	var te *identity.ThrottledError
	if !errors.As(err, &te) || !errors.Is(err, identity.ErrThrottled) || errors.Is(err, identity.ErrUnauthenticated) {
		t.Fatalf("past the burst: %v", err)
	}
	if te.RetryAfter != time.Second || te.KeyID != flood.ID() {
		t.Fatalf("throttled: %+v", te)
	}
	if err := verify(other, t0); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if err := verify(flood, t0.Add(time.Second)); err != nil {
		t.Fatalf("a second later: %v", err)
	}
}

// A request the ledger refuses as a replay gives its token back, so a
// stranger replaying a key's captured requests cannot get it throttled.
func TestLedgerRefusedReplayCostsNoToken(t *testing.T) {
	k := seedKey(t, 1)
	keys := newMemKeys(k)
	ledger := &memLedger{seen: map[string]time.Time{}}
	elsewhere := identity.NewVerifier(keys, identity.WithNonceLedger(ledger))
	v := identity.NewVerifier(keys, identity.WithNonceLedger(ledger), identity.WithKeyRate(1, 1))
	captured := make([]*http.Request, 5)
	for i := range captured {
		captured[i] = httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
		if err := k.SignRequest(captured[i], nil, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := elsewhere.Verify(context.Background(), captured[i], nil, t0); err != nil {
			t.Fatal(err)
		}
	}
	for i, req := range captured {
		if _, err := v.Verify(context.Background(), req, nil, t0); !errors.Is(err, identity.ErrReplay) {
			t.Fatalf("replay %d: %v, want ErrReplay", i, err)
		}
	}
	fresh := httptest.NewRequest(http.MethodPost, "/v1/daemon/poll", nil)
	if err := k.SignRequest(fresh, nil, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(context.Background(), fresh, nil, t0); err != nil {
		t.Fatalf("the key's own request after the replays: %v", err)
	}
}
