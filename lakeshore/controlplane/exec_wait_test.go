package controlplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// waitingSubmission is a POST exec?wait=20 in flight: the accepted line as soon
// as it is flushed, then the exec the wait ended with.
type waitingSubmission struct {
	accepted chan operatorapi.ExecAccepted
	ended    chan operatorapi.Exec
}

func (e *env) submitWaiting(worker string, req operatorapi.ExecRequest) waitingSubmission {
	e.t.Helper()
	s := waitingSubmission{accepted: make(chan operatorapi.ExecAccepted, 1), ended: make(chan operatorapi.Exec, 1)}
	body := mustJSON(e.t, req)
	hreq, err := http.NewRequestWithContext(context.Background(), http.MethodPost,
		e.url+"/v1/namespaces/default/workers/"+worker+"/exec?wait=20", bytes.NewReader(body))
	if err != nil {
		e.t.Fatal(err)
	}
	hreq.Header.Set("Authorization", "Bearer "+testAdmin)
	hreq.Header.Set("Content-Type", "application/json")
	r, err := http.DefaultClient.Do(hreq)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { r.Body.Close() })
	if r.StatusCode != http.StatusAccepted || r.Header.Get("Content-Type") != operatorapi.ContentTypeNDJSON {
		e.t.Fatalf("waitingSubmission: %d %s", r.StatusCode, r.Header.Get("Content-Type"))
	}
	dec := json.NewDecoder(bufio.NewReader(r.Body))
	go func() {
		var acc operatorapi.ExecAccepted
		if err := dec.Decode(&acc); err != nil {
			close(s.accepted)
			return
		}
		s.accepted <- acc
		var ex operatorapi.Exec
		if err := dec.Decode(&ex); err != nil {
			close(s.ended)
			return
		}
		s.ended <- ex
	}()
	return s
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("%s: the answer ended first", what)
		}
		return v
	case <-time.After(15 * time.Second):
		t.Fatalf("no %s", what)
	}
	var zero T
	return zero
}

// A waitingSubmission that waits answers with the exec's end, and its delivery to
// the daemon (no news to someone waiting for output) does not wake the
// wait, while it does wake a reader waiting for any change.
func TestSubmissionWaitEndsWithTheResult(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	sub := e.submitWaiting(id, operatorapi.ExecRequest{Command: "exit 7"})
	acc := recv(t, sub.accepted, "accepted line")
	e.waitParked(execKey(acc.ExecID))
	// A witness beside the submission's wait, on the same key.
	news, release := e.srv.wake.subscribe(execKey(acc.ExecID))
	defer release()
	reader := make(chan operatorapi.Exec, 1)
	go func() {
		r := e.op(http.MethodGet, "/v1/namespaces/default/execs/"+acc.ExecID+"?wait=20", nil)
		var ex operatorapi.Exec
		_ = json.Unmarshal(r.body, &ex)
		reader <- ex
	}()
	e.waitParked(execStateKey(acc.ExecID))

	p := e.poll(id, &cursor, 0, "")
	if len(p.Commands) != 1 {
		t.Fatalf("poll: %+v", p)
	}
	if ex := recv(t, reader, "reader woken by the delivery"); ex.State != operatorapi.ExecRunning {
		t.Fatalf("the reader saw %+v", ex)
	}
	select {
	case <-news:
		t.Fatal("the delivery woke the waits for news")
	default:
	}
	select {
	case ex := <-sub.ended:
		t.Fatalf("the wait ended on the delivery: %+v", ex)
	default:
	}
	r := e.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/result", messages.ContentType, testDaemon,
		mustMarshal(t, &messages.ExecResult{ExitCode: 7, Stdout: "out"}))
	if r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	ex := recv(t, sub.ended, "end of the wait")
	if ex.ExecID != acc.ExecID || ex.State != operatorapi.ExecFinished || ex.Result == nil || ex.Result.ExitCode != 7 || ex.Result.Stdout != "out" {
		t.Fatalf("the wait ended with %+v (result %+v)", ex, ex.Result)
	}
}

// Streamed output is news: the first chunk ends the wait with it.
func TestSubmissionWaitEndsWithFirstOutput(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.hello("m", "l")
	sub := e.submitWaiting(id, operatorapi.ExecRequest{Command: "echo hi; sleep 60", Stream: true})
	acc := recv(t, sub.accepted, "accepted line")
	e.poll(id, &cursor, 0, "")
	r := e.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/chunk", "application/octet-stream", testDaemon, []byte("hi\n"))
	if r.status != http.StatusOK {
		t.Fatalf("chunk: %d %q", r.status, r.body)
	}
	ex := recv(t, sub.ended, "end of the wait")
	if ex.State != operatorapi.ExecRunning || string(ex.Output) != "hi\n" || ex.NextOffset != 3 {
		t.Fatalf("the wait ended with %+v", ex)
	}
}

// A waiting waitingSubmission that its worker refuses (a single-job daemon that
// has its job) is answered at once and leaves no wait subscribed.
func TestRefusedWaitingSubmissionLeavesNoWait(t *testing.T) {
	e := newEnv(t)
	id, _ := e.helloSingle("m", "solo")
	first := e.exec(id, operatorapi.ExecRequest{Command: "true"})
	r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/exec?wait=20", operatorapi.ExecRequest{Command: "true"})
	wantConflict(t, r, "second job", first.ExecID)
	if n := e.srv.wake.size(); n != 0 {
		t.Fatalf("%d wake-up keys left subscribed", n)
	}
}

// A waiting submission whose result is stored by this process answers
// with the exec as that result left it: no read of the row just written.
func TestAWaitingSubmissionIsAnsweredWithoutARead(t *testing.T) {
	cs := openCounting(t)
	e := newEnv(t, func(c *Config) { c.Store = cs })
	id, cursor := e.hello("m", "l")
	sub := e.submitWaiting(id, operatorapi.ExecRequest{Command: "echo hi"})
	acc := recv(t, sub.accepted, "accepted line")
	e.waitParked(execKey(acc.ExecID))
	if p := e.poll(id, &cursor, 0, ""); len(p.Commands) != 1 {
		t.Fatalf("poll: %+v", p)
	}
	cs.take()
	r := e.do(http.MethodPost, "/v1/daemon/exec/"+acc.ExecID+"/result", messages.ContentType, testDaemon,
		mustMarshal(t, &messages.ExecResult{ExitCode: 3, Stdout: "hi\n", DurationMs: 4}))
	if r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	ex := recv(t, sub.ended, "end of the wait")
	if ex.ExecID != acc.ExecID || ex.WorkerID != id || ex.Command != "echo hi" || ex.State != operatorapi.ExecFinished ||
		ex.Result == nil || ex.Result.ExitCode != 3 || ex.Result.Stdout != "hi\n" || ex.CreatedAt.IsZero() {
		t.Fatalf("the wait ended with %+v (result %+v)", ex, ex.Result)
	}
	if calls := cs.take(); strings.Contains(calls, "Exec×") {
		t.Fatalf("the result and the answer called %q: want no read of the exec", calls)
	}
	// A reader that comes later reads the same from the store.
	if got := e.getExec(acc.ExecID, ""); got.State != ex.State || got.Result == nil || got.Result.ExitCode != 3 || !got.CreatedAt.Equal(ex.CreatedAt) {
		t.Fatalf("read back %+v, the wait said %+v", got, ex)
	}
}
