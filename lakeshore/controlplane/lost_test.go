package controlplane

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// helloAs says hello for (machine, label) as the daemon process inc, with
// the echo runner on queue, and returns a simulated daemon that goes on
// from the hello's cursor.
func (e *env) helloAs(machine, label, inc, queue string) *simDaemon {
	e.t.Helper()
	h := helloReq(machine, label)
	h.Capabilities.Runners = []string{"echo"}
	h.Incarnation = inc
	r := e.daemon("/v1/daemon/hello", h)
	if r.status != http.StatusOK {
		e.t.Fatalf("hello as %q: %d %q", inc, r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](e.t, r)
	if hr.Reject != nil || hr.WorkerID == nil || hr.Cursor == nil {
		e.t.Fatalf("hello as %q: %+v", inc, hr)
	}
	return &simDaemon{e: e, id: *hr.WorkerID, queue: queue, cursor: *hr.Cursor}
}

// await starts a reader waiting on path (an exec or an invocation with
// ?wait) and returns what it gets, once parked on key.
func await[T any](e *env, path, key string) <-chan T {
	e.t.Helper()
	got := make(chan T, 1)
	go func() {
		r := doCtx(e.t, context.Background(), http.MethodGet, e.url+path, "", testAdmin, nil)
		var v T
		if r.status == http.StatusOK {
			v = decodeJS[T](e.t, r)
		}
		got <- v
	}()
	e.waitParked(key)
	return got
}

func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the waiting reader was not woken", what)
		panic("unreachable")
	}
}

func execResult(t *testing.T, e *env, execID string, res *messages.ExecResult) map[string]any {
	t.Helper()
	r := e.do(http.MethodPost, "/v1/daemon/exec/"+execID+"/result", messages.ContentType, testDaemon, mustMarshal(t, res))
	if r.status != http.StatusOK {
		t.Fatalf("exec result: %d %q", r.status, r.body)
	}
	return decodeMP[map[string]any](t, r)
}

// lateExecResult posts a result for an exec that is already finished: a
// 409, final for the daemon, that changes nothing.
func lateExecResult(t *testing.T, e *env, execID string, res *messages.ExecResult) {
	t.Helper()
	r := e.do(http.MethodPost, "/v1/daemon/exec/"+execID+"/result", messages.ContentType, testDaemon, mustMarshal(t, res))
	if r.status != http.StatusConflict {
		t.Fatalf("late exec result: %d %q", r.status, r.body)
	}
}

