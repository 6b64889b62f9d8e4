package e2e

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/harness"
	"nymph/test/wait"
)

// Replay protection that survives restarts and is per key (issue 11,
// holes 7 and 8), against a real `lakeshore serve`.

// answeredPoll waits for a signed poll sent after since that the control
// plane answered 200, as an eavesdropper between the daemon and the
// control plane would keep it.
func answeredPoll(t *testing.T, rec *recorder, since time.Time) recorded {
	t.Helper()
	var got recorded
	wait.For(t, 30*time.Second, "a signed poll answered 200", func() bool {
		for _, p := range rec.all("/v1/daemon/poll") {
			if p.Status == http.StatusOK && p.Header.Get(identity.HeaderNonce) != "" && !p.At.Before(since) {
				got = p
				return true
			}
		}
		return false
	})
	return got
}

// postRaw sends body to path with the given headers and returns the
// status and the answer's body.
func postRaw(t *testing.T, cp *harness.ControlPlane, path string, hdr http.Header, body []byte) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, cp.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range hdr {
		if k == "Content-Length" || k == "Accept-Encoding" || strings.HasPrefix(k, "X-Forwarded") {
			continue
		}
		req.Header[k] = append([]string(nil), vs...)
	}
	resp, err := cp.HTTP.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// Hole 7: a signed poll captured before the control plane went down is
// replayed after it comes back. Its nonce was committed to the store
// before the poll was answered, so the replay is refused, and the exec
// queued meanwhile, a secret in its env, is not handed to it.
func TestInternetNonceReplayAfterRestartRefused(t *testing.T) {
	t.Parallel()
	cp, rec, _, d := startSigned(t, harness.DaemonOptions{Label: "replayed"})
	worker := cp.WaitForWorker(t, "replayed")
	captured := answeredPoll(t, rec, time.Time{})
	stopDaemon(t, d)

	cp.Kill() // a crash: only what was committed survives
	cp.Restart()
	const secret = "nonce-e2e-secret-6c1f"
	var acc operatorapi.ExecAccepted
	if err := cp.PostJSON("/v1/namespaces/default/workers/"+worker.ID+"/exec",
		operatorapi.ExecRequest{Command: "true", Env: map[string]string{"NONCE_E2E_SECRET": secret}}, &acc); err != nil {
		t.Fatal(err)
	}
	status, body := postRaw(t, cp, captured.Path, captured.Header, captured.Body)
	if status != http.StatusUnauthorized || bytes.Contains(body, []byte(secret)) {
		t.Fatalf("poll replayed after the restart: %d %q", status, body)
	}
	var ex operatorapi.Exec
	if err := cp.GetJSON("/v1/namespaces/default/execs/"+acc.ExecID, &ex); err != nil || ex.State != operatorapi.ExecQueued {
		t.Fatalf("the exec after the replay: %+v %v, want it still queued", ex, err)
	}
	if !logLine(cp.Log(), `"reason":"replay"`, captured.Header.Get(identity.HeaderKeyID)) {
		t.Fatalf("the control plane did not log the replay:\n%s", cp.Log())
	}
}

// flood sends n presign requests signed by k, each with a nonce of its
// own and the timestamp at() gives, from 16 connections straight to the
// control plane, and counts the answers by status. The presign route
// does no store work of its own, so the cost is the signature's. Every
// 429 must say when to come back.
func flood(t *testing.T, cp *harness.ControlPlane, k *identity.Key, n int, at func() time.Time) map[int]int {
	t.Helper()
	const conns = 16
	body, err := messages.Marshal(&messages.PresignRequest{Op: messages.PresignPut})
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if t, ok := cp.HTTP.Transport.(*http.Transport); ok {
		tr = t.Clone() // the control plane's CA
	}
	tr.MaxIdleConnsPerHost = conns
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	defer tr.CloseIdleConnections()
	url := cp.URL + "/v1/namespaces/default/payloads/presign"
	var mu sync.Mutex
	counts := map[int]int{}
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
				if err == nil {
					req.Header.Set("Content-Type", messages.ContentType)
					err = k.SignRequest(req, body, at())
				}
				var resp *http.Response
				if err == nil {
					resp, err = hc.Do(req)
				}
				if err != nil {
					errs <- err
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 {
						errs <- &retryAfterError{resp.Header.Get("Retry-After")}
						return
					}
				}
				mu.Lock()
				counts[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("flood: %v", err)
	}
	return counts
}

type retryAfterError struct{ got string }

func (e *retryAfterError) Error() string { return "a 429 with Retry-After " + strconv.Quote(e.got) }

