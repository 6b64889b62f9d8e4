package controlplane

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// send does one request over the env's TLS client. Any status is returned;
// a 5xx fails the test, since no input may produce one.
func (e *tlsEnv) send(req *http.Request) resp {
	e.t.Helper()
	r, err := e.client.Do(req)
	if err != nil {
		e.t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		e.t.Fatalf("read body: %v", err)
	}
	if r.StatusCode >= 500 {
		e.t.Fatalf("%s %s: %d %q", req.Method, req.URL.Path, r.StatusCode, b)
	}
	return resp{status: r.StatusCode, body: b, header: r.Header}
}

// post builds a msgpack POST; token "" sends no Authorization.
func (e *tlsEnv) post(path, token string, body []byte) *http.Request {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+path, bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Content-Type", messages.ContentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req
}

// signed builds a POST signed by key at the server's current time.
func (e *tlsEnv) signed(key *identity.Key, path, token string, body []byte) *http.Request {
	e.t.Helper()
	req := e.post(path, token, body)
	if err := key.SignRequest(req, body, e.clock.Now()); err != nil {
		e.t.Fatal(err)
	}
	return req
}

func (e *tlsEnv) op(method, path string, body any) resp {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(mustJSON(e.t, body))
	}
	req, err := http.NewRequest(method, e.url+path, rd)
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	req.Header.Set("Content-Type", "application/json")
	return e.send(req)
}

// enrollToken mints a one-shot enrollment token through the operator API.
func (e *tlsEnv) enrollToken(ttl time.Duration) string {
	e.t.Helper()
	tok := expectJS[operatorapi.TokenResponse](e.t, e.op(http.MethodPost, "/v1/tokens",
		operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll, TTLS: int64(ttl / time.Second)}), http.StatusCreated, "mint token")
	if !strings.HasPrefix(tok.Token, "dle_") || tok.ExpiresAt == nil {
		e.t.Fatalf("token %+v", tok)
	}
	return tok.Token
}

func (e *tlsEnv) getWorker(id string) operatorapi.Worker {
	e.t.Helper()
	return expectJS[operatorapi.Worker](e.t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id, nil), http.StatusOK, "get worker")
}

