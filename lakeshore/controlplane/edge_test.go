package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/fakeclock"
	"nymph/test/wait"
)

// answerWithin bounds how long a test waits for the server to answer or
// close a connection: the deadlines under test are a fraction of it, so
// reaching it means a deadline did not fire.
const answerWithin = 30 * time.Second

// newServedEnv is an env served by Serve on loopback, as `lakeshore
// serve` serves it (its deadlines and listener included), with the server
// log kept for inspection.
func newServedEnv(t *testing.T, opts ...envOpt) (*env, string, *lockedBuffer) {
	t.Helper()
	dir := t.TempDir()
	e := &env{t: t, dir: dir, clock: fakeclock.New(time.Now().UTC().Truncate(time.Second)), parked: make(chan string, 64)}
	logs := &lockedBuffer{}
	cfg := Config{
		DataDir:     dir,
		AdminToken:  testAdmin,
		DaemonToken: testDaemon,
		Logger:      zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), logs)).Level(zerolog.InfoLevel),
		Now:         e.clock.Now,
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := newServer(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	addr, cancel, served := serveLoopback(t, srv)
	e.srv, e.url = srv, "http://"+addr
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		http.DefaultClient.CloseIdleConnections()
		if err := srv.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return e, addr, logs
}

func withLimits(l Limits) envOpt { return func(c *Config) { c.Limits = l } }

// rawConn is a client that sends exactly what it is told, when it is told.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialFrom(t *testing.T, local, addr string) *rawConn {
	t.Helper()
	d := net.Dialer{}
	if local != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(local)}
	}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %q: %v", addr, local, err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *rawConn) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, s); err != nil {
		c.t.Fatalf("send: %v", err)
	}
}

// answer reads one response, failing the test if none comes in time.
func (c *rawConn) answer() (*http.Response, []byte) {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(answerWithin))
	r, err := http.ReadResponse(c.br, nil)
	if err != nil {
		c.t.Fatalf("no answer: %v", err)
	}
	b, err := io.ReadAll(r.Body)
	if err != nil {
		c.t.Fatalf("answer body: %v", err)
	}
	return r, b
}

// closedByServer waits for the server to end the connection (EOF or a
// reset) and reports what it sent before.
func (c *rawConn) closedByServer() string {
	c.t.Helper()
	_ = c.c.SetReadDeadline(time.Now().Add(answerWithin))
	b, err := io.ReadAll(c.br)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("the server kept the connection open for %v", answerWithin)
	}
	return string(b)
}

// head is a request's head announcing a body of n bytes.
func head(method, path, token, ctype string, n int) string {
	h := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: cp\r\nContent-Length: %d\r\n", method, path, n)
	if token != "" {
		h += "Authorization: Bearer " + token + "\r\n"
	}
	if ctype != "" {
		h += "Content-Type: " + ctype + "\r\n"
	}
	return h + "\r\n"
}

// presignPut returns the path of a presigned put of key.
func (e *env) presignPut(key string, size int) string {
	e.t.Helper()
	ps := expectJS[messages.PresignResponse](e.t, e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign",
		map[string]any{"op": "put", "key": key, "size": size}), http.StatusOK, "presign put")
	return strings.TrimPrefix(ps.URL, e.url)
}

// payloadStatus is the answer to a presign get of key.
func (e *env) payloadStatus(key string) int {
	e.t.Helper()
	return e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": key}).status
}

