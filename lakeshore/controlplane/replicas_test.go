package controlplane

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store/sqlite"
	"nymph/messages"
)

// bus stands in for PostgreSQL's LISTEN/NOTIFY in process: what one member
// publishes reaches every other member that is listening.
type bus struct {
	mu        sync.Mutex
	listening map[*busMember]func(string)
}

type busMember struct {
	b *bus
	// failures is how many Listen calls fail before one works, as a
	// listener whose database connection drops does.
	failures int
}

func (b *bus) member(failures int) *busMember {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.listening == nil {
		b.listening = map[*busMember]func(string){}
	}
	return &busMember{b: b, failures: failures}
}

func (m *busMember) Publish(_ context.Context, key string) error {
	m.b.mu.Lock()
	var deliver []func(string)
	for other, fn := range m.b.listening {
		if other != m {
			deliver = append(deliver, fn)
		}
	}
	m.b.mu.Unlock()
	for _, fn := range deliver {
		fn(key)
	}
	return nil
}

func (m *busMember) Listen(ctx context.Context, deliver func(string)) error {
	if m.failures > 0 {
		m.failures--
		return errors.New("connection refused")
	}
	m.b.mu.Lock()
	m.b.listening[m] = deliver
	m.b.mu.Unlock()
	deliver("")
	<-ctx.Done()
	m.b.mu.Lock()
	delete(m.b.listening, m)
	m.b.mu.Unlock()
	return ctx.Err()
}

// TestReplicasWakeEachOther runs two control planes on one store, joined by
// a Notifier: a poll parked on A is woken by an exec queued through B, and
// an exec-output wait on A by the result posted to B. Without the Notifier
// both waits would run to their full 15 s; the 5 s bound is far from both
// that and the milliseconds a wake-up takes.
func TestReplicasWakeEachOther(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	var b bus
	shared := func(listenFailures int) envOpt {
		return func(c *Config) { c.Store, c.Notifier = db, b.member(listenFailures) }
	}
	// A's listener fails twice before it listens: the retry must recover.
	a := newEnv(t, shared(2))
	r := newEnv(t, shared(0))

	id, cur := a.hello("m", "l")
	polled := make(chan messages.PollResponse, 1)
	go func() { polled <- a.poll(id, &cur, 15, "") }()
	a.waitParked(workerKey(id))
	start := time.Now()
	acc := r.exec(id, operatorapi.ExecRequest{Command: "true"})
	var p messages.PollResponse
	select {
	case p = <-polled:
	case <-time.After(10 * time.Second):
		t.Fatal("the poll parked on A was not woken by the exec queued through B")
	}
	if took := time.Since(start); took > 5*time.Second || len(p.Commands) != 1 {
		t.Fatalf("after %v the poll returned %v", took, commandsOf(p))
	}

	waited := make(chan operatorapi.Exec, 1)
	go func() { waited <- a.getExec(acc.ExecID, "?wait=15&offset=0") }()
	a.waitParked(execStateKey(acc.ExecID))
	start = time.Now()
	res := mustMarshal(t, &messages.ExecResult{ExitCode: 0, DurationMs: 1})
	if resp := r.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/result", messages.ContentType, testDaemon, res); resp.status != http.StatusOK {
		t.Fatalf("result through B: %d %q", resp.status, resp.body)
	}
	select {
	case got := <-waited:
		if took := time.Since(start); took > 5*time.Second || got.State != operatorapi.ExecFinished {
			t.Fatalf("after %v the exec on A reads %+v", took, got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the exec wait on A was not woken by the result posted to B")
	}
}

// TestHubDeliverEmptyKeyWakesEveryone: a listener that reconnects cannot
// know what it missed, so the empty key wakes every waiter.
func TestHubDeliverEmptyKeyWakesEveryone(t *testing.T) {
	h := newHub()
	w1, rel1 := h.subscribe(workerKey("a"))
	w2, rel2 := h.subscribe(execKey("b"))
	defer rel1()
	defer rel2()
	h.deliver("")
	for _, w := range []<-chan struct{}{w1, w2} {
		select {
		case <-w:
		default:
			t.Fatal("a waiter slept through the empty key")
		}
	}
	if h.size() != 0 {
		t.Fatalf("%d keys left", h.size())
	}
}

// A signed request accepted by one replica is refused as a replay by the
// other: replicas record nonces in the store they share.
func TestReplicasShareReplayProtection(t *testing.T) {
	db, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "shared.db"))
	if err != nil {
		t.Fatal(err)
	}
	var b bus
	shared := func(c *Config) { c.Store, c.Notifier = db, b.member(0) }
	a, r := newEnv(t, shared), newEnv(t, shared)

	key := newKey(t)
	tok := decodeJS[operatorapi.TokenResponse](t, a.op(http.MethodPost, "/v1/tokens", operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll, TTLS: 3600}))
	hello := helloReq("m", "l")
	hello.PublicKey = key.PublicKeyB64()
	send := func(e *env, path, token string, body []byte, sign bool) (*http.Request, resp) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, e.url+path, bytes.NewReader(body))
		req.Header.Set("Content-Type", messages.ContentType)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		if sign {
			if err := key.SignRequest(req, body, e.clock.Now()); err != nil {
				t.Fatal(err)
			}
		}
		return req, replay(t, e, req, body)
	}
	_, hr := send(a, "/v1/daemon/hello", tok.Token, mustMP(t, hello), true)
	h := decodeMP[messages.HelloResponse](t, hr)
	if hr.status != http.StatusOK || h.Reject != nil || h.WorkerID == nil {
		t.Fatalf("enrollment through A: %d %+v", hr.status, h.Reject)
	}

	body := mustMP(t, &messages.PollRequest{WorkerID: *h.WorkerID, Cursor: h.Cursor})
	req, first := send(a, "/v1/daemon/poll", "", body, true)
	if first.status != http.StatusOK {
		t.Fatalf("signed poll through A: %d %q", first.status, first.body)
	}
	if again := replay(t, r, req, body); again.status != http.StatusUnauthorized {
		t.Fatalf("the same request replayed to B: %d %q", again.status, again.body)
	}
	// B itself takes a fresh signed request.
	if _, fresh := send(r, "/v1/daemon/poll", "", body, true); fresh.status != http.StatusOK {
		t.Fatalf("fresh signed poll through B: %d %q", fresh.status, fresh.body)
	}
}

// replay sends a copy of req (its method, path, headers and body) to e.
func replay(t *testing.T, e *env, req *http.Request, body []byte) resp {
	t.Helper()
	cp, _ := http.NewRequest(req.Method, e.url+req.URL.Path, bytes.NewReader(body))
	cp.Header = req.Header.Clone()
	r, err := http.DefaultClient.Do(cp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{status: r.StatusCode, body: b, header: r.Header}
}