func mustMP(t testing.TB, v any) []byte {
	t.Helper()
	b, err := messages.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func newKey(t testing.TB) *identity.Key {
	t.Helper()
	k, err := identity.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// host is a daemon with an identity, driven by hand.
type host struct {
	e       *tlsEnv
	machine string
	label   string
	key     *identity.Key
	worker  string
	cursor  string
}

func (e *tlsEnv) newHost(machine, label string) *host {
	return &host{e: e, machine: machine, label: label, key: newKey(e.t)}
}

func (h *host) helloBody() []byte {
	req := helloReq(h.machine, h.label)
	req.PublicKey = h.key.PublicKeyB64()
	return mustMP(h.e.t, req)
}

// hello sends a hello signed by the host's key with token as the bearer.
func (h *host) hello(token string) messages.HelloResponse {
	h.e.t.Helper()
	r := h.e.send(h.e.signed(h.key, "/v1/daemon/hello", token, h.helloBody()))
	if r.status != http.StatusOK {
		h.e.t.Fatalf("hello: %d %q", r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](h.e.t, r)
	if hr.Reject == nil {
		h.worker, h.cursor = *hr.WorkerID, *hr.Cursor
	}
	return hr
}

// enroll enrolls the host with a fresh token and checks the answer.
func (h *host) enroll() {
	h.e.t.Helper()
	hr := h.hello(h.e.enrollToken(time.Hour))
	if hr.Reject != nil || hr.KeyID == nil || *hr.KeyID != h.key.ID() {
		h.e.t.Fatalf("enrollment: %+v reject %+v", hr, hr.Reject)
	}
}

func (h *host) pollBody() []byte {
	return mustMP(h.e.t, &messages.PollRequest{WorkerID: h.worker, Cursor: &h.cursor})
}

// poll sends a signed poll and returns the raw answer.
func (h *host) poll() resp {
	h.e.t.Helper()
	return h.e.send(h.e.signed(h.key, "/v1/daemon/poll", "", h.pollBody()))
}

func (h *host) mustPoll() messages.PollResponse {
	h.e.t.Helper()
	r := h.poll()
	if r.status != http.StatusOK {
		h.e.t.Fatalf("signed poll: %d %q", r.status, r.body)
	}
	p := decodeMP[messages.PollResponse](h.e.t, r)
	if p.Cursor != nil {
		h.cursor = *p.Cursor
	}
	return p
}

func wantReject(t testing.TB, hr messages.HelloResponse, code string) {
	t.Helper()
	if hr.Reject == nil || hr.Reject.Code != code {
		t.Fatalf("want reject %s, got %+v (reject %+v)", code, hr, hr.Reject)
	}
	if hr.WorkerID != nil || hr.KeyID != nil {
		t.Fatalf("a rejected hello carries worker %v key %v", hr.WorkerID, hr.KeyID)
	}
}

func want401(t testing.TB, r resp, what string) {
	t.Helper()
	if r.status != http.StatusUnauthorized {
		t.Fatalf("%s: want 401, got %d %q", what, r.status, r.body)
	}
	if string(r.body) != "unauthorized\n" {
		t.Fatalf("%s: the 401 body says more than it should: %q", what, r.body)
	}
}

func TestEnrollmentAndSignedPollingOverTLS(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("host-a", "gpu")
	tok := e.enrollToken(time.Hour)
	hr := h.hello(tok)
	if hr.Reject != nil || hr.KeyID == nil || *hr.KeyID != h.key.ID() || hr.WorkerID == nil {
		t.Fatalf("enrollment: %+v reject %+v", hr, hr.Reject)
	}
	p := h.mustPoll()
	if len(p.Commands) != 0 {
		t.Fatalf("commands %v", commandsOf(p))
	}
	w := e.getWorker(h.worker)
	if len(w.Keys) != 1 || w.Keys[0].KeyID != h.key.ID() || w.Keys[0].RevokedAt != nil || w.Keys[0].CreatedAt.IsZero() {
		t.Fatalf("worker keys %+v", w.Keys)
	}
	list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
	if len(list.Workers) != 1 || len(list.Workers[0].Keys) != 1 {
		t.Fatalf("list %+v", list)
	}
	if strings.Contains(string(e.op(http.MethodGet, "/v1/namespaces/default/workers/"+h.worker, nil).body), h.key.PublicKeyB64()) {
		t.Fatal("the worker view shows the public key; it lists ids only")
	}

	// A restart: the signed hello needs no token, and a leftover (consumed)
	// token beside it is ignored rather than refused.
	first := h.worker
	for _, bearer := range []string{"", tok} {
		hr = h.hello(bearer)
		if hr.Reject != nil || *hr.WorkerID != first || hr.KeyID != nil {
			t.Fatalf("re-hello with bearer %q: %+v reject %+v", bearer, hr, hr.Reject)
		}
	}

	// Signed ack and event pass the same guard.
	ack := mustMP(t, &messages.Ack{InvocationID: "inv-1", State: messages.StateFailed, WorkerID: h.worker,
		Error: &messages.AckError{Type: "T", Message: "m"}})
	// Past the guard, the ack route answers that it never handed out inv-1.
	if r := e.send(e.signed(h.key, "/v1/daemon/ack", "", ack)); r.status != http.StatusNotFound {
		t.Fatalf("signed ack: %d %q", r.status, r.body)
	}
	// The event route takes the poster from the key (the body names no
	// worker) and answers, like the ack route, that inv-1 is unknown.
	ev := mustMP(t, map[string]any{"invocation_id": "inv-1", "kind": messages.EventInvocationLog,
		"data": map[string]any{"stream": "stdout", "seq": 1, "data": []byte("x")}})
	if r := e.send(e.signed(h.key, "/v1/daemon/event", "", ev)); r.status != http.StatusNotFound || errField(t, r) != "invocation_id" {
		t.Fatalf("signed event: %d %q", r.status, r.body)
	}
	// The exec callbacks stay authenticated by their 128-bit exec id.
	id := newExecID()
	if raw, err := hex.DecodeString(id); err != nil || len(raw) < 16 || newExecID() == id {
		t.Fatalf("exec id %q is not 128 random bits", id)
	}
}

func TestHelloRejectsEachCode(t *testing.T) {
	t.Run(messages.RejectEnrollTokenRequired, func(t *testing.T) {
		e := newTLSEnv(t)
		h := e.newHost("m", "l")
		// Signed by a key nobody enrolled, no token.
		wantReject(t, h.hello(""), messages.RejectEnrollTokenRequired)
		// public_key without signature or token, even with the bootstrap bearer.
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(e.post("/v1/daemon/hello", testDaemon, h.helloBody()))),
			messages.RejectEnrollTokenRequired)
		wantReject(t, h.hello(testDaemon), messages.RejectEnrollTokenRequired)
	})
	t.Run(messages.RejectInvalidEnrollToken, func(t *testing.T) {
		e := newTLSEnv(t)
		h := e.newHost("m", "l")
		wantReject(t, h.hello("dle_not-a-token"), messages.RejectInvalidEnrollToken)
		wantReject(t, h.hello("dle_"+strings.Repeat("x", 600)), messages.RejectInvalidEnrollToken)
	})
	t.Run(messages.RejectEnrollTokenConsumed, func(t *testing.T) {
		e := newTLSEnv(t)
		tok := e.enrollToken(time.Hour)
		a, b := e.newHost("a", "l"), e.newHost("b", "l")
		if hr := a.hello(tok); hr.Reject != nil {
			t.Fatalf("first use: %+v", hr.Reject)
		}
		wantReject(t, b.hello(tok), messages.RejectEnrollTokenConsumed)
	})
	t.Run(messages.RejectEnrollTokenExpired, func(t *testing.T) {
		e := newTLSEnv(t)
		tok := e.enrollToken(time.Minute)
		e.clock.Advance(time.Minute)
		wantReject(t, e.newHost("m", "l").hello(tok), messages.RejectEnrollTokenExpired)
	})
	t.Run(messages.RejectEnrollSignatureRequired, func(t *testing.T) {
		e := newTLSEnv(t)
		tok := e.enrollToken(time.Hour)
		h := e.newHost("m", "l")
		hello := func(req *http.Request) messages.HelloResponse {
			return decodeMP[messages.HelloResponse](t, e.send(req))
		}
		// public_key and token, no signature.
		wantReject(t, hello(e.post("/v1/daemon/hello", tok, h.helloBody())), messages.RejectEnrollSignatureRequired)
		// A token without public_key.
		wantReject(t, hello(e.post("/v1/daemon/hello", tok, mustMP(t, helloReq("m", "l")))), messages.RejectEnrollSignatureRequired)
		// Three of the four headers.
		req := e.signed(h.key, "/v1/daemon/hello", tok, h.helloBody())
		req.Header.Del(identity.HeaderNonce)
		wantReject(t, hello(req), messages.RejectEnrollSignatureRequired)
		// None of that used the token up.
		if hr := h.hello(tok); hr.Reject != nil {
			t.Fatalf("token after refusals: %+v", hr.Reject)
		}
	})
	t.Run(messages.RejectKeyIDMismatch, func(t *testing.T) {
		e := newTLSEnv(t)
		tok := e.enrollToken(time.Hour)
		h := e.newHost("m", "l")
		other := newKey(t)
		// public_key of one key, signed (and named) by another.
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(e.signed(other, "/v1/daemon/hello", tok, h.helloBody()))),
			messages.RejectKeyIDMismatch)
		// A public_key that is not a key at all.
		for _, pk := range []string{"not base64!", base64.RawURLEncoding.EncodeToString(make([]byte, 31)), h.key.PublicKeyB64() + "=="} {
			req := helloReq("m", "l")
			req.PublicKey = pk
			body := mustMP(t, req)
			wantReject(t, decodeMP[messages.HelloResponse](t, e.send(e.signed(h.key, "/v1/daemon/hello", tok, body))),
				messages.RejectKeyIDMismatch)
		}
		// An enrolled key speaking for another daemon.
		h.enroll()
		impostor := &host{e: e, machine: "m", label: "other-label", key: h.key}
		wantReject(t, impostor.hello(""), messages.RejectKeyIDMismatch)
	})
	t.Run(messages.RejectEnrollSignatureInvalid, func(t *testing.T) {
		e := newTLSEnv(t)
		tok := e.enrollToken(time.Hour)
		h := e.newHost("m", "l")
		body := h.helloBody()
		req := e.signed(h.key, "/v1/daemon/hello", tok, body)
		altered := helloReq("m", "another-label")
		altered.PublicKey = h.key.PublicKeyB64()
		req.Body = io.NopCloser(bytes.NewReader(mustMP(t, altered)))
		req.ContentLength = -1
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(req)), messages.RejectEnrollSignatureInvalid)
		// Outside the clock skew.
		stale := e.post("/v1/daemon/hello", tok, body)
		if err := h.key.SignRequest(stale, body, e.clock.Now().Add(-identity.DefaultMaxSkew-time.Second)); err != nil {
			t.Fatal(err)
		}
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(stale)), messages.RejectEnrollSignatureInvalid)
		// A replayed enrollment. The original verified but was turned away
		// (another protocol), so the token is still good for the copy.
		other := helloReq("m", "l")
		other.PublicKey = h.key.PublicKeyB64()
		other.Versions.Protocol = str("0")
		otherBody := mustMP(t, other)
		orig := e.signed(h.key, "/v1/daemon/hello", tok, otherBody)
		replay := e.post("/v1/daemon/hello", tok, otherBody)
		replay.Header = orig.Header.Clone()
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(orig)), messages.RejectProtocolMismatch)
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(replay)), messages.RejectEnrollSignatureInvalid)
		// The replay of a re-hello too.
		h.enroll()
		orig = e.signed(h.key, "/v1/daemon/hello", "", body)
		replay = e.post("/v1/daemon/hello", "", body)
		replay.Header = orig.Header.Clone()
		if hr := decodeMP[messages.HelloResponse](t, e.send(orig)); hr.Reject != nil {
			t.Fatalf("re-hello: %+v", hr.Reject)
		}
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(replay)), messages.RejectEnrollSignatureInvalid)
		if !strings.Contains(e.log.String(), `"reason":"replay"`) {
			t.Fatal("the replay's reason is not in the log")
		}
	})
	t.Run(messages.RejectEnrollmentSignatureRequired, func(t *testing.T) {
		e := newTLSEnv(t)
		h := e.newHost("m", "l")
		h.enroll()
		// The enrolled daemon falls back to its bearer.
		legacy := decodeMP[messages.HelloResponse](t, e.send(e.post("/v1/daemon/hello", testDaemon, mustMP(t, helloReq("m", "l")))))
		wantReject(t, legacy, messages.RejectEnrollmentSignatureRequired)
		// With public_key but unsigned: its bearer is checked first (401,
		// the body unread), then the reject.
		if r := e.send(e.post("/v1/daemon/hello", "", h.helloBody())); r.status != http.StatusUnauthorized {
			t.Fatalf("unsigned hello without a bearer: %d %q", r.status, r.body)
		}
		wantReject(t, decodeMP[messages.HelloResponse](t, e.send(e.post("/v1/daemon/hello", testDaemon, h.helloBody()))),
			messages.RejectEnrollmentSignatureRequired)
		// Another daemon keeps its bearer-only hello.
		if r := e.send(e.post("/v1/daemon/hello", testDaemon, mustMP(t, helloReq("m", "other")))); decodeMP[messages.HelloResponse](t, r).Reject != nil {
			t.Fatalf("legacy hello of an unenrolled daemon: %q", r.body)
		}
	})
}