// A daemon that comes back as a new process without the jobs the old one
// had received gets them resolved at its hello, and whoever waits on them
// hears at once; a re-hello of the same process resolves nothing, and a
// command the old process was sent but never acknowledged goes to the new
// one instead.
func TestHelloOfANewProcessResolvesWhatTheOldOneReceived(t *testing.T) {
	e := newEnv(t)
	d := e.helloAs("m", "phoenix", "proc-a", "q")
	d.poll(0)
	acked := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 120"})
	inv := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	if runs := d.poll(0); len(runs) != 1 || runs[0].InvocationID != inv.Invocation.ID {
		t.Fatalf("the daemon got %v", ids(runs))
	}
	// Polling on acknowledges both; the third exec is delivered in that
	// poll's answer, and the process dies before acknowledging it.
	unacked := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 121"})
	if p := d.pollRaw(d.cursor, 0); len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec {
		t.Fatalf("third poll got %v", commandsOf(p))
	}
	execWait := await[operatorapi.Exec](e, "/v1/namespaces/default/execs/"+acked.ExecID+"?wait=15", execStateKey(acked.ExecID))
	invWait := await[operatorapi.Invocation](e, "/v1/namespaces/default/invocations/"+inv.Invocation.ID+"?wait=15", invocationKey(inv.Invocation.ID))

	// The same process says hello again (after a 401, say): nothing is lost.
	e.helloAs("m", "phoenix", "proc-a", "q")
	for _, id := range []string{acked.ExecID, unacked.ExecID} {
		if x := e.getExec(id, ""); x.State != operatorapi.ExecRunning {
			t.Fatalf("exec %s after a re-hello of the same process: %+v", id, x)
		}
	}
	if got := e.invocation(inv.Invocation.ID, ""); got.State != operatorapi.InvocationRunning {
		t.Fatalf("invocation after a re-hello of the same process: %s", got.State)
	}

	// A new process. The hello itself resolves them (read straight from
	// the store, which sweeps nothing).
	nd := e.helloAs("m", "phoenix", "proc-b", "q")
	if x, err := e.srv.st.Exec(context.Background(), acked.ExecID); err != nil || x.State != operatorapi.ExecFinished {
		t.Fatalf("the acknowledged exec after the hello: %+v %v", x, err)
	}
	if i, err := e.srv.st.Invocation(context.Background(), "", inv.Invocation.ID); err != nil || i.State != operatorapi.InvocationFailed {
		t.Fatalf("the acknowledged invocation after the hello: %+v %v", i, err)
	}
	x := within(t, execWait, "the acknowledged exec")
	if x.State != operatorapi.ExecFinished || x.Result == nil || x.Result.ExitCode != messages.ExitFailed || x.Result.Error == nil ||
		!strings.Contains(*x.Result.Error, "worker phoenix ("+d.id+") restarted (new process) without finishing this exec") {
		t.Fatalf("the acknowledged exec: %+v %+v", x, x.Result)
	}
	got := within(t, invWait, "the acknowledged invocation")
	if got.State != operatorapi.InvocationFailed || got.Error == nil || got.Error.Type != operatorapi.ErrorTypeWorkerLost ||
		!strings.Contains(got.Error.Message, "restarted (new process) without finishing this invocation") {
		t.Fatalf("the acknowledged invocation: %+v %+v", got, got.Error)
	}
	if x := e.getExec(unacked.ExecID, ""); x.State != operatorapi.ExecRunning || x.Result != nil {
		t.Fatalf("the unacknowledged exec was resolved: %+v", x)
	}
	// The new process gets it again from the hello's cursor, and only it.
	p := nd.pollRaw(nd.cursor, 0)
	if len(p.Commands) != 1 {
		t.Fatalf("the new process got %v", commandsOf(p))
	}
	if ex, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Exec); !ok || ex.ExecID != unacked.ExecID {
		t.Fatalf("the new process got %+v", messages.DecodeCommand(p.Commands[0]))
	}
	nd.cursor = *p.Cursor

	// Late real outcomes change nothing: the first outcome stands.
	lateExecResult(t, e, acked.ExecID, &messages.ExecResult{ExitCode: 0, Stdout: "late"})
	if x := e.getExec(acked.ExecID, ""); x.Result == nil || x.Result.ExitCode != messages.ExitFailed || x.Result.Stdout != "" {
		t.Fatalf("after a late result: %+v", x.Result)
	}
	if r := nd.ack(&messages.Ack{InvocationID: inv.Invocation.ID, State: messages.StateSucceeded}); r.status != http.StatusOK ||
		decodeMP[map[string]any](t, r)["duplicate"] != true {
		t.Fatalf("late ack: %d %q", r.status, r.body)
	}
	if got := e.invocation(inv.Invocation.ID, ""); got.State != operatorapi.InvocationFailed || got.Error.Type != operatorapi.ErrorTypeWorkerLost {
		t.Fatalf("after a late ack: %+v", got)
	}
	// And the other way round: a real result that came first wins over a
	// restart after it.
	if ok := execResult(t, e, unacked.ExecID, &messages.ExecResult{ExitCode: 7}); ok["duplicate"] != false {
		t.Fatalf("the real result: %v", ok)
	}
	nd.poll(0) // proc-b acknowledges it
	e.helloAs("m", "phoenix", "proc-c", "q")
	if x := e.getExec(unacked.ExecID, ""); x.Result == nil || x.Result.ExitCode != 7 {
		t.Fatalf("a restart after the real result: %+v", x.Result)
	}
}

// A daemon without a cursor has each command acknowledged as it is
// delivered: those are the old process's the moment they go out.
func TestHelloOfANewProcessResolvesLegacyDeliveries(t *testing.T) {
	e := newEnv(t)
	d := e.helloAs("m", "legacy", "proc-a", "")
	x := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 120"})
	if p := e.poll(d.id, nil, 0, ""); len(p.Commands) != 1 {
		t.Fatalf("legacy poll got %v", commandsOf(p))
	}
	e.helloAs("m", "legacy", "proc-b", "")
	got := e.getExec(x.ExecID, "")
	if got.State != operatorapi.ExecFinished || got.Result == nil || got.Result.ExitCode != messages.ExitFailed ||
		!strings.Contains(*got.Result.Error, "restarted") {
		t.Fatalf("legacy delivery after a restart: %+v %+v", got, got.Result)
	}
	// A daemon that names no process (the original one) cannot be told
	// restarted: its jobs wait for their outcome or the deadline.
	e.helloAs("m", "legacy", "", "")
	y := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 120"})
	e.poll(d.id, nil, 0, "")
	e.helloAs("m", "legacy", "", "")
	e.helloAs("m", "legacy", "proc-c", "")
	if got := e.getExec(y.ExecID, ""); got.State != operatorapi.ExecRunning {
		t.Fatalf("a nameless daemon's exec was resolved: %+v %+v", got, got.Result)
	}
}