// startFlooder enrolls a second daemon on cp, stops it, and returns its
// key: an enrolled key the test signs with by hand.
func startFlooder(t *testing.T, cp *harness.ControlPlane) *identity.Key {
	t.Helper()
	id := newIdentityDir(t)
	id.setToken(t, mintEnroll(t, cp))
	d := cp.StartDaemon(t, harness.DaemonOptions{Label: "flooder", WaitMaxS: waitMax, ExtraTOML: id.toml()})
	cp.WaitForWorker(t, "flooder")
	stopDaemon(t, d)
	return id.key(t)
}

// refusedThrough returns the requests of the recorded daemon the control
// plane refused with 401 or 429.
func refusedThrough(rec *recorder) []recorded {
	var out []recorded
	for _, r := range rec.all("") {
		if r.Status == http.StatusUnauthorized || r.Status == http.StatusTooManyRequests {
			out = append(out, r)
		}
	}
	return out
}

// Hole 8: 100,100 validly signed requests from one enrolled key, stamped
// 290 s ahead, used to evict every other key's nonces from the one shared
// cache and lock every other signed daemon out with 401s. The throttle is
// off here, so that the whole flood is accepted and lands in the nonce
// windows: the other daemon keeps working through it and after it. Plain
// HTTP, so the flood costs signatures, not TLS. It keeps both cores busy
// for a minute or two (the race detector makes the test's own signing ten
// times slower), so it does not run in parallel with other tests, whose
// waits it would stretch.
func TestInternetNonceFloodFromOneKeyLeavesOthersWorking(t *testing.T) {
	cp := harness.StartControlPlane(t, harness.CPOptions{Args: []string{"--daemon-key-rate", "0"}})
	id := newIdentityDir(t)
	id.setToken(t, mintEnroll(t, cp))
	victim := cp.StartDaemon(t, harness.DaemonOptions{Label: "victim", WaitMaxS: waitMax, ExtraTOML: id.toml()})
	worker := cp.WaitForWorker(t, "victim")
	victimKey := id.key(t)
	key := startFlooder(t, cp)

	const total = 100_100
	counts := flood(t, cp, key, total, func() time.Time { return time.Now().Add(290 * time.Second) })
	t.Logf("flood of %d: %v", total, counts)
	if counts[http.StatusOK] != total {
		t.Fatalf("flood answers %v, want all %d accepted (the throttle is off)", counts, total)
	}
	if got := signedPoll(t, cp, victimKey, worker.ID); got != http.StatusOK {
		t.Fatalf("the other daemon's key, signed now, after the flood: %d", got)
	}
	stillWorksThenStop(t, cp, victim, "victim")
	if logLine(cp.Log(), "daemon request refused", victimKey.ID()) {
		t.Fatalf("a request of the other daemon was refused:\n%s", cp.Log())
	}
}

// A key sending far more than a daemon does is throttled on its own: it
// is answered 429 with Retry-After, and the other daemon, under the same
// limits, is not slowed at all. The rate here refills one request every
// 100 s, so what the flood gets past the burst does not depend on how
// fast the machine is.
func TestInternetNonceThrottleIsPerKey(t *testing.T) {
	t.Parallel()
	const burst = 100
	cp := harness.StartControlPlane(t, harness.CPOptions{TLS: harness.NewCA(t),
		Args: []string{"--daemon-key-rate", "0.01", "--daemon-key-burst", strconv.Itoa(burst)}})
	rec := startRecorder(t, cp)
	id := newIdentityDir(t)
	id.setToken(t, mintEnroll(t, cp))
	victim := cp.StartDaemon(t, harness.DaemonOptions{Label: "victim", ServerURL: rec.URL, WaitMaxS: waitMax, ExtraTOML: id.toml()})
	cp.WaitForWorker(t, "victim")
	key := startFlooder(t, cp)

	counts := flood(t, cp, key, 3*burst, time.Now)
	t.Logf("flood of %d: %v", 3*burst, counts)
	// The flooder's hello and polls took some of its burst already.
	if counts[http.StatusOK] > burst || counts[http.StatusOK]+counts[http.StatusTooManyRequests] != 3*burst || counts[http.StatusTooManyRequests] < 2*burst {
		t.Fatalf("flood answers %v, want at most %d accepted and the rest 429", counts, burst)
	}
	if !logLine(cp.Log(), "key", key.ID(), "faster than its limit") {
		t.Fatalf("the control plane did not log the throttle:\n%s", cp.Log())
	}
	answeredPoll(t, rec, time.Now())
	if refused := refusedThrough(rec); len(refused) > 0 {
		t.Fatalf("the other daemon's %s %s was answered %d", refused[0].Method, refused[0].Path, refused[0].Status)
	}
	stillWorksThenStop(t, cp, victim, "victim")
}
