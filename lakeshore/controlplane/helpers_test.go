package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/releases"
	"nymph/lakeshore/store"
	"nymph/lakeshore/store/sqlite"
	"nymph/messages"
	"nymph/test/fakeclock"
)

// clock is a settable clock for stale derivation and deadlines.

const (
	testAdmin  = "admin-secret"
	testDaemon = "daemon-bootstrap"
)

// newServer is New over the stores `lakeshore serve` gives a data dir:
// payloads and releases in cfg.DataDir, and the SQLite file there unless cfg
// brings a Store. Without a data dir, cfg goes to New as it is.
func newServer(ctx context.Context, cfg Config) (*Server, error) {
	var opened store.Store
	if dir := cfg.DataDir; dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		rel, err := releases.Open(filepath.Join(dir, "releases"))
		if err != nil {
			return nil, err
		}
		cfg.Releases, cfg.Payloads = rel, NewPayloadStore(filepath.Join(dir, "payloads"))
		if cfg.Store == nil {
			if opened, err = sqlite.Open(ctx, filepath.Join(dir, "lakeshore.db")); err != nil {
				return nil, err
			}
			cfg.Store = opened
		}
	}
	srv, err := New(ctx, cfg)
	if err != nil && opened != nil {
		opened.Close()
	}
	return srv, err
}

// serveLoopback runs srv.Serve on a fresh loopback port until cancel;
// served then reports what Serve returned.
func serveLoopback(t testing.TB, srv *Server) (addr string, cancel context.CancelFunc, served <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	return ln.Addr().String(), cancel, done
}

type env struct {
	t      testing.TB
	dir    string
	srv    *Server
	hs     *httptest.Server
	lot    *parkingLot // nil when served by Serve
	url    string
	clock  *fakeclock.Clock
	parked chan string
}

type envOpt func(*Config)

func newEnv(t testing.TB, opts ...envOpt) *env {
	t.Helper()
	return newEnvIn(t, t.TempDir(), opts...)
}

func newEnvIn(t testing.TB, dir string, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, dir: dir, clock: fakeclock.New(time.Now().UTC().Truncate(time.Second)), parked: make(chan string, 64)}
	hs := httptest.NewUnstartedServer(nil)
	cfg := Config{
		DataDir:     dir,
		PublicURL:   "http://" + hs.Listener.Addr().String(),
		AdminToken:  testAdmin,
		DaemonToken: testDaemon,
		Logger:      zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		Now:         e.clock.Now,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	srv.parked = func(key string) {
		select {
		case e.parked <- key:
		default:
		}
	}
	hs.Config.Handler = srv.Handler()
	// Polls park their connections as under Serve.
	lot := srv.parkOn(hs.Config, hs.Listener)
	hs.Listener = lot
	hs.Start()
	e.srv, e.hs, e.lot, e.url = srv, hs, lot, hs.URL
	t.Cleanup(func() {
		srv.stopWaiting()
		hs.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		lot.drain(ctx)
		cancel()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e
}

// waitParked blocks until a long-poll parks on key.
func (e *env) waitParked(key string) {
	e.t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case k := <-e.parked:
			if k == key {
				return
			}
		case <-deadline:
			e.t.Fatalf("no long-poll parked on %s", key)
		}
	}
}

type resp struct {
	status int
	body   []byte
	header http.Header
}

func (e *env) do(method, path, contentType, token string, body []byte) resp {
	e.t.Helper()
	return doCtx(e.t, context.Background(), method, e.url+path, contentType, token, body)
}

func doCtx(t testing.TB, ctx context.Context, method, url, contentType, token string, body []byte) resp {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	r, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatalf("read body: %v", err)
	}
	return resp{status: r.StatusCode, body: b, header: r.Header}
}

// daemon posts a msgpack body with the bootstrap token.
func (e *env) daemon(path string, body any) resp {
	e.t.Helper()
	return e.daemonAs(testDaemon, path, body)
}