func TestOneEnrollmentTokenRacedByTwoHosts(t *testing.T) {
	e := newTLSEnv(t)
	for round := range 4 {
		tok := e.enrollToken(time.Hour)
		hosts := []*host{e.newHost(fmt.Sprintf("a%d", round), "l"), e.newHost(fmt.Sprintf("b%d", round), "l")}
		reqs := []*http.Request{
			e.signed(hosts[0].key, "/v1/daemon/hello", tok, hosts[0].helloBody()),
			e.signed(hosts[1].key, "/v1/daemon/hello", tok, hosts[1].helloBody()),
		}
		out := make([]messages.HelloResponse, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range reqs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				r, err := e.client.Do(reqs[i])
				if err != nil {
					t.Errorf("hello: %v", err)
					return
				}
				defer r.Body.Close()
				b, _ := io.ReadAll(r.Body)
				if err := messages.Unmarshal(b, &out[i]); err != nil || r.StatusCode != http.StatusOK {
					t.Errorf("hello: %d %q %v", r.StatusCode, b, err)
				}
			}()
		}
		close(start)
		wg.Wait()
		enrolled, refused := 0, 0
		for _, hr := range out {
			switch {
			case hr.Reject == nil && hr.KeyID != nil:
				enrolled++
			case hr.Reject != nil && hr.Reject.Code == messages.RejectEnrollTokenConsumed:
				refused++
			}
		}
		if enrolled != 1 || refused != 1 {
			t.Fatalf("round %d: %d enrolled, %d refused: %+v", round, enrolled, refused, out)
		}
	}
	// The losers never got a worker row.
	list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
	if len(list.Workers) != 4 {
		t.Fatalf("%d workers after 4 races", len(list.Workers))
	}
	for _, w := range list.Workers {
		if len(w.Keys) != 1 {
			t.Fatalf("worker %s keys %+v", w.ID, w.Keys)
		}
	}
}

