package main_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nymph/identity"
	"nymph/messages"
	"nymph/test/fakecp"
	"nymph/test/wait"
)

// tapProxy forwards TCP to target and keeps every byte the client sent.
type tapProxy struct {
	ln  net.Listener
	mu  sync.Mutex
	buf bytes.Buffer
}

func newTapProxy(t *testing.T, target string) *tapProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tapProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.pipe(c, target)
		}
	}()
	return p
}

func (p *tapProxy) pipe(c net.Conn, target string) {
	defer c.Close()
	s, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer s.Close()
	go func() { _, _ = io.Copy(c, s); c.Close() }()
	_, _ = io.Copy(io.MultiWriter(s, p), c)
}

func (p *tapProxy) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.buf.Write(b)
}

func (p *tapProxy) bytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]byte(nil), p.buf.Bytes()...)
}

// Without [identity] the daemon's requests are the legacy ones: the bearer
// and not one X-LS-* header, checked on the bytes that left the process.
func TestNoIdentityNoSignatureHeadersOnTheWire(t *testing.T) {
	cp := fakecp.New(t, fakecp.WithToken("daemon-token"))
	u, _ := url.Parse(cp.URL)
	tap := newTapProxy(t, u.Host)
	cfg, _ := writeConfig(t, &fakecp.CP{URL: "http://" + tap.ln.Addr().String()}, "")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	cp.QueueExec(messages.Exec{ExecID: "e-plain", Command: "echo hi", Log: &messages.LogSink{StdoutURL: "/v1/daemon/exec/e-plain/chunk", FlushMs: 10}})
	cp.WaitResult("e-plain", 20*time.Second)
	cp.Wait(20*time.Second, "a poll after the result", func() bool { return len(cp.Polls()) > 2 })
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	raw := tap.bytes()
	for _, want := range []string{"POST /v1/daemon/hello ", "POST /v1/daemon/poll ", "POST /v1/daemon/exec/e-plain/result ", "POST /v1/daemon/exec/e-plain/chunk ", "Authorization: Bearer daemon-token\r\n"} {
		if !bytes.Contains(raw, []byte(want)) {
			t.Fatalf("%q not on the wire:\n%s", want, raw)
		}
	}
	if i := bytes.Index(bytes.ToLower(raw), []byte("x-ls-")); i >= 0 {
		t.Fatalf("a signature header on the wire without [identity]: %q", raw[max(0, i-40):min(len(raw), i+60)])
	}
	var hello messages.HelloRequest
	if err := messages.Unmarshal(cp.Requests()[0].Body, &hello); err != nil || hello.PublicKey != "" {
		t.Fatalf("hello carries public_key %q (%v)", hello.PublicKey, err)
	}
}

