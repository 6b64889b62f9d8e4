package controlplane

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
	"nymph/test/wait"
)

// polled is one poll as a daemon's client saw it.
type polled struct {
	resp   *http.Response
	body   messages.PollResponse
	reused bool
	local  string
	err    error
}

// pollOn posts a poll through client and reports its answer and the
// connection it went over.
func pollOn(t *testing.T, client *http.Client, url string, req *messages.PollRequest) <-chan polled {
	t.Helper()
	body := mustMarshal(t, req)
	out := make(chan polled, 1)
	go func() {
		var p polled
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) {
			p.reused, p.local = i.Reused, i.Conn.LocalAddr().String()
		}}
		hr, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace),
			http.MethodPost, url+"/v1/daemon/poll", strings.NewReader(string(body)))
		if err != nil {
			p.err = err
			out <- p
			return
		}
		hr.Header.Set("Content-Type", messages.ContentType)
		hr.Header.Set("Authorization", "Bearer "+testDaemon)
		r, err := client.Do(hr)
		if err != nil {
			p.err = err
			out <- p
			return
		}
		defer r.Body.Close()
		b, err := io.ReadAll(r.Body)
		if err == nil {
			err = messages.Unmarshal(b, &p.body)
		}
		p.resp, p.err = r, err
		out <- p
	}()
	return out
}

func answered(t *testing.T, ch <-chan polled) polled {
	t.Helper()
	select {
	case p := <-ch:
		if p.err != nil {
			t.Fatalf("poll: %v", p.err)
		}
		if p.resp.StatusCode != http.StatusOK {
			t.Fatalf("poll: status %d", p.resp.StatusCode)
		}
		return p
	case <-time.After(answerWithin):
		t.Fatal("the poll was not answered")
	}
	return polled{}
}

// execOf is the exec id of a poll answer's only command.
func execOf(t *testing.T, p polled) string {
	t.Helper()
	if len(p.body.Commands) != 1 {
		t.Fatalf("commands %v", commandsOf(p.body))
	}
	ex, ok := messages.DecodeCommand(p.body.Commands[0]).(*messages.Exec)
	if !ok {
		t.Fatalf("not an exec: %#v", p.body.Commands[0])
	}
	return ex.ExecID
}

// A poll that has to wait parks its connection; the command queued
// meanwhile is answered on it, and the same keep-alive connection then
// carries the next poll, which parks and is answered in turn.
func TestParkedPollIsAnsweredOnItsKeepAliveConnection(t *testing.T) {
	logs := &lockedBuffer{}
	e := newEnv(t, func(c *Config) { c.Logger = zerolog.New(logs).Level(zerolog.DebugLevel) })
	id, cursor := e.hello("m", "l")
	tr := &http.Transport{MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	first := pollOn(t, client, e.url, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: &cursor})
	e.waitParked(workerKey(id))
	if n := e.srv.parkings.Load(); n != 1 {
		t.Fatalf("parked connections %d, want 1", n)
	}
	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	p1 := answered(t, first)
	if got := execOf(t, p1); got != acc.ExecID {
		t.Fatalf("exec %s, want %s", got, acc.ExecID)
	}
	if ct := p1.resp.Header.Get("Content-Type"); ct != messages.ContentType || p1.resp.Close {
		t.Fatalf("answer: content type %q, close %v", ct, p1.resp.Close)
	}

	second := pollOn(t, client, e.url, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: p1.body.Cursor})
	e.waitParked(workerKey(id))
	if n := e.srv.parkings.Load(); n != 2 {
		t.Fatalf("parked connections %d, want 2", n)
	}
	acc2 := e.exec(id, operatorapi.ExecRequest{Command: "false"})
	p2 := answered(t, second)
	if got := execOf(t, p2); got != acc2.ExecID {
		t.Fatalf("exec %s, want %s", got, acc2.ExecID)
	}
	if !p2.reused || p2.local != p1.local {
		t.Fatalf("second poll: reused %v, from %s (first from %s)", p2.reused, p2.local, p1.local)
	}
	// The request log has the parked polls with their status.
	wait.For(t, answerWithin, "the parked polls' request log lines", func() bool {
		return strings.Count(logs.String(), `"route":"POST /v1/daemon/poll","status":200`) >= 2
	})
}