func TestSignedRequestTampering(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("m", "l")
	h.enroll()
	body := h.pollBody()

	// A captured request, replayed byte for byte.
	good := e.signed(h.key, "/v1/daemon/poll", "", body)
	captured := good.Header.Clone()
	if r := e.send(good); r.status != http.StatusOK {
		t.Fatalf("signed poll: %d %q", r.status, r.body)
	}
	replay := e.post("/v1/daemon/poll", "", body)
	replay.Header = captured
	want401(t, e.send(replay), "replay")

	// Altered body, path, query and timestamp.
	req := e.signed(h.key, "/v1/daemon/poll", "", body)
	req.Body = io.NopCloser(bytes.NewReader(mustMP(t, &messages.PollRequest{WorkerID: h.worker, TimeoutS: 1})))
	req.ContentLength = -1
	want401(t, e.send(req), "altered body")

	ack := mustMP(t, &messages.Ack{InvocationID: "i", State: messages.StateFailed})
	req = e.signed(h.key, "/v1/daemon/event", "", ack)
	req.URL.Path = "/v1/daemon/ack"
	want401(t, e.send(req), "altered path")

	req = e.signed(h.key, "/v1/daemon/poll", "", body)
	req.URL.RawQuery = "x=1"
	want401(t, e.send(req), "added query")

	req = e.signed(h.key, "/v1/daemon/poll", "", body)
	ts := req.Header.Get(identity.HeaderTimestamp)
	req.Header.Set(identity.HeaderTimestamp, ts[:len(ts)-1]+string("0123456789"[(ts[len(ts)-1]-'0'+1)%10]))
	want401(t, e.send(req), "altered timestamp")

	// Too old, too far ahead.
	for _, skew := range []time.Duration{-identity.DefaultMaxSkew - time.Second, identity.DefaultMaxSkew + time.Second} {
		req = e.post("/v1/daemon/poll", "", body)
		if err := h.key.SignRequest(req, body, e.clock.Now().Add(skew)); err != nil {
			t.Fatal(err)
		}
		want401(t, e.send(req), fmt.Sprintf("skew %s", skew))
	}

	// Someone else's worker id, with this key.
	other := e.newHost("m2", "l2")
	other.enroll()
	want401(t, e.send(e.signed(h.key, "/v1/daemon/poll", "", other.pollBody())), "another worker's id")
	// A key nobody enrolled.
	want401(t, e.send(e.signed(newKey(t), "/v1/daemon/poll", "", body)), "unknown key")

	// The reasons are in the log, not in the answers.
	for _, reason := range []string{"replay", "bad_signature", "clock_skew", "worker_id_not_the_keys_worker", "unknown_key"} {
		if !strings.Contains(e.log.String(), `"reason":"`+reason+`"`) {
			t.Errorf("reason %s not logged", reason)
		}
	}
	// And the daemon still works.
	h.mustPoll()
}

