package uplink_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/daemon/uplink"
	"nymph/identity"
	"nymph/messages"
)

// keyTable is a KeyLookup over a fixed set of keys, with revocation.
type keyTable struct {
	mu      sync.Mutex
	keys    map[string]ed25519.PublicKey
	revoked map[string]bool
}

func newKeyTable(ks ...*identity.Key) *keyTable {
	t := &keyTable{keys: map[string]ed25519.PublicKey{}, revoked: map[string]bool{}}
	for _, k := range ks {
		t.keys[k.ID()] = k.PublicKey()
	}
	return t
}

func (t *keyTable) LookupKey(_ context.Context, id string) (ed25519.PublicKey, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	pub, ok := t.keys[id]
	if !ok {
		return nil, false, identity.ErrUnknownKey
	}
	return pub, t.revoked[id], nil
}

func (t *keyTable) add(k *identity.Key) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keys[k.ID()] = k.PublicKey()
}

func (t *keyTable) revoke(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.revoked[id] = true
}

func newKey(t *testing.T) *identity.Key {
	t.Helper()
	k, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func hasXLS(h http.Header) bool {
	for name := range h {
		if strings.HasPrefix(strings.ToLower(name), "x-ls-") {
			return true
		}
	}
	return false
}

func TestHelloCarriesThePublicKeyAndIsSignedByIt(t *testing.T) {
	key := newKey(t)
	v := identity.NewVerifier(nil)
	var verr error
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		var req messages.HelloRequest
		if err := messages.Unmarshal(body, &req); err != nil {
			verr = err
		} else if pub, err := identity.ParsePublicKey(req.PublicKey); err != nil {
			verr = err
		} else {
			_, verr = v.VerifyWithKey(r.Context(), pub, r, body, time.Now())
		}
		writeMsgpack(t, w, &messages.HelloResponse{})
	})
	c, err := uplink.New(srv.URL, uplink.WithToken("boot"), uplink.WithSigner(key))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Hello(context.Background(), &messages.HelloRequest{MachineID: "m", PublicKey: "stale"}); err != nil {
		t.Fatal(err)
	}
	if verr != nil {
		t.Fatalf("enrollment hello does not verify against its own public_key: %v", verr)
	}
	r, _ := s.last()
	if r.Header.Get("Authorization") != "Bearer boot" {
		t.Fatalf("without an enrollment token the hello keeps the bootstrap bearer, got %q", r.Header.Get("Authorization"))
	}
}

// helloScript answers hellos: enroll_token_required unless the bearer is
// the enrollment token, and counts what it saw.
type helloScript struct {
	mu      sync.Mutex
	bearers []string
	enroll  string
	known   bool // the key counts as enrolled: no token needed
}

func (h *helloScript) handle(t *testing.T) func(w http.ResponseWriter, r *http.Request, body []byte) {
	return func(w http.ResponseWriter, r *http.Request, body []byte) {
		h.mu.Lock()
		defer h.mu.Unlock()
		auth := r.Header.Get("Authorization")
		h.bearers = append(h.bearers, auth)
		if r.URL.Path != uplink.PathHello {
			writeMsgpack(t, w, &messages.PollResponse{})
			return
		}
		if !h.known && auth != "Bearer "+h.enroll {
			writeMsgpack(t, w, &messages.HelloResponse{Reject: &messages.Reject{Code: messages.RejectEnrollTokenRequired, Message: "x"}})
			return
		}
		h.known = true
		kid := r.Header.Get(identity.HeaderKeyID)
		writeMsgpack(t, w, &messages.HelloResponse{KeyID: &kid})
	}
}

func (h *helloScript) seen() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.bearers...)
}