// Over TLS the parked connection goes back as the *tls.Conn it was: the
// next poll on it is served. An HTTP/2 client's poll, which cannot be
// parked, waits in its handler as before.
func TestParkedPollOverTLS(t *testing.T) {
	e := newTLSEnv(t)
	hr := decodeMP[messages.HelloResponse](t, tlsDo(t, e.client, e.url+"/v1/daemon/hello", helloReq("m", "l")))
	id := *hr.WorkerID
	tr := &http.Transport{TLSClientConfig: e.client.Transport.(*http.Transport).TLSClientConfig.Clone(), MaxConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr}

	// pollCap is 50 ms here: both polls park and run out their time.
	p1 := answered(t, pollOn(t, client, e.url, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: hr.Cursor}))
	p2 := answered(t, pollOn(t, client, e.url, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: p1.body.Cursor}))
	if p1.resp.TLS == nil || p1.resp.ProtoMajor != 1 || !p2.reused || p2.local != p1.local {
		t.Fatalf("tls %v proto %d; second poll reused %v from %s (first from %s)", p1.resp.TLS != nil, p1.resp.ProtoMajor, p2.reused, p2.local, p1.local)
	}
	if n := e.srv.parkings.Load(); n != 2 {
		t.Fatalf("parked connections %d, want 2", n)
	}

	h2 := &http.Transport{TLSClientConfig: tr.TLSClientConfig.Clone(), ForceAttemptHTTP2: true}
	t.Cleanup(h2.CloseIdleConnections)
	p3 := answered(t, pollOn(t, &http.Client{Transport: h2}, e.url, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: p2.body.Cursor}))
	if p3.resp.ProtoMajor != 2 {
		t.Fatalf("HTTP/2 poll went over %s", p3.resp.Proto)
	}
	if n := e.srv.parkings.Load(); n != 2 {
		t.Fatalf("an HTTP/2 poll parked its connection (%d parked)", n)
	}
}

func tlsDo(t *testing.T, client *http.Client, url string, body any) resp {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(string(mustMarshal(t, body))))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", messages.ContentType)
	req.Header.Set("Authorization", "Bearer "+testDaemon)
	r, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{status: r.StatusCode, body: b, header: r.Header}
}

// onlyParked is the one poll parked in the lot.
func onlyParked(t *testing.T, lot *parkingLot) *parkedPoll {
	t.Helper()
	lot.mu.Lock()
	defer lot.mu.Unlock()
	if len(lot.polls) != 1 {
		t.Fatalf("%d polls parked, want 1", len(lot.polls))
	}
	for pp := range lot.polls {
		return pp
	}
	return nil
}

func parkedCount(lot *parkingLot) int {
	lot.mu.Lock()
	defer lot.mu.Unlock()
	return len(lot.polls)
}

// A legacy daemon (null cursor) acknowledges a command by receiving it.
// Its parked poll, whose connection closed, is woken by a command: it
// takes nothing, and the command goes to the daemon's next poll.
func TestParkedLegacyPollOfAClosedConnectionTakesNothing(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "l")
	c := dialFrom(t, "", e.hs.Listener.Addr().String())
	body := mustMarshal(t, &messages.PollRequest{WorkerID: id, TimeoutS: 20})
	c.send(head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, len(body)) + string(body))
	e.waitParked(workerKey(id))
	pp := onlyParked(t, e.lot)
	if err := c.c.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, answerWithin, "the parked connection to read as closed", func() bool { return peekSocket(pp.raw) == socketGone })

	acc := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	wait.For(t, answerWithin, "the woken poll to drop its connection", func() bool { return parkedCount(e.lot) == 0 })
	p := e.poll(id, nil, 0, "")
	if len(p.Commands) != 1 {
		t.Fatalf("the next poll got %v", commandsOf(p))
	}
	if ex := messages.DecodeCommand(p.Commands[0]).(*messages.Exec); ex.ExecID != acc.ExecID {
		t.Fatalf("exec %s, want %s", ex.ExecID, acc.ExecID)
	}
	if ex := e.getExec(acc.ExecID, ""); ex.State != operatorapi.ExecRunning {
		t.Fatalf("the exec is %s", ex.State)
	}
}

// A daemon that sends more while its poll waits (here the next request,
// pipelined) is answered at once, and the connection closes after that
// answer, before the pipelined request is read.
func TestParkedPollOfAPipeliningClientAnswersAndCloses(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	c := dialFrom(t, "", e.hs.Listener.Addr().String())
	body := mustMarshal(t, &messages.PollRequest{WorkerID: id, TimeoutS: 20, Cursor: &cursor})
	req := head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, len(body)) + string(body)
	c.send(req + req)
	r, b := c.answer()
	var p messages.PollResponse
	if err := messages.Unmarshal(b, &p); err != nil || r.StatusCode != http.StatusOK || len(p.Commands) != 0 || !r.Close {
		t.Fatalf("answer %d %v close %v: %v", r.StatusCode, commandsOf(p), r.Close, err)
	}
	if rest := c.closedByServer(); rest != "" {
		t.Fatalf("after the close the server sent %q", rest)
	}
}

