package e2e

import (
	"bytes"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// recorded is one request that went through the recorder.
type recorded struct {
	Method, Path string
	Header       http.Header
	Body         []byte
	Status       int
	At           time.Time
}

// recorder is an HTTPS reverse proxy between nymph and the control plane,
// with a certificate from the test's CA. It keeps every request (headers
// and body, so a signed one can be replayed) and the status answered, and
// can fail /v1/daemon/keys on demand.
type recorder struct {
	URL      string
	failKeys atomic.Bool
	// loseKeys is how many /keys answers to swallow: the request reaches
	// the control plane, the daemon gets a 502 instead of the answer.
	loseKeys atomic.Int32

	mu   sync.Mutex
	reqs []recorded
}

func startRecorder(t *testing.T, cp *harness.ControlPlane) *recorder {
	t.Helper()
	target, err := url.Parse(cp.URL)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = cp.CA.Client().Transport
	// A long-poll the daemon abandons is a cancelled proxy request; that
	// is expected, not worth a line of output.
	rp.ErrorLog = log.New(io.Discard, "", 0)
	rec := &recorder{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		entry := recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: body, At: time.Now()}
		if rec.failKeys.Load() && r.URL.Path == "/v1/daemon/keys" {
			http.Error(w, "injected by the test proxy", http.StatusServiceUnavailable)
			entry.Status = http.StatusServiceUnavailable
			rec.add(entry)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		if r.URL.Path == "/v1/daemon/keys" && rec.loseKeys.Add(-1) >= 0 {
			lost := httptest.NewRecorder()
			rp.ServeHTTP(lost, r)
			http.Error(w, "answer lost on the way (test proxy)", http.StatusBadGateway)
			entry.Status = lost.Code
			rec.add(entry)
			return
		}
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		rp.ServeHTTP(sw, r)
		entry.Status = sw.status
		rec.add(entry)
	}))
	_, _, pair := cp.CA.Issue(t)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	rec.URL = srv.URL
	return rec
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) add(e recorded) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reqs = append(r.reqs, e)
}

// all returns the recorded requests to path ("" for every path).
func (r *recorder) all(path string) []recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []recorded
	for _, e := range r.reqs {
		if path == "" || e.Path == path {
			out = append(out, e)
		}
	}
	return out
}

// identityDir holds one host's identity files; they live outside the
// daemon's config directory so a test can share, inspect or keep them
// across restarts.
type identityDir struct {
	KeyFile, TokenFile string
}

func newIdentityDir(t *testing.T) identityDir {
	dir := t.TempDir()
	return identityDir{KeyFile: filepath.Join(dir, "keys", "identity.key"), TokenFile: filepath.Join(dir, "enroll-token")}
}

func (id identityDir) toml() string {
	return fmt.Sprintf("[identity]\nenabled = true\nkey_file = %q\nenroll_token_file = %q\n", id.KeyFile, id.TokenFile)
}

