package controlplane

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nymph/identity"
	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// countingListener hands out connections that count the bytes the server
// reads off them, and reports each connection's total, by the client's
// address, once the server has closed it.
type countingListener struct {
	net.Listener
	mu     sync.Mutex
	totals map[string]chan int64
}

// total is where the count of the connection from client address addr
// arrives.
func (l *countingListener) total(addr string) chan int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	ch, ok := l.totals[addr]
	if !ok {
		ch = make(chan int64, 1)
		l.totals[addr] = ch
	}
	return ch
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, l: l}, nil
}

type countingConn struct {
	net.Conn
	l    *countingListener
	read atomic.Int64
	once sync.Once
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

func (c *countingConn) Close() error {
	c.once.Do(func() { c.l.total(c.RemoteAddr().String()) <- c.read.Load() })
	return c.Conn.Close()
}

// serveCounting serves e's control plane through Serve (the server
// `lakeshore serve` runs) on a loopback listener that counts what is read.
func (e *env) serveCounting() (string, *countingListener) {
	e.t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.t.Fatal(err)
	}
	cl := &countingListener{Listener: ln, totals: map[string]chan int64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Serve(ctx, cl) }()
	e.t.Cleanup(func() {
		cancel()
		<-done
	})
	return ln.Addr().String(), cl
}

// CloseWrite lets the server send its FIN before it closes, as it does on
// a bare TCP connection.
func (c *countingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// hugeBody is the size of the hostile bodies: more than any route reads.
const hugeBody = 100 << 20

// postHuge posts a hugeBody-byte body of zeros to path with header, over a
// connection of its own, written by hand so that the answer is read while
// the body is still being written (net/http's client can fail with the
// server's reset instead). It returns the answer's status, whether it
// said Connection: close, how many body bytes the client had written into
// its socket when the answer came (a socket takes a few MB before it
// blocks), and how many bytes the server read off that connection in all,
// known once the server closed it. With expect, the body is sent only
// if the server answers 100 Continue.
func postHuge(t *testing.T, cl *countingListener, addr, path string, expect bool, header http.Header) (status int, closed bool, taken, read int64) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	total := cl.total(conn.LocalAddr().String())
	var head strings.Builder
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", path, addr, hugeBody)
	if expect {
		head.WriteString("Expect: 100-continue\r\n")
	}
	for k, vs := range header {
		for _, v := range vs {
			fmt.Fprintf(&head, "%s: %s\r\n", k, v)
		}
	}
	head.WriteString("\r\n")
	if _, err := io.WriteString(conn, head.String()); err != nil {
		t.Fatal(err)
	}
	var sent atomic.Int64
	writing := make(chan struct{})
	send := func() {
		go func() {
			defer close(writing)
			buf := make([]byte, 64<<10)
			for left := int64(hugeBody); left > 0; {
				n, err := conn.Write(buf[:min(int64(len(buf)), left)])
				sent.Add(int64(n))
				left -= int64(n)
				if err != nil {
					return // the server closed the connection: expected
				}
			}
		}()
	}
	if !expect {
		send()
	}
	br := bufio.NewReader(conn)
	r, err := http.ReadResponse(br, nil)
	if err == nil && r.StatusCode == http.StatusContinue {
		t.Errorf("%s: the server asked for the body of a request it refuses", path)
		send()
		r, err = http.ReadResponse(br, nil)
	}
	if err != nil {
		t.Fatalf("POST %s: read the answer: %v", path, err)
	}
	taken = sent.Load()
	_, _ = io.Copy(io.Discard, r.Body)
	r.Body.Close()
	conn.Close()
	select {
	case read = <-total:
	case <-time.After(30 * time.Second):
		t.Fatalf("POST %s: the server never closed the connection", path)
	}
	if !expect || taken > 0 {
		<-writing
	}
	return r.StatusCode, r.Close, taken, read
}

