package keys_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/rs/zerolog"

	"nymph/actors/keys"
	"nymph/daemon/uplink"
	"nymph/identity"
	"nymph/messages"
	"nymph/test/wait"
)

// cp is a control plane's /v1/daemon/keys and /v1/daemon/poll, with real
// signature checks: the current key verifies, a rotation revokes it.
type cp struct {
	t   *testing.T
	srv *httptest.Server
	v   *identity.Verifier

	mu      sync.Mutex
	pubs    map[string]ed25519.PublicKey
	revoked map[string]bool
	current string
	// fail answers the next n /keys requests with status (0: drop the
	// connection); commitThenFail applies the rotation before failing.
	fail           int
	failStatus     int
	commitThenFail bool
	reject         *messages.Reject
	keysCalls      []messages.KeysRequest
	keysSigners    []string
	refusals       int
}

func newCP(t *testing.T, k *identity.Key) *cp {
	c := &cp{t: t, pubs: map[string]ed25519.PublicKey{k.ID(): k.PublicKey()}, revoked: map[string]bool{}, current: k.ID()}
	c.v = identity.NewVerifier(c)
	c.srv = httptest.NewServer(http.HandlerFunc(c.handle))
	t.Cleanup(c.srv.Close)
	return c
}

func (c *cp) LookupKey(_ context.Context, id string) (ed25519.PublicKey, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pub, ok := c.pubs[id]
	if !ok {
		return nil, false, identity.ErrUnknownKey
	}
	return pub, c.revoked[id], nil
}

func (c *cp) handle(w http.ResponseWriter, r *http.Request) {
	var body bytes.Buffer
	_, _ = body.ReadFrom(r.Body)
	kid, err := c.v.Verify(r.Context(), r, body.Bytes(), time.Now())
	if errors.Is(err, identity.ErrRevokedKey) && r.URL.Path == uplink.PathKeys && c.repeat(r, body.Bytes(), w) {
		return
	}
	if err != nil {
		c.mu.Lock()
		c.refusals++
		c.mu.Unlock()
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	if r.URL.Path == uplink.PathPoll {
		c.write(w, &messages.PollResponse{Commands: []messages.Command{}})
		return
	}
	var req messages.KeysRequest
	if err := messages.Unmarshal(body.Bytes(), &req); err != nil {
		c.t.Error(err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.keysCalls = append(c.keysCalls, req)
	c.keysSigners = append(c.keysSigners, kid)
	commit := func() {
		pub, err := identity.ParsePublicKey(req.PublicKey)
		if err != nil || identity.KeyID(pub) != req.KeyID {
			c.t.Errorf("bad rotation request %+v", req)
			return
		}
		c.pubs[req.KeyID] = pub
		c.revoked[kid] = true
		c.current = req.KeyID
	}
	if c.fail > 0 {
		c.fail--
		if c.commitThenFail {
			commit()
		}
		if c.failStatus == 0 {
			hj, _ := w.(http.Hijacker)
			conn, _, _ := hj.Hijack()
			conn.Close()
			return
		}
		w.WriteHeader(c.failStatus)
		return
	}
	if c.reject != nil {
		c.writeLocked(w, &messages.KeysResponse{Reject: c.reject})
		return
	}
	commit()
	c.writeLocked(w, &messages.KeysResponse{KeyID: &req.KeyID})
}

// repeat answers a rotation repeated with the key it retired, as the
// control plane does, when the offered key is the one now current.
func (c *cp) repeat(r *http.Request, body []byte, w http.ResponseWriter) bool {
	var req messages.KeysRequest
	if messages.Unmarshal(body, &req) != nil {
		return false
	}
	c.mu.Lock()
	cur := c.current
	old := c.pubs[r.Header.Get(identity.HeaderKeyID)]
	c.mu.Unlock()
	if req.KeyID != cur || old == nil {
		return false
	}
	if _, err := c.v.VerifyWithKey(r.Context(), old, r, body, time.Now()); err != nil {
		return false
	}
	c.mu.Lock()
	c.keysCalls = append(c.keysCalls, req)
	c.keysSigners = append(c.keysSigners, identity.KeyID(old))
	c.mu.Unlock()
	c.write(w, &messages.KeysResponse{KeyID: &req.KeyID})
	return true
}

func (c *cp) write(w http.ResponseWriter, v any) {
	b, _ := messages.Marshal(v)
	w.Header().Set("Content-Type", messages.ContentType)
	_, _ = w.Write(b)
}

func (c *cp) writeLocked(w http.ResponseWriter, v any) { c.write(w, v) }

// rig is one keys actor in its own actor system.
type rig struct {
	t       *testing.T
	cp      *cp
	holder  *keys.Holder
	client  *uplink.Client
	keyFile string
	sys     *actor.ActorSystem
	pid     *actor.PID
	results chan keys.Result
	deps    *keys.Deps
	logs    *bytes.Buffer
	logMu   *sync.Mutex
}

// quietSystem is an actor system that does not log its own start.
func quietSystem() *actor.ActorSystem {
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler)
	}))
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func newRig(t *testing.T, tweak func(*keys.Deps)) *rig {
	t.Helper()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "id", "identity.key")
	k, created, err := identity.LoadOrCreate(keyFile)
	if err != nil || !created {
		t.Fatalf("%v %v", created, err)
	}
	c := newCP(t, k)
	h := keys.NewHolder(k)
	client, err := uplink.New(c.srv.URL, uplink.WithSigner(h), uplink.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, cp: c, holder: h, client: client, keyFile: keyFile, results: make(chan keys.Result, 8),
		logs: &bytes.Buffer{}, logMu: &sync.Mutex{}}
	r.deps = &keys.Deps{
		Holder: h, Server: client, KeyFile: keyFile, WorkerID: func() string { return "w-1" },
		Log:       zerolog.New(lockedWriter{r.logMu, r.logs}),
		Retryable: uplink.Retryable, RetryMin: 10 * time.Millisecond, RetryMax: 40 * time.Millisecond,
		Report: func(res keys.Result) { r.results <- res },
	}
	if tweak != nil {
		tweak(r.deps)
	}
	r.sys = quietSystem()
	r.pid, err = r.sys.Root.SpawnNamed(keys.Props(r.deps), keys.Name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.sys.Root.StopFuture(r.pid).Wait()
		r.sys.Shutdown()
	})
	return r
}