func (id identityDir) setToken(t *testing.T, tok string) {
	t.Helper()
	if err := os.WriteFile(id.TokenFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (id identityDir) key(t *testing.T) *identity.Key {
	t.Helper()
	k, err := identity.Load(id.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// mintEnroll mints a one-shot enrollment token with the real CLI.
func mintEnroll(t *testing.T, cp *harness.ControlPlane, args ...string) string {
	t.Helper()
	r := cp.CLI(t, append([]string{"token", "create", "--enroll"}, args...)...)
	expectCode(t, r, 0)
	tok := strings.TrimSpace(r.Stdout)
	if !strings.HasPrefix(tok, "dle_") {
		t.Fatalf("enrollment token %q", tok)
	}
	return tok
}

// logLine reports whether one line of a JSON log holds every part.
func logLine(log string, parts ...string) bool {
	for _, line := range strings.Split(log, "\n") {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			return true
		}
	}
	return false
}

// waitExit waits for nymph to exit and returns its code.
func waitExit(t *testing.T, d *harness.Daemon, within time.Duration) int {
	t.Helper()
	select {
	case <-d.Done():
		return d.ExitCode()
	case <-time.After(within):
		t.Fatalf("nymph still running after %v:\n%s", within, d.Log())
		return -1
	}
}

func expectRejected(t *testing.T, d *harness.Daemon, code string) {
	t.Helper()
	if got := waitExit(t, d, 30*time.Second); got != 3 {
		t.Fatalf("nymph exit %d, want 3 (rejected):\n%s", got, d.Log())
	}
	if !strings.Contains(d.Log(), `"code":"`+code+`"`) {
		t.Fatalf("reject code %s not in nymph's log:\n%s", code, d.Log())
	}
}

func stopDaemon(t *testing.T, d *harness.Daemon) {
	t.Helper()
	d.Signal(syscall.SIGTERM)
	if code := waitExit(t, d, 30*time.Second); code != 0 {
		t.Fatalf("nymph exit %d after SIGTERM:\n%s", code, d.Log())
	}
}

// stillWorksThenStop runs a plain exec on the daemon labelled label, then
// stops it cleanly.
func stillWorksThenStop(t *testing.T, cp *harness.ControlPlane, d *harness.Daemon, label string) {
	t.Helper()
	expectCode(t, cp.CLI(t, "daemon", "exec", label, "true"), 0)
	stopDaemon(t, d)
}

func showKeys(t *testing.T, cp *harness.ControlPlane, label string) []operatorapi.KeyInfo {
	t.Helper()
	return mustJSON[operatorapi.Worker](t, cp.CLI(t, "daemon", "show", label, "--json")).Keys
}

// post sends body to a daemon route of the control plane directly, with
// the given headers, and returns the status.
func post(t *testing.T, cp *harness.ControlPlane, path string, hdr http.Header, body []byte) int {
	t.Helper()
	status, _ := postRaw(t, cp, path, hdr, body)
	return status
}

// signedPoll makes an immediate poll for workerID signed by k, as the
// daemon would, and returns the status.
func signedPoll(t *testing.T, cp *harness.ControlPlane, k *identity.Key, workerID string) int {
	t.Helper()
	body, err := messages.Marshal(&messages.PollRequest{WorkerID: workerID})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest(http.MethodPost, cp.URL+"/v1/daemon/poll", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", messages.ContentType)
	if err := k.SignRequest(req, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	resp, err := cp.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func tlsCP(t *testing.T, env ...string) *harness.ControlPlane {
	t.Helper()
	return harness.StartControlPlane(t, harness.CPOptions{TLS: harness.NewCA(t), Env: env})
}

// startSigned starts a TLS control plane behind a recorder and a daemon
// with an identity and a fresh enrollment token that polls through the
// recorder, holding each poll at most waitMax seconds.
func startSigned(t *testing.T, o harness.DaemonOptions) (*harness.ControlPlane, *recorder, identityDir, *harness.Daemon) {
	t.Helper()
	cp := tlsCP(t)
	rec := startRecorder(t, cp)
	id := newIdentityDir(t)
	id.setToken(t, mintEnroll(t, cp))
	o.ServerURL, o.WaitMaxS, o.ExtraTOML = rec.URL, waitMax, id.toml()
	return cp, rec, id, cp.StartDaemon(t, o)
}

// waitMax is the wait_max_s of the daemons startSigned starts.
const waitMax = 2

// TestIdentityEnrollmentOverTLS: a token from the CLI, a key made on the
// first start, enrollment on the first hello, work over HTTPS, and a
// restart that says hello with the signature alone.
func TestIdentityEnrollmentOverTLS(t *testing.T) {
	t.Parallel()
	cp := tlsCP(t)
	if !strings.HasPrefix(cp.URL, "https://") {
		t.Fatalf("control plane at %s", cp.URL)
	}
	rec := startRecorder(t, cp)
	id := newIdentityDir(t)
	tok := mintEnroll(t, cp, "--ttl", "1h")
	id.setToken(t, tok)
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "enrolled", ServerURL: rec.URL, ExtraTOML: id.toml()})

	key := id.key(t)
	if st, err := os.Stat(id.KeyFile); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file %v %v", st, err)
	}
	keys := showKeys(t, cp, "enrolled")
	if len(keys) != 1 || keys[0].KeyID != key.ID() || keys[0].RevokedAt != nil {
		t.Fatalf("daemon show keys %+v, key file holds %s", keys, key.ID())
	}
	if !logLine(d.Log(), `"message":"identity key enrolled"`, `"key_id":"`+key.ID()+`"`) {
		t.Fatalf("enrollment not logged:\n%s", d.Log())
	}
	hello := rec.all("/v1/daemon/hello")[0]
	if hello.Header.Get("Authorization") != "Bearer "+tok || hello.Header.Get(identity.HeaderKeyID) != key.ID() {
		t.Fatalf("enrollment hello headers %v", hello.Header)
	}
	r := cp.CLI(t, "daemon", "exec", "enrolled", "echo", "over", "tls")
	expectCode(t, r, 0)
	if r.Stdout != "over tls\n" {
		t.Fatalf("exec stdout %q", r.Stdout)
	}
	show := cp.CLI(t, "daemon", "show", "enrolled")
	if !strings.Contains(show.Stdout, key.ID()) || strings.Contains(show.Stdout, tok) {
		t.Fatalf("daemon show lists no key id, or a secret:\n%s", show.Stdout)
	}

	// Restart: the token is consumed and not needed; the hello is signed.
	stopDaemon(t, d)
	hellos := len(rec.all("/v1/daemon/hello"))
	d.Start(d.Bin, nil)
	wait.For(t, 30*time.Second, "a poll after the restart", func() bool {
		return len(rec.all("/v1/daemon/hello")) > hellos && strings.Count(d.Log(), `"message":"hello accepted"`) >= 2
	})
	h2 := rec.all("/v1/daemon/hello")[hellos]
	if got := h2.Header.Get("Authorization"); strings.Contains(got, "dle_") || h2.Header.Get(identity.HeaderKeyID) != key.ID() || h2.Status != http.StatusOK {
		t.Fatalf("restarted hello: %d %v", h2.Status, h2.Header)
	}
	expectCode(t, cp.CLI(t, "daemon", "exec", "enrolled", "true"), 0)
	if n := len(showKeys(t, cp, "enrolled")); n != 1 {
		t.Fatalf("%d keys after a restart", n)
	}
	stopDaemon(t, d)
}

// TestIdentityRejects: each of the eight refusals of an identity hello,
// reached the way an operator would reach it; nymph exits 3 with the code
// in its log.
func TestIdentityRejects(t *testing.T) {
	t.Parallel()
	cp := tlsCP(t)

	t.Run("enroll_token_required", func(t *testing.T) {
		id := newIdentityDir(t) // no token file
		d := cp.StartDaemon(t, harness.DaemonOptions{ExtraTOML: id.toml(), NoWait: true})
		expectRejected(t, d, messages.RejectEnrollTokenRequired)
	})
	t.Run("invalid_enroll_token", func(t *testing.T) {
		id := newIdentityDir(t)
		id.setToken(t, "dle_notminted0000000000000000000000")
		d := cp.StartDaemon(t, harness.DaemonOptions{ExtraTOML: id.toml(), NoWait: true})
		expectRejected(t, d, messages.RejectInvalidEnrollToken)
	})
	t.Run("enroll_token_consumed", func(t *testing.T) {
		tok := mintEnroll(t, cp)
		first, second := newIdentityDir(t), newIdentityDir(t)
		first.setToken(t, tok)
		second.setToken(t, tok)
		a := cp.StartDaemon(t, harness.DaemonOptions{Label: "consumer-a", ExtraTOML: first.toml()})
		b := cp.StartDaemon(t, harness.DaemonOptions{Label: "consumer-b", ExtraTOML: second.toml(), NoWait: true})
		expectRejected(t, b, messages.RejectEnrollTokenConsumed)
		stopDaemon(t, a)
	})
	t.Run("enroll_token_expired", func(t *testing.T) {
		r := cp.CLI(t, "token", "create", "--enroll", "--ttl", "1s", "--json")
		expectCode(t, r, 0)
		var tr struct {
			Token     string     `json:"token"`
			ExpiresAt *time.Time `json:"expiresAt"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &tr); err != nil || tr.ExpiresAt == nil {
			t.Fatalf("%v %s", err, r.Stdout)
		}
		wait.For(t, 10*time.Second, "the token to expire", func() bool { return time.Now().After(tr.ExpiresAt.Add(time.Second)) })
		id := newIdentityDir(t)
		id.setToken(t, tr.Token)
		d := cp.StartDaemon(t, harness.DaemonOptions{ExtraTOML: id.toml(), NoWait: true})
		expectRejected(t, d, messages.RejectEnrollTokenExpired)
	})
	t.Run("enroll_signature_required", func(t *testing.T) {
		// The enrollment token put where the bootstrap bearer goes, on a
		// daemon without [identity]: an unsigned hello with no public key.
		d := cp.StartDaemon(t, harness.DaemonOptions{Token: mintEnroll(t, cp), NoWait: true})
		expectRejected(t, d, messages.RejectEnrollSignatureRequired)
	})
	t.Run("key_id_mismatch", func(t *testing.T) {
		// One key file copied to a second host: its key belongs to the first.
		id := newIdentityDir(t)
		id.setToken(t, mintEnroll(t, cp))
		a := cp.StartDaemon(t, harness.DaemonOptions{Label: "original", ExtraTOML: id.toml()})
		clone := newIdentityDir(t)
		if err := os.MkdirAll(filepath.Dir(clone.KeyFile), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := os.ReadFile(id.KeyFile)
		if err := os.WriteFile(clone.KeyFile, b, 0o600); err != nil {
			t.Fatal(err)
		}
		d := cp.StartDaemon(t, harness.DaemonOptions{Label: "clone", ExtraTOML: clone.toml(), NoWait: true})
		expectRejected(t, d, messages.RejectKeyIDMismatch)
		stopDaemon(t, a)
	})
	t.Run("enroll_signature_invalid", func(t *testing.T) {
		// A revoked key offered again with a fresh token: a revoked key
		// never comes back.
		id := newIdentityDir(t)
		id.setToken(t, mintEnroll(t, cp))
		d := cp.StartDaemon(t, harness.DaemonOptions{Label: "revoked-then-back", ExtraTOML: id.toml()})
		stopDaemon(t, d)
		expectCode(t, cp.CLI(t, "daemon", "revoke-key", "revoked-then-back"), 0)
		id.setToken(t, mintEnroll(t, cp))
		d.Start(d.Bin, nil)
		expectRejected(t, d, messages.RejectEnrollSignatureInvalid)
	})
	t.Run("enrollment_signature_required", func(t *testing.T) {
		// An enrolled daemon restarted with [identity] turned off.
		id := newIdentityDir(t)
		id.setToken(t, mintEnroll(t, cp))
		d := cp.StartDaemon(t, harness.DaemonOptions{Label: "turned-off", ExtraTOML: id.toml()})
		stopDaemon(t, d)
		cfg, err := os.ReadFile(d.ConfigPath)
		if err != nil {
			t.Fatal(err)
		}
		off := strings.Replace(string(cfg), "enabled = true", "enabled = false", 1)
		if err := os.WriteFile(d.ConfigPath, []byte(off), 0o600); err != nil {
			t.Fatal(err)
		}
		d.Start(d.Bin, nil)
		expectRejected(t, d, messages.RejectEnrollmentSignatureRequired)
	})
}

// TestIdentitySignedPollingAndTampering: every daemon request is signed; a
// captured one replayed, or altered in body, path or timestamp, is refused.
func TestIdentitySignedPollingAndTampering(t *testing.T) {
	t.Parallel()
	// No valid bootstrap bearer: the signature alone must authenticate.
	cp, rec, id, w := startSigned(t, harness.DaemonOptions{Label: "signer", Token: "not-a-daemon-token"})
	key := id.key(t)
	expectCode(t, cp.CLI(t, "daemon", "exec", "signer", "echo", "signed"), 0)
	wait.For(t, 30*time.Second, "three answered polls", func() bool {
		n := 0
		for _, p := range rec.all("/v1/daemon/poll") {
			if p.Status == http.StatusOK {
				n++
			}
		}
		return n >= 3
	})
	for _, r := range rec.all("") {
		if r.Header.Get(identity.HeaderKeyID) != key.ID() || r.Header.Get(identity.HeaderSignature) == "" ||
			r.Header.Get(identity.HeaderNonce) == "" || r.Header.Get(identity.HeaderTimestamp) == "" {
			t.Fatalf("%s %s not signed by %s: %v", r.Method, r.Path, key.ID(), r.Header)
		}
		if r.Status == http.StatusUnauthorized {
			t.Fatalf("%s %s refused", r.Method, r.Path)
		}
	}
	var captured recorded
	for _, p := range rec.all("/v1/daemon/poll") {
		if p.Status == http.StatusOK {
			captured = p
			break
		}
	}

	if got := post(t, cp, captured.Path, captured.Header, captured.Body); got != http.StatusUnauthorized {
		t.Fatalf("replayed poll: %d", got)
	}
	body := append([]byte(nil), captured.Body...)
	body[len(body)-1] ^= 0x01
	if got := post(t, cp, captured.Path, captured.Header, body); got != http.StatusUnauthorized {
		t.Fatalf("poll with an altered body: %d", got)
	}
	if got := post(t, cp, "/v1/daemon/ack", captured.Header, captured.Body); got != http.StatusUnauthorized {
		t.Fatalf("poll signature on another path: %d", got)
	}
	ts, _ := strconv.ParseInt(captured.Header.Get(identity.HeaderTimestamp), 10, 64)
	for _, delta := range []int64{-1, +1, -1000} {
		h := captured.Header.Clone()
		h.Set(identity.HeaderTimestamp, strconv.FormatInt(ts+delta, 10))
		if got := post(t, cp, captured.Path, h, captured.Body); got != http.StatusUnauthorized {
			t.Fatalf("poll with timestamp moved by %d s: %d", delta, got)
		}
	}
	// The control: the same key, a fresh signature, is accepted.
	worker := cp.WaitForWorker(t, "signer")
	if got := signedPoll(t, cp, key, worker.ID); got != http.StatusOK {
		t.Fatalf("freshly signed poll: %d", got)
	}
	for _, reason := range []string{`"reason":"replay"`, `"reason":"bad_signature"`, `"reason":"clock_skew"`} {
		if !strings.Contains(cp.Log(), reason) {
			t.Fatalf("control plane log has no %s:\n%s", reason, cp.Log())
		}
	}
	stillWorksThenStop(t, cp, w, "signer")
}

// TestIdentityRotationWhileExecsRun: a rotation in the middle of running
// execs fails none of them; afterwards the old key is refused.
func TestIdentityRotationWhileExecsRun(t *testing.T) {
	t.Parallel()
	cp, rec, id, d := startSigned(t, harness.DaemonOptions{Label: "rotor"})
	worker := cp.WaitForWorker(t, "rotor")
	old := id.key(t)

	const n = 8
	var wg sync.WaitGroup
	results := make([]harness.Result, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = cp.CLI(t, "daemon", "exec", "rotor", fmt.Sprintf("sleep 1.%d; echo exec-%d", i, i))
		}()
	}
	wait.For(t, 30*time.Second, "execs running", func() bool {
		return strings.Count(d.Log(), `"message":"exec accepted"`) >= n/2
	})
	r := cp.CLI(t, "daemon", "rotate-key", "rotor")
	expectCode(t, r, 0)
	wait.For(t, 30*time.Second, "the rotated key on disk", func() bool {
		k, err := identity.Load(id.KeyFile)
		return err == nil && k.ID() != old.ID()
	})
	wg.Wait()
	for i, res := range results {
		if res.Code != 0 || res.Stdout != fmt.Sprintf("exec-%d\n", i) {
			t.Fatalf("exec %d during the rotation: code %d stdout %q stderr %q", i, res.Code, res.Stdout, res.Stderr)
		}
	}
	rotatedAt := strings.Index(d.Log(), "key rotated: now signing with the new key")
	if rotatedAt < 0 || strings.LastIndex(d.Log(), `"message":"exec finished"`) < rotatedAt {
		t.Fatalf("the rotation did not happen while execs ran:\n%s", d.Log())
	}
	next := id.key(t)
	keys := showKeys(t, cp, "rotor")
	if len(keys) != 2 {
		t.Fatalf("keys after a rotation: %+v", keys)
	}
	for _, k := range keys {
		switch k.KeyID {
		case old.ID():
			if k.RevokedAt == nil {
				t.Fatal("the old key is not revoked")
			}
		case next.ID():
			if k.RevokedAt != nil {
				t.Fatal("the new key is revoked")
			}
		default:
			t.Fatalf("unknown key %s", k.KeyID)
		}
	}
	kr := rec.all("/v1/daemon/keys")
	if len(kr) != 1 || kr[0].Header.Get(identity.HeaderKeyID) != old.ID() || kr[0].Status != http.StatusOK {
		t.Fatalf("/keys requests: %+v", kr)
	}
	// More work after the rotation, signed by the new key.
	for i := range 3 {
		r := cp.CLI(t, "daemon", "exec", "rotor", fmt.Sprintf("echo after-%d", i))
		if r.Code != 0 || r.Stdout != fmt.Sprintf("after-%d\n", i) {
			t.Fatalf("exec after the rotation: %d %q %q", r.Code, r.Stdout, r.Stderr)
		}
	}
	var last recorded
	for _, p := range rec.all("/v1/daemon/poll") {
		if p.Status == http.StatusOK {
			last = p
		}
	}
	if last.Header.Get(identity.HeaderKeyID) != next.ID() {
		t.Fatalf("latest answered poll signed by %s, want the new key", last.Header.Get(identity.HeaderKeyID))
	}
	if got := signedPoll(t, cp, old, worker.ID); got != http.StatusUnauthorized {
		t.Fatalf("the old key after the rotation: %d", got)
	}
	if got := signedPoll(t, cp, next, worker.ID); got != http.StatusOK {
		t.Fatalf("the new key: %d", got)
	}
	for _, bad := range []string{`"message":"poll failed"`, "results left for the next start", "key rotation failed"} {
		if strings.Contains(d.Log(), bad) {
			t.Fatalf("nymph log has %q:\n%s", bad, d.Log())
		}
	}
	stopDaemon(t, d)
}

// TestIdentityRotationKeysCallFails: /v1/daemon/keys fails on the way; the
// daemon keeps its old key, on disk and in use, and keeps working.
func TestIdentityRotationKeysCallFails(t *testing.T) {
	t.Parallel()
	cp, rec, id, d := startSigned(t, harness.DaemonOptions{Label: "stuck"})
	before, _ := os.ReadFile(id.KeyFile)
	old := id.key(t)
	rec.failKeys.Store(true)
	expectCode(t, cp.CLI(t, "daemon", "rotate-key", "stuck"), 0)
	wait.For(t, 60*time.Second, "the rotation to give up", func() bool {
		return strings.Contains(d.Log(), "key rotation failed: the old key stays in use and on disk")
	})
	after, _ := os.ReadFile(id.KeyFile)
	if !bytes.Equal(before, after) {
		t.Fatal("the key file changed after a failed rotation")
	}
	if n := len(rec.all("/v1/daemon/keys")); n < 2 {
		t.Fatalf("%d /keys attempts; a 503 is retried", n)
	}
	keys := showKeys(t, cp, "stuck")
	if len(keys) != 1 || keys[0].KeyID != old.ID() || keys[0].RevokedAt != nil {
		t.Fatalf("keys %+v", keys)
	}
	r := cp.CLI(t, "daemon", "exec", "stuck", "echo", "still", "here")
	if r.Code != 0 || r.Stdout != "still here\n" {
		t.Fatalf("exec after the failed rotation: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	for _, p := range rec.all("/v1/daemon/poll") {
		if p.Header.Get(identity.HeaderKeyID) != old.ID() || p.Status == http.StatusUnauthorized {
			t.Fatalf("poll %d signed by %s after a failed rotation", p.Status, p.Header.Get(identity.HeaderKeyID))
		}
	}

	// The control plane accepts, but its answer is lost: the daemon offers
	// the same key again, signed by the key just retired, and the control
	// plane answers the repeat with the same acceptance.
	rec.failKeys.Store(false)
	rec.loseKeys.Store(1)
	expectCode(t, cp.CLI(t, "daemon", "rotate-key", "stuck"), 0)
	wait.For(t, 30*time.Second, "the rotated key on disk", func() bool {
		k, err := identity.Load(id.KeyFile)
		return err == nil && k.ID() != old.ID()
	})
	next := id.key(t)
	var offers []recorded
	for _, k := range rec.all("/v1/daemon/keys") {
		if k.Status == http.StatusOK {
			offers = append(offers, k)
		}
	}
	if len(offers) != 2 || !bytes.Equal(offers[0].Body, offers[1].Body) || offers[1].Header.Get(identity.HeaderKeyID) != old.ID() {
		t.Fatalf("want the accepted offer and its identical repeat, got %d: %+v", len(offers), offers)
	}
	keys = showKeys(t, cp, "stuck")
	if len(keys) != 2 {
		t.Fatalf("keys %+v", keys)
	}
	for _, k := range keys {
		if (k.KeyID == next.ID()) != (k.RevokedAt == nil) {
			t.Fatalf("keys %+v: want %s current and the old one revoked", keys, next.ID())
		}
	}
	stillWorksThenStop(t, cp, d, "stuck")
}

// TestIdentityRevocation: after revoke-key the daemon's next poll is
// refused.
func TestIdentityRevocation(t *testing.T) {
	t.Parallel()
	cp, rec, id, d := startSigned(t, harness.DaemonOptions{Label: "revokee"})
	key := id.key(t)
	expectCode(t, cp.CLI(t, "daemon", "exec", "revokee", "true"), 0)

	revoked := time.Now()
	r := cp.CLI(t, "daemon", "revoke-key", "revokee", "--json")
	expectCode(t, r, 0)
	rv := mustJSON[operatorapi.RevokeKeyResponse](t, r)
	if rv.Key.KeyID != key.ID() || rv.Key.RevokedAt == nil {
		t.Fatalf("revoke-key: %+v", rv)
	}
	var refusedAt time.Time
	wait.For(t, 30*time.Second, "a refused poll", func() bool {
		for _, p := range rec.all("/v1/daemon/poll") {
			if p.At.After(revoked) && p.Status == http.StatusUnauthorized {
				refusedAt = p.At
				return true
			}
		}
		return false
	})
	// Within one poll: the long-poll in flight ends (at most wait_max_s),
	// the next is refused.
	if lag := refusedAt.Sub(revoked); lag > (waitMax+3)*time.Second {
		t.Fatalf("first refused poll %v after the revocation", lag)
	}
	for _, p := range rec.all("/v1/daemon/poll") {
		if p.At.After(refusedAt) && p.Status == http.StatusOK {
			t.Fatal("a poll signed by the revoked key was answered after the refusal")
		}
	}
	if !strings.Contains(cp.Log(), `"reason":"revoked_key"`) {
		t.Fatalf("control plane log has no revoked_key reason:\n%s", cp.Log())
	}
	if keys := showKeys(t, cp, "revokee"); len(keys) != 1 || keys[0].RevokedAt == nil {
		t.Fatalf("keys %+v", keys)
	}
	// The refused daemon says hello again and, refused there too, exits
	// with the reason rather than polling forever.
	if code := waitExit(t, d, 60*time.Second); code != 3 || !strings.Contains(d.Log(), "enroll_token") {
		t.Fatalf("revoked daemon exit code %d, log:\n%s", code, d.Log())
	}

	// Coming back takes a new key and a fresh enrollment token.
	d.Kill()
	if err := os.Remove(id.KeyFile); err != nil {
		t.Fatal(err)
	}
	id.setToken(t, mintEnroll(t, cp))
	d.Start(d.Bin, nil)
	wait.For(t, 30*time.Second, "the re-enrollment", func() bool {
		return strings.Count(d.Log(), `"message":"identity key enrolled"`) == 2
	})
	fresh := id.key(t)
	if fresh.ID() == key.ID() {
		t.Fatal("the daemon kept its revoked key")
	}
	r = cp.CLI(t, "daemon", "exec", "revokee", "echo", "back")
	if r.Code != 0 || r.Stdout != "back\n" {
		t.Fatalf("exec after re-enrollment: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	stopDaemon(t, d)
}

// TestIdentityRequireSignatures: with LAKESHORE_REQUIRE_DAEMON_SIGNATURES=1 a
// bearer-only daemon is turned away, and one already polling is refused; an
// enrolled daemon works. Without it, the bearer-only daemon works.
func TestIdentityRequireSignatures(t *testing.T) {
	t.Parallel()
	ca := harness.NewCA(t)
	cp := harness.StartControlPlane(t, harness.CPOptions{TLS: ca})
	legacy := cp.StartDaemon(t, harness.DaemonOptions{Label: "bearer-only", WaitMaxS: 2})
	r := cp.CLI(t, "daemon", "exec", "bearer-only", "echo", "legacy")
	if r.Code != 0 || r.Stdout != "legacy\n" {
		t.Fatalf("bearer-only daemon without the flag: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}

	// The same control plane, restarted with the flag.
	cp.Kill()
	cp.Env = append(cp.Env, "LAKESHORE_REQUIRE_DAEMON_SIGNATURES=1")
	cp.Restart()
	wait.For(t, 30*time.Second, "the polling bearer-only daemon to be refused", func() bool {
		return strings.Contains(cp.Log(), `"reason":"signature_required"`)
	})
	fresh := cp.StartDaemon(t, harness.DaemonOptions{Label: "bearer-late", NoWait: true})
	expectRejected(t, fresh, messages.RejectEnrollmentSignatureRequired)

	id := newIdentityDir(t)
	id.setToken(t, mintEnroll(t, cp))
	signed := cp.StartDaemon(t, harness.DaemonOptions{Label: "signed", ExtraTOML: id.toml()})
	r = cp.CLI(t, "daemon", "exec", "signed", "echo", "signed")
	if r.Code != 0 || r.Stdout != "signed\n" {
		t.Fatalf("enrolled daemon with the flag: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	stopDaemon(t, signed)
	legacy.Kill()
}