// TestRefusedBeforeTheBodyIsRead posts 100 MB bodies that every route must
// refuse from the headers alone, and counts what the server read: a
// refusal reads no body and closes the connection instead of draining it.
func TestRefusedBeforeTheBodyIsRead(t *testing.T) {
	e := newEnv(t)
	addr, cl := e.serveCounting()
	worker, _ := e.hello("m", "l")
	done := e.exec(worker, operatorapi.ExecRequest{Command: "true"})
	e.poll(worker, nil, 0, "")
	if r := e.daemonAs(testDaemon, "/v1/daemon/exec/"+done.ExecID+"/result", &messages.ExecResult{}); r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	fresh := expectJS[operatorapi.TokenResponse](t, e.op(http.MethodPost, "/v1/tokens", operatorapi.TokenRequest{}), http.StatusCreated, "mint")

	unknownKey := newKey(t)
	signedHeaders := func() http.Header {
		req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/daemon/ack", nil)
		if err := unknownKey.SignRequest(req, []byte("whatever"), e.clock.Now()); err != nil {
			t.Fatal(err)
		}
		return req.Header
	}
	hdr := func(kv ...string) http.Header {
		h := http.Header{"Content-Type": {messages.ContentType}}
		for i := 0; i < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	withSig := signedHeaders()
	withSig.Set("Content-Type", messages.ContentType)
	cases := []struct {
		name   string
		path   string
		header http.Header
		status int
	}{
		{"ack, a lone X-LS-Nonce", "/v1/daemon/ack", hdr(identity.HeaderNonce, "x"), http.StatusUnauthorized},
		{"ack, signed by an unknown key", "/v1/daemon/ack", withSig, http.StatusUnauthorized},
		{"ack, an unknown bearer", "/v1/daemon/ack", hdr("Authorization", "Bearer dlt_nope"), http.StatusUnauthorized},
		{"event, a token no hello bound", "/v1/daemon/event", hdr("Authorization", "Bearer "+fresh.Token), http.StatusForbidden},
		{"poll, no credential", "/v1/daemon/poll", hdr(), http.StatusUnauthorized},
		{"exec result, no credential", "/v1/daemon/exec/" + strings.Repeat("0", 32) + "/result", hdr(), http.StatusUnauthorized},
		{"exec result, unknown exec", "/v1/daemon/exec/" + strings.Repeat("0", 32) + "/result", hdr("Authorization", "Bearer "+testDaemon), http.StatusNotFound},
		{"exec result, finished exec", "/v1/daemon/exec/" + done.ExecID + "/result", hdr("Authorization", "Bearer "+testDaemon), http.StatusConflict},
		{"exec chunk, finished exec", "/v1/daemon/exec/" + done.ExecID + "/chunk", hdr("Authorization", "Bearer "+testDaemon), http.StatusConflict},
		{"hello, an unknown bearer", "/v1/daemon/hello", hdr("Authorization", "Bearer nope"), http.StatusUnauthorized},
		{"hello, an unknown enrollment token", "/v1/daemon/hello", hdr("Authorization", "Bearer dle_nope"), http.StatusOK},
		{"hello, signed by an unknown key", "/v1/daemon/hello", withSig, http.StatusOK},
		{"keys, unsigned", "/v1/daemon/keys", hdr("Authorization", "Bearer "+testDaemon), http.StatusUnauthorized},
		{"keys, signed by an unknown key", "/v1/daemon/keys", withSig, http.StatusUnauthorized},
		{"presign, a lone X-LS-Key-Id", "/v1/namespaces/default/payloads/presign", hdr(identity.HeaderKeyID, "k_x"), http.StatusUnauthorized},
	}
	// In parallel, since a server that closes a connection with a body
	// left unread waits a moment first (net/http's guard against a reset).
	t.Run("refusals", func(t *testing.T) {
		for _, tc := range cases {
			for _, expect := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s, expect %v", tc.name, expect), func(t *testing.T) {
					t.Parallel()
					status, closed, taken, read := postHuge(t, cl, addr, tc.path, expect, tc.header)
					t.Logf("%s (Expect: 100-continue %v): %d; the client had written %d body bytes into its socket, the server read %d bytes in all",
						tc.name, expect, status, taken, read)
					if status != tc.status {
						t.Fatalf("%s: %d, want %d", tc.name, status, tc.status)
					}
					if !closed {
						t.Fatalf("%s: answered without Connection: close", tc.name)
					}
					// Headers and the first buffer of the connection, no more.
					if read > 64<<10 {
						t.Fatalf("%s: the server read %d bytes of a refused request", tc.name, read)
					}
					if expect && taken != 0 {
						t.Fatalf("%s: with Expect: 100-continue the client was asked for %d body bytes", tc.name, taken)
					}
				})
			}
		}
	})
	// A hello refused unread wrote nothing: the one worker is as it was.
	if ws := expectJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil), http.StatusOK, "list"); len(ws.Workers) != 1 {
		t.Fatalf("workers after refused hellos: %+v", ws.Workers)
	}
	// The same server still serves a daemon that is allowed.
	e.poll(worker, nil, 0, "")
}