func TestRevokedKeyIsRefusedAtOnce(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("m", "l")
	h.enroll()
	h.mustPoll()
	old := h.key

	r := e.op(http.MethodPost, "/v1/namespaces/default/workers/l/revoke-key", operatorapi.RevokeKeyRequest{})
	if r.status != http.StatusOK {
		t.Fatalf("revoke: %d %q", r.status, r.body)
	}
	rv := decodeJS[operatorapi.RevokeKeyResponse](t, r)
	if rv.WorkerID != h.worker || rv.Key.KeyID != old.ID() || rv.Key.RevokedAt == nil {
		t.Fatalf("revoke answer %+v", rv)
	}
	want401(t, h.poll(), "poll with a revoked key")
	if !strings.Contains(e.log.String(), `"reason":"revoked_key"`) {
		t.Fatal("revoked_key not logged")
	}
	// Nothing left to revoke; an unknown key id is a 404 naming keyId.
	for _, body := range []operatorapi.RevokeKeyRequest{{}, {KeyID: "k_nope"}} {
		r := e.op(http.MethodPost, "/v1/namespaces/default/workers/l/revoke-key", body)
		if r.status != http.StatusNotFound || decodeJS[operatorapi.Error](t, r).Field != "keyId" {
			t.Fatalf("revoke %+v: %d %q", body, r.status, r.body)
		}
	}

	// Coming back: not without a token, not with the revoked key, but with
	// a fresh token and a new key.
	wantReject(t, h.hello(""), messages.RejectEnrollTokenRequired)
	wantReject(t, h.hello(e.enrollToken(time.Hour)), messages.RejectEnrollSignatureInvalid)
	e.clock.Advance(time.Second)
	h.key = newKey(t)
	h.enroll()
	h.mustPoll()
	w := e.getWorker(h.worker)
	if len(w.Keys) != 2 || w.Keys[0].KeyID != old.ID() || w.Keys[0].RevokedAt == nil || w.Keys[1].RevokedAt != nil {
		t.Fatalf("keys after re-enrollment %+v", w.Keys)
	}
}