func (r *rig) rotate(id string) {
	r.sys.Root.Send(r.pid, &messages.Dispatch{CommandID: id, Kind: messages.KindRotateKey, Body: messages.RotateKey{}})
}

func (r *rig) result() keys.Result {
	r.t.Helper()
	select {
	case res := <-r.results:
		return res
	case <-time.After(20 * time.Second):
		r.t.Fatal("no rotation result")
		return keys.Result{}
	}
}

func (r *rig) logged(s string) bool {
	r.logMu.Lock()
	defer r.logMu.Unlock()
	return bytes.Contains(r.logs.Bytes(), []byte(s))
}

func (r *rig) poll() error {
	_, err := r.client.Poll(context.Background(), &messages.PollRequest{WorkerID: "w-1"})
	return err
}

func fileKeyID(t *testing.T, path string) string {
	t.Helper()
	k, err := identity.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return k.ID()
}

func TestRotationAccepted(t *testing.T) {
	r := newRig(t, nil)
	old := r.holder.Key()
	r.rotate("c1")
	res := r.result()
	if !res.Accepted || res.Err != nil || res.OldKeyID != old.ID() || res.NewKeyID == old.ID() || res.Attempts != 1 {
		t.Fatalf("%+v", res)
	}
	if r.holder.Key().ID() != res.NewKeyID || fileKeyID(t, r.keyFile) != res.NewKeyID {
		t.Fatal("the accepted key is not in use and on disk")
	}
	st, err := os.Stat(r.keyFile)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file mode %v %v", st.Mode(), err)
	}
	r.cp.mu.Lock()
	signer, req := r.cp.keysSigners[0], r.cp.keysCalls[0]
	r.cp.mu.Unlock()
	if signer != old.ID() || req.WorkerID != "w-1" || req.KeyID != res.NewKeyID {
		t.Fatalf("signed by %s, body %+v", signer, req)
	}
	if err := r.poll(); err != nil {
		t.Fatalf("poll with the new key: %v", err)
	}
	// The old key no longer works.
	req2, _ := http.NewRequest(http.MethodPost, r.cp.srv.URL+uplink.PathPoll, nil)
	_ = old.SignRequest(req2, nil, time.Now())
	resp, err := http.DefaultClient.Do(req2)
	if err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("old key after rotation: %v %v", resp, err)
	}
	resp.Body.Close()
}

func TestRotationFailuresKeepTheOldKey(t *testing.T) {
	cases := []struct {
		name     string
		set      func(c *cp)
		attempts int
	}{
		{"rejected", func(c *cp) { c.reject = &messages.Reject{Code: messages.RejectKeyIDMismatch, Message: "no"} }, 1},
		{"5xx throughout", func(c *cp) { c.fail, c.failStatus = 100, http.StatusServiceUnavailable }, keys.DefaultAttempts},
		{"connection dropped throughout", func(c *cp) { c.fail = 100 }, keys.DefaultAttempts},
		{"4xx", func(c *cp) { c.fail, c.failStatus = 100, http.StatusUnprocessableEntity }, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			old := r.holder.Key()
			before, _ := os.ReadFile(r.keyFile)
			r.cp.mu.Lock()
			tc.set(r.cp)
			r.cp.mu.Unlock()
			r.rotate("c1")
			res := r.result()
			if res.Accepted || res.Err == nil || res.Attempts != tc.attempts {
				t.Fatalf("%+v", res)
			}
			after, _ := os.ReadFile(r.keyFile)
			if r.holder.Key() != old || !bytes.Equal(before, after) || r.holder.Rotating() {
				t.Fatal("a failed rotation changed the key in use or on disk")
			}
			if err := r.poll(); err != nil {
				t.Fatalf("old key stopped working: %v", err)
			}
			if !r.logged("key rotation failed: the old key stays in use and on disk") {
				t.Fatal("no reason logged")
			}
		})
	}
}