func writeIdentityConfig(t *testing.T, cp *fakecp.CP, token string) (cfg, dir string) {
	t.Helper()
	cfg, dir = writeConfig(t, cp, "")
	if token != "" {
		if err := os.WriteFile(filepath.Join(dir, "enroll"), []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\n[identity]\nenabled = true\nkey_file = \"id/identity.key\"\nenroll_token_file = \"enroll\"\n"); err != nil {
		t.Fatal(err)
	}
	return cfg, dir
}

// staticKeys resolves a fixed set of keys.
type staticKeys map[string]ed25519.PublicKey

func (s staticKeys) LookupKey(_ context.Context, id string) (ed25519.PublicKey, bool, error) {
	if pub, ok := s[id]; ok {
		return pub, false, nil
	}
	return nil, false, identity.ErrUnknownKey
}

// signedBy returns the id of the key that signed a recorded request, or
// fails the test.
func signedBy(t *testing.T, r fakecp.Request, ks ...*identity.Key) string {
	t.Helper()
	lookup := staticKeys{}
	for _, k := range ks {
		lookup[k.ID()] = k.PublicKey()
	}
	req := &http.Request{Method: r.Method, URL: &url.URL{Path: r.Path}, Header: r.Header}
	kid, err := identity.NewVerifier(lookup).Verify(context.Background(), req, r.Body, time.Now())
	if err != nil {
		t.Fatalf("%s %s does not verify: %v (headers %v)", r.Method, r.Path, err, r.Header)
	}
	return kid
}

func requestsOf(cp *fakecp.CP, route fakecp.Route) []fakecp.Request {
	var out []fakecp.Request
	for _, r := range cp.Requests() {
		if r.Route == route {
			out = append(out, r)
		}
	}
	return out
}

func TestIdentityEnrollSignRotateRestart(t *testing.T) {
	cp := fakecp.New(t)
	cfg, dir := writeIdentityConfig(t, cp, "dle_first")
	keyFile := filepath.Join(dir, "id", "identity.key")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "two polls", func() bool { return len(cp.Polls()) >= 2 })

	st, err := os.Stat(keyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", st, err)
	}
	key, err := identity.Load(keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// Enrollment: the token as the bearer, the new public key, signed by it.
	hello := requestsOf(cp, fakecp.RouteHello)[0]
	if got := hello.Header.Get("Authorization"); got != "Bearer dle_first" {
		t.Fatalf("enrollment hello bearer %q", got)
	}
	if cp.Hellos()[0].PublicKey != key.PublicKeyB64() {
		t.Fatalf("public_key %q, key file holds %q", cp.Hellos()[0].PublicKey, key.PublicKeyB64())
	}
	if signedBy(t, hello, key) != key.ID() {
		t.Fatal("hello not signed by the new key")
	}
	for _, p := range requestsOf(cp, fakecp.RoutePoll) {
		if signedBy(t, p, key) != key.ID() || p.Header.Get("Authorization") != "Bearer daemon-token" {
			t.Fatalf("poll %v", p.Header)
		}
	}
	cp.QueueExec(messages.Exec{ExecID: "e-signed", Command: "echo hi"})
	cp.WaitResult("e-signed", 20*time.Second)
	for _, r := range requestsOf(cp, fakecp.RouteResult) {
		signedBy(t, r, key)
	}

	// Rotation.
	cp.QueueKind(messages.KindRotateKey, nil)
	// The offer is decoded inside the handler, the request recorded as
	// the answer starts: wait for both.
	cp.Wait(20*time.Second, "a rotation", func() bool { return len(cp.Keys()) > 0 && len(requestsOf(cp, fakecp.RouteKeys)) > 0 })
	kr := requestsOf(cp, fakecp.RouteKeys)[0]
	if signedBy(t, kr, key) != key.ID() {
		t.Fatal("/keys not signed by the outgoing key")
	}
	offer := cp.Keys()[0]
	if offer.WorkerID != "w-fake" || offer.KeyID == key.ID() {
		t.Fatalf("offer %+v", offer)
	}
	wait.For(t, 20*time.Second, "the new key on disk", func() bool {
		k, err := identity.Load(keyFile)
		return err == nil && k.ID() == offer.KeyID
	})
	next, _ := identity.Load(keyFile)
	if next.PublicKeyB64() != offer.PublicKey {
		t.Fatal("the key on disk is not the one offered")
	}
	// A poll is recorded as its answer starts: one held across the
	// rotation, signed by the old key, may be recorded after polls signed
	// by the new one. What matters is that the new key signs polls now.
	cp.Wait(20*time.Second, "a poll signed by the new key", func() bool {
		for _, p := range requestsOf(cp, fakecp.RoutePoll) {
			if signedBy(t, p, key, next) == next.ID() {
				return true
			}
		}
		return false
	})
	if !strings.Contains(d.stderr.String(), "key rotated: now signing with the new key") {
		t.Fatalf("rotation not logged:\n%s", d.stderr.String())
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if code := d.wait(20 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}

	// Restart: the enrolled key says hello with its signature alone.
	hellos := len(requestsOf(cp, fakecp.RouteHello))
	d = start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "the second hello", func() bool { return len(requestsOf(cp, fakecp.RouteHello)) > hellos })
	h2 := requestsOf(cp, fakecp.RouteHello)[hellos]
	if got := h2.Header.Get("Authorization"); got != "Bearer daemon-token" {
		t.Fatalf("restarted hello bearer %q: the enrollment token is not needed again", got)
	}
	if signedBy(t, h2, next) != next.ID() || cp.Hellos()[hellos].PublicKey != next.PublicKeyB64() {
		t.Fatal("restarted hello not signed by (or naming) the rotated key")
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	d.wait(20 * time.Second)
}

func TestIdentityRotationFailureKeepsTheOldKey(t *testing.T) {
	cp := fakecp.New(t)
	cfg, dir := writeIdentityConfig(t, cp, "dle_x")
	keyFile := filepath.Join(dir, "id", "identity.key")
	d := start(t, nil, "run", "--config", cfg)
	cp.Wait(20*time.Second, "a poll", func() bool { return len(cp.Polls()) > 0 })
	before, _ := os.ReadFile(keyFile)
	key, _ := identity.Load(keyFile)
	cp.Fail(fakecp.RouteKeys, 100, http.StatusServiceUnavailable)
	cp.QueueKind(messages.KindRotateKey, nil)
	wait.For(t, 20*time.Second, "the rotation to give up", func() bool {
		return strings.Contains(d.stderr.String(), "key rotation failed: the old key stays in use and on disk")
	})
	after, _ := os.ReadFile(keyFile)
	if !bytes.Equal(before, after) {
		t.Fatal("key file changed after a failed rotation")
	}
	if n := len(requestsOf(cp, fakecp.RouteKeys)); n < 2 {
		t.Fatalf("%d /keys attempts: a 503 is retried", n)
	}
	n := len(cp.Polls())
	cp.Wait(20*time.Second, "polls after the failure", func() bool { return len(cp.Polls()) >= n+2 })
	polls := requestsOf(cp, fakecp.RoutePoll)
	if signedBy(t, polls[len(polls)-1], key) != key.ID() {
		t.Fatal("not signing with the old key after a failed rotation")
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	d.wait(20 * time.Second)
}

func TestIdentityBadInputExitsWithTheField(t *testing.T) {
	cp := fakecp.New(t)
	t.Run("not an enrollment token", func(t *testing.T) {
		cfg, _ := writeIdentityConfig(t, cp, "daemon-token")
		d := start(t, nil, "run", "--config", cfg)
		if code := d.wait(10 * time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(d.stderr.String(), "[identity] enroll_token_file") {
			t.Fatalf("stderr %q", d.stderr.String())
		}
	})
	t.Run("corrupt key file", func(t *testing.T) {
		cfg, dir := writeIdentityConfig(t, cp, "dle_x")
		keyFile := filepath.Join(dir, "id", "identity.key")
		_ = os.MkdirAll(filepath.Dir(keyFile), 0o700)
		if err := os.WriteFile(keyFile, []byte("garbage"), 0o600); err != nil {
			t.Fatal(err)
		}
		d := start(t, nil, "run", "--config", cfg)
		if code := d.wait(10 * time.Second); code != 2 {
			t.Fatalf("exit %d", code)
		}
		if b, _ := os.ReadFile(keyFile); string(b) != "garbage" || !strings.Contains(d.stderr.String(), "[identity] key_file") {
			t.Fatalf("key file %q, stderr %q", b, d.stderr.String())
		}
	})
	t.Run("rejected hello", func(t *testing.T) {
		cp := fakecp.New(t, fakecp.WithHello(func(*messages.HelloRequest) messages.HelloResponse {
			return messages.HelloResponse{Reject: &messages.Reject{Code: messages.RejectEnrollTokenRequired, Message: "present a token"}}
		}))
		cfg, _ := writeIdentityConfig(t, cp, "")
		d := start(t, nil, "run", "--config", cfg)
		if code := d.wait(20 * time.Second); code != 3 {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(d.stderr.String(), `"code":"enroll_token_required"`) {
			t.Fatalf("code not logged:\n%s", d.stderr.String())
		}
	})
}