func TestKeyRotationThroughKeysRoute(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("m", "l")
	// No key, nothing to rotate.
	plain, _ := helloOver(t, e, "m", "plain")
	if r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+plain+"/rotate-key", nil); r.status != http.StatusConflict {
		t.Fatalf("rotate without a key: %d %q", r.status, r.body)
	}
	h.enroll()
	r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+h.worker+"/rotate-key", nil)
	if r.status != http.StatusAccepted || decodeJS[operatorapi.Queued](t, r).Kind != messages.KindRotateKey {
		t.Fatalf("rotate-key: %d %q", r.status, r.body)
	}
	if p := h.mustPoll(); len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindRotateKey {
		t.Fatalf("poll after rotate-key: %v", commandsOf(p))
	}

	next := newKey(t)
	keysBody := func(worker string, pub, kid string) []byte {
		return mustMP(t, &messages.KeysRequest{WorkerID: worker, PublicKey: pub, KeyID: kid})
	}
	keys := func(req *http.Request) (resp, messages.KeysResponse) {
		r := e.send(req)
		var kr messages.KeysResponse
		if r.status == http.StatusOK {
			kr = decodeMP[messages.KeysResponse](t, r)
		}
		return r, kr
	}
	// Refusals that leave the old key working.
	good := keysBody(h.worker, next.PublicKeyB64(), next.ID())
	r, _ = keys(e.post("/v1/daemon/keys", testDaemon, good))
	want401(t, r, "unsigned /keys")
	r, _ = keys(e.signed(next, "/v1/daemon/keys", "", good))
	want401(t, r, "/keys signed by the new key")
	r, _ = keys(e.signed(h.key, "/v1/daemon/keys", "", keysBody("someone-else", next.PublicKeyB64(), next.ID())))
	want401(t, r, "/keys for another worker")
	for name, body := range map[string][]byte{
		"key id of another key": keysBody(h.worker, next.PublicKeyB64(), h.key.ID()),
		"malformed key":         keysBody(h.worker, "AAAA", next.ID()),
		"the current key":       keysBody(h.worker, h.key.PublicKeyB64(), h.key.ID()),
	} {
		r, kr := keys(e.signed(h.key, "/v1/daemon/keys", "", body))
		if r.status != http.StatusOK || kr.Reject == nil || kr.Reject.Code != messages.RejectKeyIDMismatch || kr.KeyID != nil {
			t.Fatalf("%s: %d %+v", name, r.status, kr)
		}
	}
	if r := e.send(e.signed(h.key, "/v1/daemon/keys", "", mustMP(t, map[string]any{"worker_id": h.worker}))); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("/keys without public_key: %d %q", r.status, r.body)
	}
	h.mustPoll()

	// The rotation itself.
	e.clock.Advance(time.Second)
	r, kr := keys(e.signed(h.key, "/v1/daemon/keys", "", good))
	if r.status != http.StatusOK || kr.Reject != nil || kr.KeyID == nil || *kr.KeyID != next.ID() {
		t.Fatalf("rotation: %d %+v", r.status, kr)
	}
	old := h.key
	want401(t, h.poll(), "poll with the rotated-out key")
	// The acceptance was lost on the way: the daemon asks again with the
	// old key and hears the same answer.
	r, kr = keys(e.signed(old, "/v1/daemon/keys", "", good))
	if r.status != http.StatusOK || kr.KeyID == nil || *kr.KeyID != next.ID() {
		t.Fatalf("repeated rotation: %d %+v", r.status, kr)
	}
	// But the old key cannot rotate to anything else.
	third := newKey(t)
	r, _ = keys(e.signed(old, "/v1/daemon/keys", "", keysBody(h.worker, third.PublicKeyB64(), third.ID())))
	want401(t, r, "old key rotating again")
	h.key = next
	h.mustPoll()
	w := e.getWorker(h.worker)
	if len(w.Keys) != 2 || w.Keys[0].RevokedAt == nil || w.Keys[1].KeyID != next.ID() || w.Keys[1].RevokedAt != nil {
		t.Fatalf("keys after rotation %+v", w.Keys)
	}
	// The rotated-in key is the daemon's identity on its next start too.
	if hr := h.hello(""); hr.Reject != nil || *hr.WorkerID != w.ID {
		t.Fatalf("hello with the new key: %+v", hr.Reject)
	}
}

// helloOver registers a bearer-only daemon.
func helloOver(t testing.TB, e *tlsEnv, machine, label string) (string, string) {
	t.Helper()
	r := e.send(e.post("/v1/daemon/hello", testDaemon, mustMP(t, helloReq(machine, label))))
	hr := decodeMP[messages.HelloResponse](t, r)
	if hr.Reject != nil || hr.WorkerID == nil {
		t.Fatalf("legacy hello: %q", r.body)
	}
	return *hr.WorkerID, *hr.Cursor
}