func TestTransientFailureRetriesTheSameKey(t *testing.T) {
	r := newRig(t, nil)
	r.cp.mu.Lock()
	r.cp.fail, r.cp.failStatus = 2, http.StatusBadGateway
	r.cp.mu.Unlock()
	r.rotate("c1")
	res := r.result()
	if !res.Accepted || res.Attempts != 3 {
		t.Fatalf("%+v", res)
	}
	r.cp.mu.Lock()
	defer r.cp.mu.Unlock()
	for _, k := range r.cp.keysCalls {
		if k.KeyID != res.NewKeyID {
			t.Fatalf("retries offered different keys: %+v", r.cp.keysCalls)
		}
	}
}

// An acceptance lost on the way: the control plane committed, the answer
// never arrived. The retry offers the same key, signed by the key the
// control plane just retired, which answers it with the same acceptance.
func TestLostAcceptanceIsRetried(t *testing.T) {
	r := newRig(t, nil)
	r.cp.mu.Lock()
	r.cp.fail, r.cp.commitThenFail = 1, true
	r.cp.mu.Unlock()
	r.rotate("c1")
	res := r.result()
	r.cp.mu.Lock()
	calls := len(r.cp.keysCalls)
	r.cp.mu.Unlock()
	if !res.Accepted || res.Attempts != 2 || calls != 2 || r.holder.Key().ID() != res.NewKeyID {
		t.Fatalf("%+v calls=%d", res, calls)
	}
	if err := r.poll(); err != nil {
		t.Fatal(err)
	}
}

func TestSecondRotateWhileBusyIsSkipped(t *testing.T) {
	gate := make(chan struct{})
	r := newRig(t, func(d *keys.Deps) {
		gen := identity.Generate
		d.Generate = func() (*identity.Key, error) {
			<-gate
			return gen()
		}
	})
	r.rotate("c1")
	r.rotate("c2")
	wait.For(t, 10*time.Second, "c2 to be skipped", func() bool { return r.logged("rotation is under way; skipped") })
	close(gate)
	res := r.result()
	if res.CommandID != "c1" || !res.Accepted {
		t.Fatalf("%+v", res)
	}
	r.rotate("c3")
	if res := r.result(); res.CommandID != "c3" || !res.Accepted {
		t.Fatalf("%+v", res)
	}
	if len(r.results) != 0 {
		t.Fatalf("a rotation for c2 ran: %+v", <-r.results)
	}
}

func TestSaveFailureStillSwitches(t *testing.T) {
	r := newRig(t, func(d *keys.Deps) {
		d.Save = func(*identity.Key, string) error { return errors.New("disk full") }
	})
	r.rotate("c1")
	res := r.result()
	if !res.Accepted || res.Err == nil || r.holder.Key().ID() != res.NewKeyID {
		t.Fatalf("%+v", res)
	}
	// The control plane retired the old key: signing with it would fail.
	if err := r.poll(); err != nil {
		t.Fatal(err)
	}
}

func TestNoWorkerIDNoPost(t *testing.T) {
	r := newRig(t, func(d *keys.Deps) { d.WorkerID = func() string { return "" } })
	r.rotate("c1")
	res := r.result()
	r.cp.mu.Lock()
	calls := len(r.cp.keysCalls)
	r.cp.mu.Unlock()
	if res.Accepted || res.Err == nil || calls != 0 {
		t.Fatalf("%+v, %d posts", res, calls)
	}
}

// Requests keep flowing through a rotation: each is signed wholly by one
// key, and none fails, including those the control plane refuses because
// it retired their key a moment before the daemon switched.
func TestConcurrentRequestsThroughRotations(t *testing.T) {
	r := newRig(t, nil)
	stop := make(chan struct{})
	errs := make(chan error, 64)
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := r.poll(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	for i := range 5 {
		r.rotate("c" + string(rune('0'+i)))
		if res := r.result(); !res.Accepted || res.Err != nil {
			t.Fatalf("%+v", res)
		}
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a request failed during rotation: %v", err)
	}
	if fileKeyID(t, r.keyFile) != r.holder.Key().ID() {
		t.Fatal("key file is not the key in use")
	}
}

func TestNoIdentitySkips(t *testing.T) {
	sys := quietSystem()
	defer sys.Shutdown()
	var buf bytes.Buffer
	var mu sync.Mutex
	pid := sys.Root.Spawn(keys.Props(&keys.Deps{Log: zerolog.New(lockedWriter{&mu, &buf})}))
	defer func() { _ = sys.Root.StopFuture(pid).Wait() }()
	sys.Root.Send(pid, &messages.Dispatch{CommandID: "c", Kind: messages.KindRotateKey, Body: messages.RotateKey{}})
	wait.For(t, 10*time.Second, "rotate_key without identity to be logged", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return bytes.Contains(buf.Bytes(), []byte("no identity"))
	})
}