// A body that stalls is cut once its deadline passes, whatever the route:
// the answer is 408 naming the cut, the connection is closed, and nothing
// of the body is stored.
func TestStalledBodiesAreCutWith408(t *testing.T) {
	e, addr, _ := newServedEnv(t, withLimits(Limits{BodyGrace: 200 * time.Millisecond}))
	worker, _ := e.hello("m-slow", "slow")
	for _, tc := range []struct {
		name, head, part string
		gone             func() bool // nothing was stored
	}{
		{
			name: "payload put", head: head(http.MethodPut, e.presignPut("slow-blob", 1000), "", "application/octet-stream", 1000),
			part: strings.Repeat("x", 10),
			gone: func() bool { return e.payloadStatus("slow-blob") == http.StatusNotFound },
		},
		{
			name: "release publish", head: head(http.MethodPost, "/v1/releases?version=9.9.9&triple="+testTriple, testAdmin, "application/octet-stream", 1000),
			gone: func() bool {
				return len(decodeJS[operatorapi.ReleaseList](t, e.op(http.MethodGet, "/v1/releases", nil)).Releases) == 0
			},
		},
		{
			name: "operator exec", head: head(http.MethodPost, "/v1/namespaces/default/workers/"+worker+"/exec", testAdmin, "application/json", 100),
			part: `{"command": "ec`,
			gone: func() bool {
				return len(decodeJS[[]operatorapi.CommandInfo](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+worker+"/commands", nil))) == 0
			},
		},
		{
			name: "daemon poll", head: head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, 100),
			part: "\x82",
			gone: func() bool { return true },
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialFrom(t, "", addr)
			c.send(tc.head + tc.part)
			r, body := c.answer()
			if r.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "cut off") {
				t.Fatalf("answer %d %q, want 408 saying the body was cut off", r.StatusCode, body)
			}
			if rest := c.closedByServer(); rest != "" {
				t.Fatalf("after the 408 the server sent %q", rest)
			}
			if !tc.gone() {
				t.Fatal("something of the cut body was stored")
			}
		})
	}
}

// A request refused before its body is read is answered at once and its
// connection closed, however slowly the body comes: the server does not
// first drain what it will not read.
func TestRefusedBodyIsNotDrained(t *testing.T) {
	_, addr, _ := newServedEnv(t, withLimits(Limits{BodyGrace: 10 * answerWithin}))
	c := dialFrom(t, "", addr)
	c.send(head(http.MethodPost, "/v1/namespaces/default/workers/w/exec", "", "application/json", 10<<20) + "{")
	r, body := c.answer()
	if r.StatusCode != http.StatusUnauthorized {
		t.Fatalf("no admin token: %d %q", r.StatusCode, body)
	}
	if rest := c.closedByServer(); rest != "" {
		t.Fatalf("after the refusal the server sent %q", rest)
	}
}

// Headers and idle keep-alive connections have deadlines of their own.
func TestHeaderAndIdleDeadlines(t *testing.T) {
	_, addr, _ := newServedEnv(t, withLimits(Limits{HeaderTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond}))

	slow := dialFrom(t, "", addr)
	slow.send("GET /healthz HTTP/1.1\r\nHost: cp\r\n") // and never the blank line
	if got := slow.closedByServer(); got != "" {
		t.Fatalf("a client that never finished its headers got %q", got)
	}

	idle := dialFrom(t, "", addr)
	idle.send("GET /healthz HTTP/1.1\r\nHost: cp\r\n\r\n")
	if r, _ := idle.answer(); r.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", r.StatusCode)
	}
	if got := idle.closedByServer(); got != "" {
		t.Fatalf("an idle connection got %q", got)
	}
}