// A worker unseen for longer than the configured deadline has its running
// execs resolved: stale alone is not enough, and a reader waiting on the
// exec is woken by the ticker's sweep.
func TestStaleWorkersExecResolvesAfterTheDeadline(t *testing.T) {
	const stale, lost = 400 * time.Millisecond, 1200 * time.Millisecond
	e := newEnv(t, func(c *Config) { c.StaleAfter, c.LostAfter = stale, lost })
	d := e.helloAs("m", "quiet", "proc-a", "")
	x := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 120"})
	d.poll(0)
	waiting := await[operatorapi.Exec](e, "/v1/namespaces/default/execs/"+x.ExecID+"?wait=15", execStateKey(x.ExecID))

	e.clock.Advance(2 * stale)
	if w := e.worker(d.id); w.State != operatorapi.StateStale {
		t.Fatalf("worker %s, want stale", w.State)
	}
	e.srv.sweepLost(context.Background()) // what the ticker does, at a known time
	if got := e.getExec(x.ExecID, ""); got.State != operatorapi.ExecRunning {
		t.Fatalf("resolved while only stale: %+v %+v", got, got.Result)
	}
	// Past the deadline, the ticker's sweep resolves it and wakes the
	// reader.
	e.clock.Advance(lost - 2*stale + time.Millisecond)
	got := within(t, waiting, "the stale worker's exec")
	if got.State != operatorapi.ExecFinished || got.Result == nil || got.Result.ExitCode != messages.ExitFailed ||
		!strings.Contains(*got.Result.Error, "worker quiet ("+d.id+") went stale while running this exec: not seen for more than 1.2s") {
		t.Fatalf("the stale worker's exec: %+v %+v", got, got.Result)
	}
	lateExecResult(t, e, x.ExecID, &messages.ExecResult{ExitCode: 0})
}

// Killing a worker resolves its execs at once, queued ones included: its
// command queue is gone with it.
func TestRemovedWorkersExecsResolve(t *testing.T) {
	e := newEnv(t)
	d := e.helloAs("m", "doomed", "proc-a", "")
	running := e.exec(d.id, operatorapi.ExecRequest{Command: "sleep 120"})
	d.poll(0)
	queued := e.exec(d.id, operatorapi.ExecRequest{Command: "true"})
	waiting := await[operatorapi.Exec](e, "/v1/namespaces/default/execs/"+queued.ExecID+"?wait=15", execStateKey(queued.ExecID))
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+d.id, nil); r.status != http.StatusOK {
		t.Fatalf("kill: %d %q", r.status, r.body)
	}
	if x, err := e.srv.st.Exec(context.Background(), running.ExecID); err != nil || x.State != operatorapi.ExecFinished {
		t.Fatalf("the running exec after the kill: %+v %v", x, err)
	}
	got := within(t, waiting, "the queued exec")
	for _, x := range []operatorapi.Exec{got, e.getExec(running.ExecID, "")} {
		if x.State != operatorapi.ExecFinished || x.Result == nil || x.Result.ExitCode != messages.ExitFailed ||
			!strings.Contains(*x.Result.Error, "worker "+d.id+" was removed (killed or cleaned up) before this exec finished") {
			t.Fatalf("exec %s of a removed worker: %+v %+v", x.ExecID, x, x.Result)
		}
	}
}

func TestHelloIncarnationIsChecked(t *testing.T) {
	e := newEnv(t)
	for name, inc := range map[string]any{"not a string": 7, "too long": strings.Repeat("x", maxIncarnation+1)} {
		h := mustMarshal(t, helloReq("m", "l"))
		raw := map[string]any{}
		if err := messages.Unmarshal(h, &raw); err != nil {
			t.Fatal(err)
		}
		raw["incarnation"] = inc
		r := e.daemon("/v1/daemon/hello", raw)
		if r.status < 400 || r.status >= 500 || errField(t, r) != "incarnation" {
			t.Fatalf("%s: %d %q", name, r.status, r.body)
		}
	}
}

func TestLostAfterMayNotUndercutTheStaleWindow(t *testing.T) {
	e := newEnv(t)
	_, err := New(context.Background(), Config{AdminToken: testAdmin, Store: e.srv.st, StaleAfter: time.Minute, LostAfter: 30 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "LostAfter 30s is shorter than StaleAfter 1m0s") {
		t.Fatalf("New with LostAfter < StaleAfter: %v", err)
	}
}