func (e *env) daemonAs(token, path string, body any) resp {
	e.t.Helper()
	b, err := messages.Marshal(body)
	if err != nil {
		e.t.Fatalf("marshal: %v", err)
	}
	return e.do(http.MethodPost, path, messages.ContentType, token, b)
}

func decodeMP[T any](t testing.TB, r resp) T {
	t.Helper()
	var v T
	if err := messages.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode msgpack (status %d): %v", r.status, err)
	}
	return v
}

func decodeJS[T any](t testing.TB, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(r.body, &v); err != nil {
		t.Fatalf("decode JSON (status %d, %q): %v", r.status, r.body, err)
	}
	return v
}

// expectJS fails the test, naming what was asked, unless r has status want,
// and decodes its JSON body.
func expectJS[T any](t testing.TB, r resp, want int, what string) T {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: %d %q", what, r.status, r.body)
	}
	return decodeJS[T](t, r)
}

// mustJSON marshals v or fails the test.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// op calls an operator route with the admin token and a JSON body.
func (e *env) op(method, path string, body any) resp {
	e.t.Helper()
	var b []byte
	if body != nil {
		b = mustJSON(e.t, body)
	}
	return e.do(method, path, "application/json", testAdmin, b)
}

func str(s string) *string { return &s }

func helloReq(machine, label string) *messages.HelloRequest {
	return &messages.HelloRequest{
		MachineID:    machine,
		Label:        label,
		Tags:         []string{"env=test"},
		Capabilities: messages.Capabilities{Runners: []string{"process"}, MaxInvocations: 4, Workdir: "/tmp/w"},
		Versions:     messages.Versions{Daemon: str("0.0.1"), Protocol: str("1"), Arch: str("x86_64")},
	}
}

// hello registers a daemon and returns its worker id and hello cursor.
func (e *env) hello(machine, label string, lanes ...string) (string, string) {
	e.t.Helper()
	h := helloReq(machine, label)
	h.Lanes = lanes
	r := e.daemon("/v1/daemon/hello", h)
	if r.status != http.StatusOK {
		e.t.Fatalf("hello: %d %q", r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](e.t, r)
	if hr.Reject != nil || hr.WorkerID == nil || hr.Cursor == nil {
		e.t.Fatalf("hello: %+v", hr)
	}
	return *hr.WorkerID, *hr.Cursor
}

func (e *env) poll(worker string, cursor *string, timeout float64, queue string) messages.PollResponse {
	e.t.Helper()
	r := e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: worker, Queue: queue, TimeoutS: timeout, Cursor: cursor})
	if r.status != http.StatusOK {
		e.t.Fatalf("poll: %d %q", r.status, r.body)
	}
	return decodeMP[messages.PollResponse](e.t, r)
}

func (e *env) worker(id string) operatorapi.Worker {
	e.t.Helper()
	return expectJS[operatorapi.Worker](e.t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id, nil), http.StatusOK, "get worker")
}

func (e *env) exec(worker string, req operatorapi.ExecRequest) operatorapi.ExecAccepted {
	e.t.Helper()
	return expectJS[operatorapi.ExecAccepted](e.t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+worker+"/exec", req), http.StatusAccepted, "exec")
}

func (e *env) getExec(id, query string) operatorapi.Exec {
	e.t.Helper()
	return expectJS[operatorapi.Exec](e.t, e.op(http.MethodGet, "/v1/namespaces/default/execs/"+id+query, nil), http.StatusOK, "get exec")
}

// errField decodes an error body (msgpack or JSON) and returns its field.
func errField(t testing.TB, r resp) string {
	t.Helper()
	if strings.Contains(r.header.Get("Content-Type"), "json") {
		return decodeJS[operatorapi.Error](t, r).Field
	}
	return decodeMP[messages.ValidationError](t, r).Field
}

func commandsOf(p messages.PollResponse) []string {
	out := []string{}
	for _, c := range p.Commands {
		out = append(out, c.Kind)
	}
	return out
}