// tokenDaemon is a daemon that says hello with a token of its own.
type tokenDaemon struct {
	e       *env
	token   string
	machine string
	label   string
	id      string
	cursor  string
}

func (e *env) mintToken(req operatorapi.TokenRequest) operatorapi.TokenResponse {
	e.t.Helper()
	return expectJS[operatorapi.TokenResponse](e.t, e.op(http.MethodPost, "/v1/tokens", req), http.StatusCreated, "mint token")
}

// helloWith says hello as machine/label with token, as process inc, and
// returns the answer.
func (e *env) helloWith(token, machine, label, inc string) messages.HelloResponse {
	e.t.Helper()
	h := helloReq(machine, label)
	h.Capabilities.Runners = []string{"echo", "process"}
	h.Incarnation = inc
	r := e.daemonAs(token, "/v1/daemon/hello", h)
	if r.status != http.StatusOK {
		e.t.Fatalf("hello of %s/%s: %d %q", machine, label, r.status, r.body)
	}
	return decodeMP[messages.HelloResponse](e.t, r)
}

func (e *env) tokenDaemonUp(machine string, fleet bool) *tokenDaemon {
	e.t.Helper()
	tok := e.mintToken(operatorapi.TokenRequest{Label: machine, Fleet: fleet})
	return e.tokenDaemonWith(tok.Token, machine)
}

func (e *env) tokenDaemonWith(token, machine string) *tokenDaemon {
	e.t.Helper()
	hr := e.helloWith(token, machine, machine, "inc-"+machine)
	if hr.Reject != nil || hr.WorkerID == nil {
		e.t.Fatalf("hello of %s: %+v", machine, hr.Reject)
	}
	return &tokenDaemon{e: e, token: token, machine: machine, label: machine, id: *hr.WorkerID, cursor: *hr.Cursor}
}

func (d *tokenDaemon) post(path string, body any) resp {
	d.e.t.Helper()
	return d.e.daemonAs(d.token, path, body)
}

func (d *tokenDaemon) pollAs(worker string) resp {
	d.e.t.Helper()
	return d.post("/v1/daemon/poll", &messages.PollRequest{WorkerID: worker, Queue: "q-" + d.machine, Cursor: &d.cursor, Invocations: []messages.InvocationStatus{}})
}

func (d *tokenDaemon) poll() messages.PollResponse {
	d.e.t.Helper()
	r := d.pollAs(d.id)
	if r.status != http.StatusOK {
		d.e.t.Fatalf("poll of %s: %d %q", d.machine, r.status, r.body)
	}
	p := decodeMP[messages.PollResponse](d.e.t, r)
	if p.Cursor != nil {
		d.cursor = *p.Cursor
	}
	return p
}

