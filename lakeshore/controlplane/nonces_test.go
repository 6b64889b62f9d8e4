package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
	"nymph/test/wait"
)

// signedDaemon is an enrolled key and its worker, driven by hand.
type signedDaemon struct {
	t      testing.TB
	key    *identity.Key
	worker string
	cursor *string
}

// enrollSigned enrolls a new key on e through a signed hello.
func enrollSigned(t testing.TB, e *env, machine string) *signedDaemon {
	t.Helper()
	d := &signedDaemon{t: t, key: newKey(t)}
	tok := expectJS[operatorapi.TokenResponse](t, e.op(http.MethodPost, "/v1/tokens",
		operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll, TTLS: 3600}), http.StatusCreated, "mint an enrollment token")
	hello := helloReq(machine, "signed")
	hello.PublicKey = d.key.PublicKeyB64()
	r := d.signed(e, "/v1/daemon/hello", tok.Token, mustMP(t, hello)).to(e)
	hr := decodeMP[messages.HelloResponse](t, r)
	if r.status != http.StatusOK || hr.Reject != nil || hr.WorkerID == nil {
		t.Fatalf("enrollment: %d %+v", r.status, hr.Reject)
	}
	d.worker, d.cursor = *hr.WorkerID, hr.Cursor
	return d
}

// signedReq is a signed request as sent, to send again as it is.
type signedReq struct {
	t    testing.TB
	req  *http.Request
	body []byte
}

// signed builds a request to e signed by d's key at e's clock.
func (d *signedDaemon) signed(e *env, path, token string, body []byte) signedReq {
	d.t.Helper()
	req, err := http.NewRequest(http.MethodPost, e.url+path, bytes.NewReader(body))
	if err != nil {
		d.t.Fatal(err)
	}
	req.Header.Set("Content-Type", messages.ContentType)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if err := d.key.SignRequest(req, body, e.clock.Now()); err != nil {
		d.t.Fatal(err)
	}
	return signedReq{t: d.t, req: req, body: body}
}

// poll builds an immediate signed poll.
func (d *signedDaemon) poll(e *env) signedReq {
	return d.signed(e, "/v1/daemon/poll", "", mustMP(d.t, &messages.PollRequest{WorkerID: d.worker, Cursor: d.cursor}))
}

// to sends a copy of the request to e's server.
func (s signedReq) to(e *env) resp {
	s.t.Helper()
	r, err := sendCopy(http.DefaultClient, e.url, s.req, s.body)
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

// sendCopy sends a copy of req, with body, to the server at base.
func sendCopy(c *http.Client, base string, req *http.Request, body []byte) (resp, error) {
	cp, err := http.NewRequest(req.Method, base+req.URL.Path, bytes.NewReader(body))
	if err != nil {
		return resp{}, err
	}
	cp.Header = req.Header.Clone()
	r, err := c.Do(cp)
	if err != nil {
		return resp{}, err
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		return resp{}, err
	}
	return resp{status: r.StatusCode, body: b, header: r.Header}, nil
}

// A signed poll captured before a restart is refused after it: the nonce
// was committed to the store before the poll was answered, and the exec
// queued meanwhile is not handed to the replay.
func TestSignedReplayRefusedAfterRestart(t *testing.T) {
	dir := t.TempDir()
	before := newEnvIn(t, dir)
	d := enrollSigned(t, before, "m")
	captured := d.poll(before)
	if r := captured.to(before); r.status != http.StatusOK {
		t.Fatalf("signed poll: %d %q", r.status, r.body)
	}
	before.hs.Close()
	if err := before.srv.Close(); err != nil {
		t.Fatal(err)
	}

	after := newEnvIn(t, dir)
	acc := after.exec(d.worker, operatorapi.ExecRequest{Command: "env", Env: map[string]string{"SECRET": "s3cr3t-value"}})
	r := captured.to(after)
	if r.status != http.StatusUnauthorized || bytes.Contains(r.body, []byte("s3cr3t")) {
		t.Fatalf("replay after the restart: %d %q", r.status, r.body)
	}
	if ex := after.getExec(acc.ExecID, ""); ex.State != operatorapi.ExecQueued {
		t.Fatalf("the exec is %s after the replay, want queued", ex.State)
	}
	// The daemon's own next poll gets it.
	r = d.poll(after).to(after)
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte("s3cr3t-value")) {
		t.Fatalf("the daemon's fresh poll: %d %q", r.status, r.body)
	}
}