func TestRequireSignatures(t *testing.T) {
	t.Run("off", func(t *testing.T) {
		e := newTLSEnv(t)
		worker, cursor := helloOver(t, e, "m", "legacy")
		poll := mustMP(t, &messages.PollRequest{WorkerID: worker, Cursor: &cursor})
		if r := e.send(e.post("/v1/daemon/poll", testDaemon, poll)); r.status != http.StatusOK {
			t.Fatalf("bearer poll: %d %q", r.status, r.body)
		}
		if r := e.send(e.post("/v1/daemon/poll", "", poll)); r.status != http.StatusUnauthorized {
			t.Fatalf("poll without any credential: %d", r.status)
		}
		h := e.newHost("m", "signed")
		h.enroll()
		// An enrolled daemon does not fall back to the bearer.
		want401(t, e.send(e.post("/v1/daemon/poll", testDaemon, h.pollBody())), "bearer poll of an enrolled worker")
		h.mustPoll()
	})
	t.Run("on", func(t *testing.T) {
		e := newTLSEnv(t, func(c *Config) { c.RequireSignatures = true })
		legacy := decodeMP[messages.HelloResponse](t, e.send(e.post("/v1/daemon/hello", testDaemon, mustMP(t, helloReq("m", "legacy")))))
		wantReject(t, legacy, messages.RejectEnrollmentSignatureRequired)
		if r := e.send(e.post("/v1/daemon/hello", "wrong", mustMP(t, helloReq("m", "legacy")))); r.status != http.StatusUnauthorized {
			t.Fatalf("legacy hello with a wrong bearer: %d", r.status)
		}
		h := e.newHost("m", "signed")
		h.enroll()
		h.mustPoll()
		want401(t, e.send(e.post("/v1/daemon/poll", testDaemon, h.pollBody())), "bearer poll")
		want401(t, e.send(e.post("/v1/daemon/ack", testDaemon, mustMP(t, &messages.Ack{InvocationID: "i", State: "failed"}))), "bearer ack")
		if !strings.Contains(e.log.String(), `"reason":"signature_required"`) {
			t.Fatal("signature_required not logged")
		}
	})
}

func TestHostileSignatureHeaders(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("m", "l")
	h.enroll()
	tok := e.enrollToken(time.Hour)
	fresh := e.newHost("m2", "l2")
	sig64 := base64.RawURLEncoding.EncodeToString(make([]byte, 64))
	edits := map[string]func(http.Header){
		"non-base64 signature": func(hd http.Header) { hd.Set(identity.HeaderSignature, "!!!!"+sig64[4:]) },
		"padded signature": func(hd http.Header) {
			hd.Set(identity.HeaderSignature, base64.URLEncoding.EncodeToString(make([]byte, 64)))
		},
		"63-byte signature": func(hd http.Header) {
			hd.Set(identity.HeaderSignature, base64.RawURLEncoding.EncodeToString(make([]byte, 63)))
		},
		"65-byte signature": func(hd http.Header) {
			hd.Set(identity.HeaderSignature, base64.RawURLEncoding.EncodeToString(make([]byte, 65)))
		},
		"zero signature":        func(hd http.Header) { hd.Set(identity.HeaderSignature, sig64) },
		"duplicated signature":  func(hd http.Header) { hd.Add(identity.HeaderSignature, hd.Get(identity.HeaderSignature)) },
		"duplicated key id":     func(hd http.Header) { hd.Add(identity.HeaderKeyID, "k_other") },
		"duplicated nonce":      func(hd http.Header) { hd["x-ls-nonce"] = []string{"AAAAAAAAAAAAAAAAAAAAAA"} },
		"folded key id":         func(hd http.Header) { hd.Set(identity.HeaderKeyID, hd.Get(identity.HeaderKeyID)+", k_other") },
		"huge key id":           func(hd http.Header) { hd.Set(identity.HeaderKeyID, strings.Repeat("k", 4096)) },
		"short nonce":           func(hd http.Header) { hd.Set(identity.HeaderNonce, "AAAA") },
		"non-base64 nonce":      func(hd http.Header) { hd.Set(identity.HeaderNonce, "@@@@@@@@@@@@@@@@@@@@@@") },
		"non-decimal timestamp": func(hd http.Header) { hd.Set(identity.HeaderTimestamp, "0x10") },
		"overflowing timestamp": func(hd http.Header) { hd.Set(identity.HeaderTimestamp, "99999999999999999999999") },
		"negative timestamp":    func(hd http.Header) { hd.Set(identity.HeaderTimestamp, "-9223372036854775808") },
		"empty signature":       func(hd http.Header) { hd.Set(identity.HeaderSignature, "") },
		"key id only": func(hd http.Header) {
			kid := hd.Get(identity.HeaderKeyID)
			clearSig(hd)
			hd.Set(identity.HeaderKeyID, kid)
		},
		"signature only": func(hd http.Header) {
			s := hd.Get(identity.HeaderSignature)
			clearSig(hd)
			hd.Set(identity.HeaderSignature, s)
		},
		"unicode key id": func(hd http.Header) { hd.Set(identity.HeaderKeyID, "k_é") },
		"two authorization lines": func(hd http.Header) {
			hd.Add("Authorization", "Bearer "+testDaemon)
			hd.Add("Authorization", "Bearer x")
		},
	}
	for name, edit := range edits {
		// The guarded route: always a bare 401.
		req := e.signed(h.key, "/v1/daemon/poll", "", h.pollBody())
		edit(req.Header)
		r := e.send(req)
		if name == "two authorization lines" {
			if r.status != http.StatusOK {
				t.Errorf("%s: a valid signature beside junk bearers: %d", name, r.status)
			}
			continue
		}
		if r.status != http.StatusUnauthorized {
			t.Errorf("poll, %s: %d %q", name, r.status, r.body)
		}
		// /keys: a 401 too.
		req = e.signed(h.key, "/v1/daemon/keys", "", mustMP(t, &messages.KeysRequest{WorkerID: h.worker, PublicKey: fresh.key.PublicKeyB64(), KeyID: fresh.key.ID()}))
		edit(req.Header)
		if r := e.send(req); r.status != http.StatusUnauthorized {
			t.Errorf("keys, %s: %d %q", name, r.status, r.body)
		}
		// An enrollment hello: a reject, never a 5xx, never an enrollment.
		req = e.signed(fresh.key, "/v1/daemon/hello", tok, fresh.helloBody())
		edit(req.Header)
		r = e.send(req)
		if r.status == http.StatusOK {
			if hr := decodeMP[messages.HelloResponse](t, r); hr.Reject == nil {
				t.Errorf("hello, %s: enrolled", name)
			}
		} else if r.status != http.StatusUnauthorized {
			t.Errorf("hello, %s: %d %q", name, r.status, r.body)
		}
	}
	// After all that, the token is intact and both hosts work.
	if hr := fresh.hello(tok); hr.Reject != nil {
		t.Fatalf("token after hostile hellos: %+v", hr.Reject)
	}
	fresh.mustPoll()
	h.mustPoll()
}