// Everything that waits with its body read and nothing to write outlasts
// every deadline: a daemon's poll, an operator's exec wait (after the
// first line of its answer), a read of an exec and of a run's logs. Under
// HTTP/1 and HTTP/2, whose deadlines are timers that fire whether or not
// anything is being read or written.
func TestLongPollsOutlastTheDeadlines(t *testing.T) {
	limits := Limits{BodyGrace: 50 * time.Millisecond, BodyTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond}
	const held = time.Second // each wait below lasts this long, ten times any deadline
	for _, proto := range []string{"HTTP/1.1", "HTTP/2.0"} {
		t.Run(proto, func(t *testing.T) {
			var srv *Server
			var base string
			var client *http.Client
			if proto == "HTTP/1.1" {
				e, _, _ := newServedEnv(t, withLimits(limits))
				srv, base, client = e.srv, e.url, http.DefaultClient
			} else {
				e := newTLSEnv(t, withLimits(limits))
				tr := e.client.Transport.(*http.Transport).Clone()
				tr.ForceAttemptHTTP2 = true
				t.Cleanup(tr.CloseIdleConnections)
				srv, base, client = e.srv, e.url, &http.Client{Transport: tr, Timeout: answerWithin}
			}
			srv.pollCap, srv.waitCap = held, held
			call := func(method, path, token string, body any) (*http.Response, []byte) {
				t.Helper()
				var rd io.Reader
				ctype := "application/json"
				switch b := body.(type) {
				case nil:
				case *messages.PollRequest, *messages.HelloRequest:
					mp, err := messages.Marshal(b)
					if err != nil {
						t.Fatal(err)
					}
					rd, ctype = bytes.NewReader(mp), messages.ContentType
				default:
					rd = bytes.NewReader(mustJSON(t, b))
				}
				req, _ := http.NewRequest(method, base+path, rd)
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", ctype)
				r, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				defer r.Body.Close()
				out, err := io.ReadAll(r.Body)
				if err != nil {
					t.Fatalf("%s %s: reading the answer: %v", method, path, err)
				}
				if r.Proto != proto {
					t.Fatalf("%s %s went over %s", method, path, r.Proto)
				}
				return r, out
			}
			r, b := call(http.MethodPost, "/v1/daemon/hello", testDaemon, helloReq("m-long", "long"))
			if r.StatusCode != http.StatusOK {
				t.Fatalf("hello: %d %q", r.StatusCode, b)
			}
			var hr messages.HelloResponse
			if err := messages.Unmarshal(b, &hr); err != nil || hr.WorkerID == nil {
				t.Fatalf("hello: %v %+v", err, hr)
			}
			worker := *hr.WorkerID

			if r, b := call(http.MethodPost, "/v1/daemon/poll", testDaemon, &messages.PollRequest{WorkerID: worker, TimeoutS: 20}); r.StatusCode != http.StatusOK {
				t.Fatalf("a poll held %v: %d %q", held, r.StatusCode, b)
			}
			r, b = call(http.MethodPost, "/v1/namespaces/default/workers/"+worker+"/exec?wait=20", testAdmin, operatorapi.ExecRequest{Command: "true"})
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			if r.StatusCode != http.StatusAccepted || len(lines) != 2 {
				t.Fatalf("an exec waited on for %v: %d %q, want the accepted line and the exec's", held, r.StatusCode, b)
			}
			var acc operatorapi.ExecAccepted
			if err := json.Unmarshal([]byte(lines[0]), &acc); err != nil {
				t.Fatal(err)
			}
			if r, b := call(http.MethodGet, "/v1/namespaces/default/execs/"+acc.ExecID+"?wait=20", testAdmin, nil); r.StatusCode != http.StatusOK {
				t.Fatalf("an exec read held %v: %d %q", held, r.StatusCode, b)
			}
			r, b = call(http.MethodPost, "/v1/namespaces/default/invocations", testAdmin, operatorapi.InvocationRequest{Function: "m:f"})
			if r.StatusCode != http.StatusCreated {
				t.Fatalf("submit: %d %q", r.StatusCode, b)
			}
			var sub operatorapi.InvocationSubmitted
			if err := json.Unmarshal(b, &sub); err != nil {
				t.Fatal(err)
			}
			if r, b := call(http.MethodGet, "/v1/namespaces/default/invocations/"+sub.Invocation.ID+"/logs?wait=20", testAdmin, nil); r.StatusCode != http.StatusOK {
				t.Fatalf("a followed log held %v: %d %q", held, r.StatusCode, b)
			}
		})
	}
}