func TestEnrollTokenEagerThenDropped(t *testing.T) {
	hs := &helloScript{enroll: "dle_abc"}
	srv, _ := server(t, hs.handle(t))
	c, _ := uplink.New(srv.URL, uplink.WithToken("boot"), uplink.WithSigner(newKey(t)), uplink.WithEnrollToken("dle_abc\n", true))
	ctx := context.Background()
	for range 2 {
		resp, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"})
		if err != nil || resp.Reject != nil {
			t.Fatalf("%+v %v", resp, err)
		}
	}
	if _, err := c.Poll(ctx, &messages.PollRequest{}); err != nil {
		t.Fatal(err)
	}
	got := hs.seen()
	want := []string{"Bearer dle_abc", "Bearer boot", "Bearer boot"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("bearers %q, want %q (token on the first hello only)", got, want)
	}
}

func TestEnrollTokenLazyOnlyAfterEnrollTokenRequired(t *testing.T) {
	ctx := context.Background()
	t.Run("not enrolled", func(t *testing.T) {
		hs := &helloScript{enroll: "dle_abc"}
		srv, _ := server(t, hs.handle(t))
		c, _ := uplink.New(srv.URL, uplink.WithSigner(newKey(t)), uplink.WithEnrollToken("dle_abc", false))
		resp, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"})
		if err != nil || resp.Reject != nil || resp.KeyID == nil {
			t.Fatalf("%+v %v", resp, err)
		}
		if got := hs.seen(); len(got) != 2 || got[0] != "" || got[1] != "Bearer dle_abc" {
			t.Fatalf("bearers %q: want a signed hello alone, then one with the token", got)
		}
	})
	t.Run("already enrolled", func(t *testing.T) {
		hs := &helloScript{enroll: "dle_abc", known: true}
		srv, _ := server(t, hs.handle(t))
		c, _ := uplink.New(srv.URL, uplink.WithSigner(newKey(t)), uplink.WithEnrollToken("dle_abc", false))
		if _, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"}); err != nil {
			t.Fatal(err)
		}
		if got := hs.seen(); len(got) != 1 || got[0] != "" {
			t.Fatalf("bearers %q: an enrolled key never presents the token", got)
		}
	})
	t.Run("no token", func(t *testing.T) {
		hs := &helloScript{}
		srv, _ := server(t, hs.handle(t))
		c, _ := uplink.New(srv.URL, uplink.WithSigner(newKey(t)))
		resp, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"})
		if err != nil || resp.Reject == nil || resp.Reject.Code != messages.RejectEnrollTokenRequired {
			t.Fatalf("%+v %v", resp, err)
		}
		if got := hs.seen(); len(got) != 1 {
			t.Fatalf("bearers %q", got)
		}
	})
}

func TestWithoutSignerNoSignatureHeaders(t *testing.T) {
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if r.URL.Path == uplink.PathHello {
			writeMsgpack(t, w, &messages.HelloResponse{})
			return
		}
		writeMsgpack(t, w, &messages.PollResponse{})
	})
	c, _ := uplink.New(srv.URL, uplink.WithToken("boot"))
	ctx := context.Background()
	if _, err := c.Hello(ctx, &messages.HelloRequest{MachineID: "m"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Poll(ctx, &messages.PollRequest{}); err != nil {
		t.Fatal(err)
	}
	_ = c.Ack(ctx, &messages.Ack{InvocationID: "i", State: "succeeded"})
	_ = c.ExecResult(ctx, "e", &messages.ExecResult{})
	_ = c.PostChunk(ctx, "/v1/daemon/exec/e/chunk", []byte("x"))
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.reqs {
		if hasXLS(r.Header) || r.Header.Get("Authorization") != "Bearer boot" {
			t.Fatalf("request %d (%s): headers %v", i, r.URL.Path, r.Header)
		}
	}
	var hello messages.HelloRequest
	if err := messages.Unmarshal(s.body[0], &hello); err != nil || hello.PublicKey != "" {
		t.Fatalf("hello without identity carries public_key %q (%v)", hello.PublicKey, err)
	}
}

// swapSigner is a RotatingSigner whose key the test replaces.
type swapSigner struct {
	mu      sync.Mutex
	key     *identity.Key
	settled chan struct{}
}

func (s *swapSigner) Key() *identity.Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key
}