func (d *tokenDaemon) result(execID string, res *messages.ExecResult) resp {
	d.e.t.Helper()
	return d.e.do(http.MethodPost, "/v1/daemon/exec/"+execID+"/result", messages.ContentType, d.token, mustMarshal(d.e.t, res))
}

func (d *tokenDaemon) chunk(execID, data string) resp {
	d.e.t.Helper()
	return d.e.do(http.MethodPost, "/v1/daemon/exec/"+execID+"/chunk", "application/octet-stream", d.token, []byte(data))
}

func wantStatus(t *testing.T, r resp, status int, what string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("%s: %d %q, want %d", what, r.status, r.body, status)
	}
}

// TestForgedExecResultsAreRefused: a result or a chunk is taken only from
// the worker the exec was delivered to, only while it runs, and a refused
// one changes nothing.
func TestForgedExecResultsAreRefused(t *testing.T) {
	e := newEnv(t)
	a, b := e.tokenDaemonUp("a", false), e.tokenDaemonUp("b", false)
	queued := e.exec(a.id, operatorapi.ExecRequest{Command: "never delivered"})
	unchangedExec := func(id, state string, outLen int) {
		t.Helper()
		x := e.getExec(id, "")
		if x.State != state || x.Result != nil || len(x.Output) != outLen {
			t.Fatalf("exec %s after refused posts: %+v", id, x)
		}
	}
	forged := &messages.ExecResult{ExitCode: 0, Stdout: "forged"}
	// Not delivered yet: 409, whoever asks.
	wantStatus(t, a.result(queued.ExecID, forged), http.StatusConflict, "result of an exec not delivered")
	wantStatus(t, a.chunk(queued.ExecID, "early"), http.StatusConflict, "chunk of an exec not delivered")
	unchangedExec(queued.ExecID, operatorapi.ExecQueued, 0)

	if p := a.poll(); len(p.Commands) != 1 {
		t.Fatalf("a's poll: %v", commandsOf(p))
	}
	running := queued
	cases := []struct {
		what   string
		token  string
		status int
	}{
		{"no credential", "", http.StatusUnauthorized},
		{"a wrong bearer", "dlt_nope", http.StatusUnauthorized},
		{"another worker's bearer", b.token, http.StatusNotFound},
	}
	for _, tc := range cases {
		r := e.do(http.MethodPost, "/v1/daemon/exec/"+running.ExecID+"/result", messages.ContentType, tc.token, mustMarshal(t, forged))
		wantStatus(t, r, tc.status, "forged result, "+tc.what)
		r = e.do(http.MethodPost, "/v1/daemon/exec/"+running.ExecID+"/chunk", "application/octet-stream", tc.token, []byte("forged"))
		wantStatus(t, r, tc.status, "forged chunk, "+tc.what)
	}
	unchangedExec(running.ExecID, operatorapi.ExecRunning, 0)

	// The real worker: output while it runs, then its result, once.
	wantStatus(t, a.chunk(running.ExecID, "real "), http.StatusOK, "real chunk")
	if r := a.result(running.ExecID, &messages.ExecResult{ExitCode: 3, Stdout: "real"}); r.status != http.StatusOK {
		t.Fatalf("real result: %d %q", r.status, r.body)
	}
	wantStatus(t, a.result(running.ExecID, forged), http.StatusConflict, "a second result")
	wantStatus(t, b.result(running.ExecID, forged), http.StatusNotFound, "b's result for a's finished exec")
	late := a.chunk(running.ExecID, "late")
	wantStatus(t, late, http.StatusConflict, "late chunk")
	if errField(t, late) != "exec_id" {
		t.Fatalf("late chunk names %q", errField(t, late))
	}
	x := e.getExec(running.ExecID, "")
	if x.State != operatorapi.ExecFinished || x.Result == nil || x.Result.ExitCode != 3 || x.Result.Stdout != "real" || string(x.Output) != "real " {
		t.Fatalf("after the real result: %+v %+v %q", x, x.Result, x.Output)
	}
}