// Shutting down answers a parked poll at once, with Connection: close,
// closes its connection, and Serve returns.
func TestShutdownClosesParkedConnections(t *testing.T) {
	dir := t.TempDir()
	srv, err := newServer(context.Background(), Config{DataDir: filepath.Join(dir, "data"), AdminToken: testAdmin, DaemonToken: testDaemon,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	parked := make(chan string, 8)
	srv.parked = func(k string) { parked <- k }
	addr, cancel, served := serveLoopback(t, srv)
	hr := decodeMP[messages.HelloResponse](t, doCtx(t, context.Background(), http.MethodPost, "http://"+addr+"/v1/daemon/hello",
		messages.ContentType, testDaemon, mustMarshal(t, helloReq("m", "l"))))
	c := dialFrom(t, "", addr)
	body := mustMarshal(t, &messages.PollRequest{WorkerID: *hr.WorkerID, TimeoutS: 20, Cursor: hr.Cursor})
	c.send(head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, len(body)) + string(body))
	if k := <-parked; k != workerKey(*hr.WorkerID) {
		t.Fatalf("parked on %s", k)
	}
	if n := srv.parkings.Load(); n != 1 {
		t.Fatalf("parked connections %d, want 1", n)
	}
	cancel()
	r, _ := c.answer()
	if r.StatusCode != http.StatusOK || !r.Close {
		t.Fatalf("parked poll at shutdown: %d, close %v", r.StatusCode, r.Close)
	}
	if rest := c.closedByServer(); rest != "" {
		t.Fatalf("after the close the server sent %q", rest)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(answerWithin):
		t.Fatal("Serve did not return")
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
}

// An answered connection waits for the daemon's next request as a
// kept-alive one does, up to IdleTimeout, and is closed after it.
func TestParkedConnectionIdlesOutAfterItsAnswer(t *testing.T) {
	e, addr, _ := newServedEnv(t, withLimits(Limits{IdleTimeout: 100 * time.Millisecond}))
	e.srv.pollCap = 50 * time.Millisecond
	hr := decodeMP[messages.HelloResponse](t, doCtx(t, context.Background(), http.MethodPost, e.url+"/v1/daemon/hello",
		messages.ContentType, testDaemon, mustMarshal(t, helloReq("m", "l"))))
	c := dialFrom(t, "", addr)
	body := mustMarshal(t, &messages.PollRequest{WorkerID: *hr.WorkerID, TimeoutS: 20, Cursor: hr.Cursor})
	c.send(head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, len(body)) + string(body))
	if r, _ := c.answer(); r.StatusCode != http.StatusOK || r.Close {
		t.Fatalf("answer %d, close %v", r.StatusCode, r.Close)
	}
	if n := e.srv.parkings.Load(); n != 1 {
		t.Fatalf("parked connections %d, want 1", n)
	}
	if rest := c.closedByServer(); rest != "" {
		t.Fatalf("the idle connection got %q", rest)
	}
}

// A daemon that goes away while its poll is parked is noticed at once, as
// net/http's background read noticed it, and its connection closed: not
// at a wake, nor at the end of the poll's hour.
func TestParkedConnectionClosedByTheDaemonIsNoticedAtOnce(t *testing.T) {
	logs := &lockedBuffer{}
	e, addr, _ := newServedEnv(t, func(c *Config) { c.Logger = zerolog.New(logs).Level(zerolog.DebugLevel) })
	e.srv.pollCap = time.Hour
	parked := make(chan string, 8)
	e.srv.parked = func(k string) { parked <- k }
	hr := decodeMP[messages.HelloResponse](t, doCtx(t, context.Background(), http.MethodPost, e.url+"/v1/daemon/hello",
		messages.ContentType, testDaemon, mustMarshal(t, helloReq("m", "l"))))
	c := dialFrom(t, "", addr)
	body := mustMarshal(t, &messages.PollRequest{WorkerID: *hr.WorkerID, TimeoutS: 3600, Cursor: hr.Cursor})
	c.send(head(http.MethodPost, "/v1/daemon/poll", testDaemon, messages.ContentType, len(body)) + string(body))
	select {
	case <-parked:
	case <-time.After(answerWithin):
		t.Fatal("the poll did not park")
	}
	if n := e.srv.parkings.Load(); n != 1 {
		t.Fatalf("parked connections %d, want 1", n)
	}
	if err := c.c.Close(); err != nil {
		t.Fatal(err)
	}
	wait.For(t, answerWithin, "the parked poll to notice its daemon left", func() bool {
		return strings.Contains(logs.String(), "poll abandoned by the daemon while parked")
	})
}