func (s *swapSigner) SignRequest(req *http.Request, body []byte, now time.Time) error {
	return s.Key().SignRequest(req, body, now)
}

func (s *swapSigner) Replaced(ctx context.Context, keyID string) bool {
	select {
	case <-s.settled:
	case <-ctx.Done():
		return false
	}
	return s.Key().ID() != keyID
}

func TestUnauthorizedAfterRotationIsSignedAgainOnce(t *testing.T) {
	oldKey, newK := newKey(t), newKey(t)
	table := newKeyTable(oldKey)
	table.revoke(oldKey.ID())
	v := identity.NewVerifier(table)
	var calls atomic.Int32
	refused := make(chan struct{})
	var once sync.Once
	srv, s := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		calls.Add(1)
		if _, err := v.Verify(r.Context(), r, body, time.Now()); err != nil {
			once.Do(func() { close(refused) })
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		writeMsgpack(t, w, &messages.PollResponse{})
	})
	sig := &swapSigner{key: oldKey, settled: make(chan struct{})}
	c, _ := uplink.New(srv.URL, uplink.WithSigner(sig))
	// The control plane already retired the old key; the daemon learns of
	// the acceptance a moment later.
	table.add(newK)
	go func() {
		<-refused
		sig.mu.Lock()
		sig.key = newK
		sig.mu.Unlock()
		close(sig.settled)
	}()
	if _, err := c.Poll(context.Background(), &messages.PollRequest{}); err != nil {
		t.Fatalf("poll in the rotation window failed: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d requests, want the refused one and its re-signed copy", calls.Load())
	}
	r, _ := s.last()
	if r.Header.Get(identity.HeaderKeyID) != newK.ID() {
		t.Fatal("the retry is not signed by the new key")
	}

	// A 401 whose key was not replaced is final, and not retried.
	table.revoke(newK.ID())
	calls.Store(0)
	_, err := c.Poll(context.Background(), &messages.PollRequest{})
	var se *uplink.StatusError
	if !errors.As(err, &se) || se.Status != http.StatusUnauthorized || calls.Load() != 1 {
		t.Fatalf("err %v after %d calls, want one 401", err, calls.Load())
	}
}

func TestRotateKeyIsSignedByTheOutgoingKey(t *testing.T) {
	outgoing, current := newKey(t), newKey(t)
	table := newKeyTable(outgoing, current)
	v := identity.NewVerifier(table)
	var calls atomic.Int32
	srv, _ := server(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		calls.Add(1)
		kid, err := v.Verify(r.Context(), r, body, time.Now())
		if err != nil || kid != outgoing.ID() || r.URL.Path != uplink.PathKeys {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		var req messages.KeysRequest
		if err := messages.Unmarshal(body, &req); err != nil {
			t.Error(err)
		}
		writeMsgpack(t, w, &messages.KeysResponse{KeyID: &req.KeyID})
	})
	sig := &swapSigner{key: current, settled: make(chan struct{})}
	close(sig.settled)
	c, _ := uplink.New(srv.URL, uplink.WithSigner(sig))
	resp, err := c.RotateKey(context.Background(), &messages.KeysRequest{WorkerID: "w", KeyID: "k_new", PublicKey: "p"}, outgoing)
	if err != nil || resp.KeyID == nil || *resp.KeyID != "k_new" {
		t.Fatalf("%+v %v", resp, err)
	}
	// Refused: no retry with the client's own key.
	table.revoke(outgoing.ID())
	calls.Store(0)
	if _, err := c.RotateKey(context.Background(), &messages.KeysRequest{WorkerID: "w"}, outgoing); err == nil || calls.Load() != 1 {
		t.Fatalf("err %v after %d calls", err, calls.Load())
	}
	if _, err := c.RotateKey(context.Background(), &messages.KeysRequest{}, nil); err == nil {
		t.Fatal("no outgoing key accepted")
	}
}