// TestTokensBelongToWorkers: a daemon token is its first hello's worker's.
// Token B can neither claim A's machine in a hello, nor poll as A, nor
// settle A's invocation, nor post A's events; A is unaffected throughout.
func TestTokensBelongToWorkers(t *testing.T) {
	e := newEnv(t)
	a, b := e.tokenDaemonUp("a", false), e.tokenDaemonUp("b", false)
	aBefore := e.worker(a.id)

	// B names A's machine and label: refused, and A's row is not touched
	// (its incarnation would otherwise say A restarted).
	if hr := e.helloWith(b.token, "a", "a", "evil"); hr.Reject == nil || hr.Reject.Code != messages.RejectWorkerBound ||
		!strings.Contains(hr.Reject.Message, "lakeshore token revoke") || hr.WorkerID != nil {
		t.Fatalf("b's hello as a: %+v", hr)
	}
	// A's token from B's machine, or from a new one: bound elsewhere.
	if hr := e.helloWith(a.token, "b", "b", "evil"); hr.Reject == nil || hr.Reject.Code != messages.RejectWorkerBound {
		t.Fatalf("a's token from b's machine: %+v", hr)
	}
	if hr := e.helloWith(a.token, "c", "c", "evil"); hr.Reject == nil || hr.Reject.Code != messages.RejectTokenBound ||
		!strings.Contains(hr.Reject.Message, "--fleet") {
		t.Fatalf("a's token from a new machine: %+v", hr)
	}
	// So is the shared bootstrap token, fleet by nature, for a worker a token owns.
	if hr := e.helloWith(testDaemon, "a", "a", "evil"); hr.Reject == nil || hr.Reject.Code != messages.RejectWorkerBound {
		t.Fatalf("the bootstrap token as a: %+v", hr)
	}
	if got := e.worker(a.id); got.LastSeenAt != aBefore.LastSeenAt || len(e.workers()) != 2 {
		t.Fatalf("a refused hello wrote: %+v", got)
	}

	// B polls as A: 403, and A's exec stays A's.
	ex := e.exec(a.id, operatorapi.ExecRequest{Command: "echo secret", Env: map[string]string{"SECRET": "s3"}})
	if r := b.pollAs(a.id); r.status != http.StatusForbidden || errField(t, r) != "worker_id" {
		t.Fatalf("b polling as a: %d %q", r.status, r.body)
	}
	if x := e.getExec(ex.ExecID, ""); x.State != operatorapi.ExecQueued {
		t.Fatalf("a's exec after b's poll: %+v", x)
	}
	if p := a.poll(); len(p.Commands) != 1 {
		t.Fatalf("a's poll: %v", commandsOf(p))
	}

	// B acks A's running invocation, with and without worker_id: 404, and
	// it stays running until A acks it.
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q-a", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	if p := a.poll(); len(runsOf(t, p)) != 1 {
		t.Fatalf("a did not get its run: %v", commandsOf(p))
	}
	forged := &messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded, ResultBlob: messages.Bytes("forged")}
	wantStatus(t, b.post("/v1/daemon/ack", forged), http.StatusNotFound, "b's ack of a's invocation")
	forged.WorkerID = a.id
	wantStatus(t, b.post("/v1/daemon/ack", forged), http.StatusNotFound, "b's ack naming a")
	forged.WorkerID = b.id
	wantStatus(t, b.post("/v1/daemon/ack", forged), http.StatusNotFound, "b's ack naming itself")
	wantStatus(t, b.post("/v1/daemon/result-chunk", &messages.ResultChunk{InvocationID: sub.Invocation.ID, Data: messages.Bytes("x")}),
		http.StatusNotFound, "b's result chunk of a's invocation")
	ev := map[string]any{"invocation_id": sub.Invocation.ID, "kind": "invocation.progress", "data": map[string]any{"pct": 1}, "worker_id": a.id}
	wantStatus(t, b.post("/v1/daemon/event", ev), http.StatusNotFound, "b's event naming a")
	ev["worker_id"] = b.id
	wantStatus(t, b.post("/v1/daemon/event", ev), http.StatusForbidden, "b's event for a's invocation")
	if inv := e.invocation(sub.Invocation.ID, ""); inv.State != operatorapi.InvocationRunning {
		t.Fatalf("a's invocation after b's acks: %+v", inv)
	}
	ev["worker_id"] = a.id
	wantStatus(t, a.post("/v1/daemon/event", ev), http.StatusOK, "a's event")
	real := &messages.Ack{InvocationID: sub.Invocation.ID, State: messages.StateSucceeded, ResultBlob: messages.Bytes("real"), WorkerID: a.id}
	wantStatus(t, a.post("/v1/daemon/ack", real), http.StatusOK, "a's ack")
	if inv := e.invocation(sub.Invocation.ID, ""); inv.State != operatorapi.InvocationSucceeded {
		t.Fatalf("a's invocation after its ack: %+v", inv)
	}
	// A retried ack of its own is still the no-op it always was.
	if r := a.post("/v1/daemon/ack", real); r.status != http.StatusOK || decodeMP[map[string]any](t, r)["duplicate"] != true {
		t.Fatalf("a's repeated ack: %d %q", r.status, r.body)
	}

	// A token no hello has bound acts for no worker.
	fresh := e.mintToken(operatorapi.TokenRequest{})
	wantStatus(t, e.daemonAs(fresh.Token, "/v1/daemon/poll", &messages.PollRequest{WorkerID: a.id}), http.StatusForbidden, "an unbound token polling")

	// token list shows who is bound to what.
	list := expectJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil), http.StatusOK, "list tokens")
	bound := map[string]string{}
	for _, tok := range list.Tokens {
		bound[tok.Label] = tok.WorkerID
	}
	if bound["a"] != a.id || bound["b"] != b.id || bound[""] != "" {
		t.Fatalf("bindings listed: %v", bound)
	}
}