// The upload routes get UploadTimeout: an upload that started with an
// ordinary request is still going when that request's budget cuts it, and
// completes afterwards, stored whole.
func TestUploadsGetTheLongerBudget(t *testing.T) {
	e, addr, _ := newServedEnv(t, withLimits(Limits{
		BodyGrace: 50 * time.Millisecond, BodyMinRate: 1, BodyTimeout: 300 * time.Millisecond, UploadTimeout: time.Minute,
	}))
	worker, _ := e.hello("m-up", "up")
	blob := bytes.Repeat([]byte("payload!"), 256)
	bin := bytes.Repeat([]byte("binary!!"), 256)

	ordinary := dialFrom(t, "", addr)
	ordinary.send(head(http.MethodPost, "/v1/namespaces/default/workers/"+worker+"/exec", testAdmin, "application/json", 200) + `{"command": "`)
	put := dialFrom(t, "", addr)
	put.send(head(http.MethodPut, e.presignPut("big-blob", len(blob)), "", "application/octet-stream", len(blob)) + string(blob[:1000]))
	pub := dialFrom(t, "", addr)
	pub.send(head(http.MethodPost, "/v1/releases?version=1.2.3&triple="+testTriple, testAdmin, "application/octet-stream", len(bin)) + string(bin[:1000]))

	r, body := ordinary.answer()
	if r.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(body), "not complete after 300ms") {
		t.Fatalf("the ordinary request: %d %q, want 408 for its 300ms budget", r.StatusCode, body)
	}
	// Both uploads have been going longer than that budget by now.
	put.send(string(blob[1000:]))
	if r, body := put.answer(); r.StatusCode != http.StatusOK {
		t.Fatalf("payload put after the ordinary budget: %d %q", r.StatusCode, body)
	}
	pub.send(string(bin[1000:]))
	if r, body := pub.answer(); r.StatusCode != http.StatusCreated {
		t.Fatalf("release publish after the ordinary budget: %d %q", r.StatusCode, body)
	}
	if got := e.payloadStatus("big-blob"); got != http.StatusOK {
		t.Fatalf("the uploaded payload: presign get %d", got)
	}
	if rels := decodeJS[operatorapi.ReleaseList](t, e.op(http.MethodGet, "/v1/releases", nil)).Releases; len(rels) != 1 || rels[0].SHA256 != sha(bin) {
		t.Fatalf("releases %+v", rels)
	}
}

// A body's deadline is the grace plus a second per BodyMinRate bytes,
// within its budget, from the first read.
func TestBodyDeadlineArithmetic(t *testing.T) {
	lim := Limits{BodyGrace: 10 * time.Second, BodyMinRate: 1024}
	start := time.Unix(1_700_000_000, 0)
	for _, tc := range []struct {
		n    int64
		want time.Duration
	}{
		{0, 10 * time.Second},
		{1, 10*time.Second + time.Second/1024},
		{1024, 11 * time.Second},
		{1024 * 60, 70 * time.Second},
		{1 << 40, 5 * time.Minute},
		{1 << 62, 5 * time.Minute},
	} {
		b := &rateBody{lim: &lim, budget: 5 * time.Minute, start: start, n: tc.n}
		if got := b.deadline().Sub(start); got != tc.want {
			t.Errorf("after %d bytes: deadline +%v, want +%v", tc.n, got, tc.want)
		}
	}
}

// get sends one GET on c and reads the answer.
func (c *rawConn) get(path string) (int, string) {
	c.t.Helper()
	c.send("GET " + path + " HTTP/1.1\r\nHost: cp\r\n\r\n")
	r, b := c.answer()
	return r.StatusCode, string(b)
}

// Over the cap, a connection from an address is closed before anything is
// read from it; other addresses are not affected, and a closed connection
// gives its slot back.
func TestConnectionsPerAddressAreCapped(t *testing.T) {
	_, addr, logs := newServedEnv(t, func(c *Config) { c.MaxConnsPerIP = 2 })
	// 127.0.0.3: no other client of this test process uses it.
	held := []*rawConn{dialFrom(t, "127.0.0.3", addr), dialFrom(t, "127.0.0.3", addr)}
	for i, c := range held {
		if code, _ := c.get("/healthz"); code != http.StatusOK {
			t.Fatalf("connection %d: %d", i, code)
		}
	}
	over := dialFrom(t, "127.0.0.3", addr)
	_, _ = io.WriteString(over.c, "GET /healthz HTTP/1.1\r\nHost: cp\r\n\r\n")
	if got := over.closedByServer(); got != "" {
		t.Fatalf("the connection over the cap got %q", got)
	}
	if code, _ := dialFrom(t, "127.0.0.2", addr).get("/healthz"); code != http.StatusOK {
		t.Fatalf("another address: %d", code)
	}
	wait.For(t, answerWithin, "the refusal logged", func() bool {
		return strings.Contains(logs.String(), "connections refused") && strings.Contains(logs.String(), "127.0.0.3")
	})
	held[0].c.Close()
	wait.For(t, answerWithin, "the closed connection's slot to come back", func() bool {
		c := dialFrom(t, "127.0.0.3", addr)
		defer c.c.Close()
		_ = c.c.SetDeadline(time.Now().Add(answerWithin))
		if _, err := io.WriteString(c.c, "GET /healthz HTTP/1.1\r\nHost: cp\r\n\r\n"); err != nil {
			return false
		}
		r, err := http.ReadResponse(c.br, nil)
		return err == nil && r.StatusCode == http.StatusOK
	})
}