func clearSig(hd http.Header) {
	for _, name := range signatureHeaders {
		hd.Del(name)
	}
}

func TestKillWorkerKeepsItsKeyForTheNextHello(t *testing.T) {
	e := newTLSEnv(t)
	h := e.newHost("m", "l")
	h.enroll()
	old := h.worker
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+old, nil); r.status != http.StatusOK {
		t.Fatalf("kill: %d %q", r.status, r.body)
	}
	if r := h.poll(); r.status != http.StatusNotFound {
		t.Fatalf("poll of a killed worker: %d %q", r.status, r.body)
	}
	if hr := h.hello(""); hr.Reject != nil || h.worker == old {
		t.Fatalf("re-hello after kill: %+v, worker %s", hr.Reject, h.worker)
	}
	h.mustPoll()
	if w := e.getWorker(h.worker); len(w.Keys) != 1 || w.Keys[0].KeyID != h.key.ID() {
		t.Fatalf("keys of the re-created worker %+v", w.Keys)
	}
}

func TestKeyRotationByAge(t *testing.T) {
	e := newTLSEnv(t, func(c *Config) { c.KeyRotationMaxAge = time.Hour })
	h := e.newHost("m", "l")
	tok := e.enrollToken(time.Hour)
	if hr := h.hello(tok); hr.Reject != nil || hr.KeyRotationMaxAgeS != 3600 {
		t.Fatalf("hello: %+v", hr)
	}
	if p := h.mustPoll(); len(p.Commands) != 0 {
		t.Fatalf("young key: %v", commandsOf(p))
	}
	e.clock.Advance(2 * time.Hour)
	if p := h.mustPoll(); len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindRotateKey {
		t.Fatalf("old key: %v", commandsOf(p))
	}
	if p := h.mustPoll(); len(p.Commands) != 0 {
		t.Fatalf("rotation queued twice: %v", commandsOf(p))
	}
	next := newKey(t)
	r := e.send(e.signed(h.key, "/v1/daemon/keys", "", mustMP(t, &messages.KeysRequest{WorkerID: h.worker, PublicKey: next.PublicKeyB64(), KeyID: next.ID()})))
	if kr := decodeMP[messages.KeysResponse](t, r); kr.KeyID == nil {
		t.Fatalf("rotation: %+v", kr.Reject)
	}
	h.key = next
	if p := h.mustPoll(); len(p.Commands) != 0 {
		t.Fatalf("fresh key: %v", commandsOf(p))
	}
}