func (e *env) workers() []operatorapi.Worker {
	e.t.Helper()
	return expectJS[operatorapi.WorkerList](e.t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil), http.StatusOK, "list workers").Workers
}

// TestFleetTokenIsShared: daemons sharing a fleet token each say hello and
// work; that is what a fleet token is for, and its holders can act for
// each other.
func TestFleetTokenIsShared(t *testing.T) {
	e := newEnv(t)
	tok := e.mintToken(operatorapi.TokenRequest{Label: "image", Fleet: true})
	if !tok.Fleet {
		t.Fatalf("minted %+v", tok)
	}
	a, b := e.tokenDaemonWith(tok.Token, "a"), e.tokenDaemonWith(tok.Token, "b")
	if a.id == b.id {
		t.Fatal("two machines, one worker")
	}
	for _, d := range []*tokenDaemon{a, b} {
		ex := e.exec(d.id, operatorapi.ExecRequest{Command: "echo " + d.machine})
		if p := d.poll(); len(p.Commands) != 1 {
			t.Fatalf("%s's poll: %v", d.machine, commandsOf(p))
		}
		wantStatus(t, d.result(ex.ExecID, &messages.ExecResult{Stdout: d.machine}), http.StatusOK, d.machine+"'s result")
	}
	// Fleet by nature: b may poll as a.
	wantStatus(t, b.pollAs(a.id), http.StatusOK, "b polling as a with the fleet token")
	list := expectJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil), http.StatusOK, "list tokens")
	if len(list.Tokens) != 1 || !list.Tokens[0].Fleet || list.Tokens[0].WorkerID != "" {
		t.Fatalf("fleet token listed as %+v", list.Tokens)
	}
	if r := e.op(http.MethodPost, "/v1/tokens", operatorapi.TokenRequest{Kind: operatorapi.TokenEnroll, Fleet: true}); r.status != http.StatusBadRequest ||
		errField(t, r) != "fleet" {
		t.Fatalf("a fleet enrollment token: %d %q", r.status, r.body)
	}
}