// The cap sits below TLS: a connection over it is closed before its
// handshake.
func TestConnectionCapUnderTLS(t *testing.T) {
	e := newTLSEnv(t, func(c *Config) { c.MaxConnsPerIP = 1 })
	tr := e.client.Transport.(*http.Transport)
	host := strings.TrimPrefix(e.url, "https://")
	first, err := tls.Dial("tcp", host, tr.TLSClientConfig)
	if err != nil {
		t.Fatalf("first connection: %v", err)
	}
	defer first.Close()
	if _, err := io.WriteString(first, "GET /healthz HTTP/1.1\r\nHost: cp\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if r, err := http.ReadResponse(bufio.NewReader(first), nil); err != nil || r.StatusCode != http.StatusOK {
		t.Fatalf("first connection: %v %v", r, err)
	}
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: answerWithin}, Config: tr.TLSClientConfig}
	second, err := d.Dial("tcp", host)
	if err == nil {
		second.Close()
		t.Fatal("a second connection from the address completed its handshake")
	}
}

// /healthz answers while the process runs; /readyz while the store
// answers with every migration applied, and not once shutdown begins.
func TestHealthAndReadiness(t *testing.T) {
	e := newEnv(t)
	for _, path := range []string{"/healthz", "/readyz"} {
		if r := e.do(http.MethodGet, path, "", "", nil); r.status != http.StatusOK || string(r.body) != "ok\n" {
			t.Fatalf("%s: %d %q", path, r.status, r.body)
		}
	}
	db := openRaw(t, e.dir)
	var v int
	if err := db.QueryRow(`DELETE FROM schema_migrations WHERE version = (SELECT MAX(version) FROM schema_migrations) RETURNING version`).Scan(&v); err != nil {
		t.Fatal(err)
	}
	r := e.do(http.MethodGet, "/readyz", "", "", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), fmt.Sprintf("%04d_", v)) {
		t.Fatalf("readyz with migration %d unrecorded: %d %q", v, r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/healthz", "", "", nil); r.status != http.StatusOK {
		t.Fatalf("healthz says nothing of the store: %d", r.status)
	}
	if _, err := db.Exec(`INSERT INTO schema_migrations (version, applied_at) VALUES (?, 0)`, v); err != nil {
		t.Fatal(err)
	}
	if r := e.do(http.MethodGet, "/readyz", "", "", nil); r.status != http.StatusOK {
		t.Fatalf("readyz with the migration back: %d %q", r.status, r.body)
	}
	e.srv.stopWaiting()
	if r := e.do(http.MethodGet, "/readyz", "", "", nil); r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "shutting down") {
		t.Fatalf("readyz while shutting down: %d %q", r.status, r.body)
	}
}

func TestNotReadyOnceTheStoreIsClosed(t *testing.T) {
	e := newEnv(t)
	if err := e.srv.st.Close(); err != nil {
		t.Fatal(err)
	}
	r := e.do(http.MethodGet, "/readyz", "", "", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(string(r.body), "not answering") {
		t.Fatalf("readyz on a closed store: %d %q", r.status, r.body)
	}
	if r := e.do(http.MethodGet, "/healthz", "", "", nil); r.status != http.StatusOK {
		t.Fatalf("healthz: %d", r.status)
	}
}

// openRaw opens the SQLite file of a data dir beside the server's store.
func openRaw(t *testing.T, dir string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(dir, "lakeshore.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