// One key past its rate is answered 429 with Retry-After; another key at
// the same instant is served; the first is served again once its bucket
// has refilled.
func TestThrottledKeyIsAnswered429(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.KeyRequestRate, c.KeyRequestBurst = 1, 3 })
	flood, other := enrollSigned(t, e, "flood"), enrollSigned(t, e, "other")
	// The enrollment hello took one of flood's three.
	for i := range 2 {
		if r := flood.poll(e).to(e); r.status != http.StatusOK {
			t.Fatalf("poll %d within the burst: %d %q", i, r.status, r.body)
		}
	}
	r := flood.poll(e).to(e)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
		t.Fatalf("past the burst: %d Retry-After %q %q", r.status, r.header.Get("Retry-After"), r.body)
	}
	if v := decodeMP[messages.ValidationError](t, r); v.Error == "" {
		t.Fatalf("429 body %q", r.body)
	}
	if r := other.poll(e).to(e); r.status != http.StatusOK {
		t.Fatalf("another key meanwhile: %d %q", r.status, r.body)
	}
	e.clock.Advance(time.Second)
	if r := flood.poll(e).to(e); r.status != http.StatusOK {
		t.Fatalf("a second later: %d %q", r.status, r.body)
	}
}

// Expired nonces leave the store in the background, with no request.
func TestExpiredNoncesArePurgedInTheBackground(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.NoncePurgeInterval = 10 * time.Millisecond })
	d := enrollSigned(t, e, "m")
	poll := d.poll(e)
	if r := poll.to(e); r.status != http.StatusOK {
		t.Fatalf("signed poll: %d %q", r.status, r.body)
	}
	req := poll.req
	ts, err := strconv.ParseInt(req.Header.Get(identity.HeaderTimestamp), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	pair := []store.NonceUse{{KeyID: d.key.ID(), Nonce: req.Header.Get(identity.HeaderNonce), Expires: time.Unix(ts+3600, 0)}}
	if fresh, err := e.srv.st.UseNonces(context.Background(), pair); err != nil || fresh[0] {
		t.Fatalf("the poll's nonce is not in the store: %v %v", fresh, err)
	}
	e.clock.Advance(identity.DefaultMaxSkew + 2*time.Second)
	// Recorded again (fresh) only once the purge has dropped it.
	wait.For(t, 10*time.Second, "the expired nonce purged", func() bool {
		fresh, err := e.srv.st.UseNonces(context.Background(), pair)
		return err == nil && fresh[0]
	})
}

// gatedNonces is a real store whose first UseNonces waits for the test, so
// the test can see what queues behind a commit in progress.
type gatedNonces struct {
	store.Nonces
	entered, release chan struct{}
	once             sync.Once
}

func (g *gatedNonces) UseNonces(ctx context.Context, uses []store.NonceUse) ([]bool, error) {
	g.once.Do(func() {
		close(g.entered)
		<-g.release
	})
	return g.Nonces.UseNonces(ctx, uses)
}

// The nonces that arrive while a commit runs share the next one.
func TestNoncesArriveDuringACommitShareTheNext(t *testing.T) {
	e := newEnv(t)
	g := &gatedNonces{Nonces: e.srv.st, entered: make(chan struct{}), release: make(chan struct{})}
	l := newNonceLedger(g, nonceBatch)
	exp := e.clock.Now().Add(time.Hour)
	type answer struct {
		fresh bool
		err   error
	}
	answers := make(chan answer, 64)
	use := func(nonce string) {
		fresh, err := l.UseNonce(context.Background(), "k", nonce, exp)
		answers <- answer{fresh, err}
	}
	go use("first")
	<-g.entered
	// 48 distinct nonces and one of them twice queue behind it.
	for i := range 48 {
		go use(fmt.Sprint("n", i))
	}
	go use("n7")
	wait.For(t, 10*time.Second, "49 nonces queued", func() bool {
		return l.q.Len() == 49
	})
	close(g.release)
	fresh := 0
	for range 50 {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.fresh {
			fresh++
		}
	}
	if fresh != 49 || l.commits.Load() != 2 || l.recorded.Load() != 50 {
		t.Fatalf("%d fresh of 50 (want 49: one nonce twice) in %d commits of %d nonces (want 2 of 50)",
			fresh, l.commits.Load(), l.recorded.Load())
	}
}