// TestRevokedTokensWorkerIsTakenOver: once a worker's token is revoked, a
// fresh token may take the worker over, and the old one is refused.
func TestRevokedTokensWorkerIsTakenOver(t *testing.T) {
	e := newEnv(t)
	a := e.tokenDaemonUp("a", false)
	list := expectJS[operatorapi.TokenList](t, e.op(http.MethodGet, "/v1/tokens", nil), http.StatusOK, "list tokens")
	wantStatus(t, e.op(http.MethodDelete, "/v1/tokens/"+list.Tokens[0].ID, nil), http.StatusOK, "revoke")
	wantStatus(t, a.pollAs(a.id), http.StatusUnauthorized, "poll with the revoked token")
	next := e.mintToken(operatorapi.TokenRequest{Label: "a2"})
	hr := e.helloWith(next.Token, "a", "a", "inc-2")
	if hr.Reject != nil || hr.WorkerID == nil || *hr.WorkerID != a.id {
		t.Fatalf("the new token's hello: %+v %+v", hr, hr.Reject)
	}
	a.token = next.Token
	a.poll()
}

// TestSignedCallbacksComeFromTheExecsWorker: with identity on, a callback
// is the exec's worker's when its worker's key signs it; another enrolled
// worker's signature, or a bearer for an enrolled worker, is refused.
func TestSignedCallbacksComeFromTheExecsWorker(t *testing.T) {
	e := newTLSEnv(t)
	a, b := e.newHost("a", "a"), e.newHost("b", "b")
	a.enroll()
	b.enroll()
	acc := expectJS[operatorapi.ExecAccepted](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+a.worker+"/exec",
		operatorapi.ExecRequest{Command: "true", Stream: true}), http.StatusAccepted, "exec")
	if p := a.mustPoll(); len(p.Commands) != 1 {
		t.Fatalf("a's poll: %v", commandsOf(p))
	}
	path := "/v1/daemon/exec/" + acc.ExecID + "/result"
	body := mustMP(t, &messages.ExecResult{ExitCode: 0, Stdout: "x"})
	if r := e.send(e.signed(b.key, path, "", body)); r.status != http.StatusNotFound {
		t.Fatalf("b's signed result for a's exec: %d %q", r.status, r.body)
	}
	want401(t, e.send(e.post(path, testDaemon, body)), "an unsigned result for an enrolled worker's exec")
	// A signature that does not cover the body sent is refused once read.
	tampered := e.signed(a.key, path, "", body)
	other := mustMP(t, &messages.ExecResult{ExitCode: 9})
	tampered.Body, tampered.ContentLength = io.NopCloser(strings.NewReader(string(other))), int64(len(other))
	want401(t, e.send(tampered), "a result whose body is not the signed one")
	chunk := e.signed(a.key, "/v1/daemon/exec/"+acc.ExecID+"/chunk", "", []byte("out"))
	chunk.Header.Set("Content-Type", "application/octet-stream")
	if r := e.send(chunk); r.status != http.StatusOK {
		t.Fatalf("a's signed chunk: %d %q", r.status, r.body)
	}
	if r := e.send(e.signed(a.key, path, "", body)); r.status != http.StatusOK {
		t.Fatalf("a's signed result: %d %q", r.status, r.body)
	}
	x := expectJS[operatorapi.Exec](t, e.op(http.MethodGet, "/v1/namespaces/default/execs/"+acc.ExecID, nil), http.StatusOK, "get exec")
	if x.State != operatorapi.ExecFinished || x.Result == nil || x.Result.Stdout != "x" || string(x.Output) != "out" {
		t.Fatalf("exec after a's result: %+v", x)
	}
}
