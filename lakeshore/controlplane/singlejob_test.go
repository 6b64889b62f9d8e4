package controlplane

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// helloSingle says hello as a single-job daemon (keep_alive_s = 0) and
// returns the worker id and the hello cursor.
func (e *env) helloSingle(machine, label string, lanes ...string) (string, string) {
	e.t.Helper()
	h := helloReq(machine, label)
	h.Lanes, h.SingleJob = lanes, true
	r := e.daemon("/v1/daemon/hello", h)
	if r.status != http.StatusOK {
		e.t.Fatalf("hello: %d %q", r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](e.t, r)
	return *hr.WorkerID, *hr.Cursor
}

func execsOf(t testing.TB, p messages.PollResponse) []string {
	t.Helper()
	out := []string{}
	for _, c := range p.Commands {
		if e, ok := messages.DecodeCommand(c).(*messages.Exec); ok {
			out = append(out, e.ExecID)
		}
	}
	return out
}

// wantConflict fails unless r is the 409 that refuses a job for a
// single-job daemon holding job.
func wantConflict(t testing.TB, r resp, what, job string) {
	t.Helper()
	if r.status != http.StatusConflict {
		t.Fatalf("%s: %d %q, want 409", what, r.status, r.body)
	}
	e := decodeJS[operatorapi.Error](t, r)
	if e.Field != "id" || !strings.Contains(e.Error, "is single-job (keep_alive_s = 0) and") || !strings.Contains(e.Error, job) ||
		!strings.Contains(e.Error, "it takes no other job") {
		t.Fatalf("%s: %+v", what, e)
	}
}

func TestSingleJobDaemonIsHandedOneJob(t *testing.T) {
	e := newEnv(t)
	// Two execs wait for a daemon that was offline; it comes back
	// single-job.
	id, _ := e.hello("m", "solo", "solo-q")
	first := e.exec(id, operatorapi.ExecRequest{Command: "echo one"})
	second := e.exec(id, operatorapi.ExecRequest{Command: "echo two"})
	e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/reset", nil)
	id, cursor := e.helloSingle("m", "solo", "solo-q")

	p := e.poll(id, &cursor, 0, "")
	if got := execsOf(t, p); len(got) != 1 || got[0] != first.ExecID {
		t.Fatalf("first poll delivered execs %v, want %s alone", got, first.ExecID)
	}
	// Neither a repeat of that poll (its answer lost) nor the next one
	// brings the second.
	if again := e.poll(id, &cursor, 0, ""); !equalStrings(execsOf(t, again), []string{first.ExecID}) {
		t.Fatalf("repeat of the lost poll %v", execsOf(t, again))
	}
	if again := e.poll(id, p.Cursor, 0, ""); len(again.Commands) != 0 {
		t.Fatalf("next poll %v", commandsOf(again))
	}
	if x := e.getExec(second.ExecID, ""); x.State != operatorapi.ExecQueued {
		t.Fatalf("second exec %s; it stays queued, never delivered", x.State)
	}

	w := e.worker(id)
	if !w.SingleJob || !w.SingleJobTaken {
		t.Fatalf("worker view %+v", w)
	}
	var raw map[string]any
	if err := json.Unmarshal(e.op(http.MethodGet, "/v1/namespaces/default/workers/"+id, nil).body, &raw); err != nil ||
		raw["singleJob"] != true || raw["singleJobTaken"] != true {
		t.Fatalf("worker JSON %v %v", raw, err)
	}

	// An exec aimed at it is refused and says why.
	wantConflict(t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/exec", operatorapi.ExecRequest{Command: "true"}),
		"direct exec", "already took its job (exec "+first.ExecID+")")
	// The queue route passes it over.
	r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "solo-q"})
	if r.status != http.StatusConflict || errField(t, r) != "queue" {
		t.Fatalf("queue exec with only a single-job member that has its job: %d %q", r.status, r.body)
	}
	// A run it could take is left for another daemon.
	sub := e.submit(operatorapi.InvocationRequest{Queue: "default", Function: "m:f"})
	if p := e.poll(id, p.Cursor, 0, ""); len(p.Commands) != 0 {
		t.Fatalf("a single-job daemon with its job was handed %v", commandsOf(p))
	}
	if inv := e.invocation(sub.Invocation.ID, ""); inv.State != operatorapi.InvocationQueued {
		t.Fatalf("invocation %s, want queued", inv.State)
	}
	pool, poolCursor := e.hello("p", "pool", "solo-q")
	if runs := runsOf(t, e.poll(pool, &poolCursor, 0, "")); len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID {
		t.Fatalf("pool daemon got %v", runs)
	}
	if acc := decodeJS[operatorapi.ExecAccepted](t, e.op(http.MethodPost, "/v1/namespaces/default/exec",
		operatorapi.ExecRequest{Command: "true", Queue: "solo-q"})); acc.WorkerID != pool {
		t.Fatalf("queue exec went to %s, want the pool daemon %s", acc.WorkerID, pool)
	}
}

func TestSingleJobDaemonTakesOneRunThenNoExec(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.helloSingle("m", "solo")
	e.poll(id, &cursor, 0, "") // its poll queue: default
	a := e.submit(operatorapi.InvocationRequest{Queue: "default", Function: "m:f"})
	b := e.submit(operatorapi.InvocationRequest{Queue: "default", Function: "m:f"})
	p := e.poll(id, &cursor, 0, "")
	if runs := runsOf(t, p); len(runs) != 1 || runs[0].InvocationID != a.Invocation.ID {
		t.Fatalf("runs %v, want %s alone", ids(runs), a.Invocation.ID)
	}
	if inv := e.invocation(b.Invocation.ID, ""); inv.State != operatorapi.InvocationQueued {
		t.Fatalf("second invocation %s, want queued", inv.State)
	}
	wantConflict(t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/exec", operatorapi.ExecRequest{Command: "true"}),
		"exec after its run", "already took its job (run "+a.Invocation.ID+")")
}

func TestSingleJobDaemonWithItsJobQueued(t *testing.T) {
	e := newEnv(t)
	id, cursor := e.helloSingle("m", "solo", "solo-q")
	first := e.exec(id, operatorapi.ExecRequest{Command: "echo one"})
	if w := e.worker(id); !w.SingleJobTaken {
		t.Fatalf("with its job queued: %+v", w)
	}
	wantConflict(t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/exec", operatorapi.ExecRequest{Command: "true"}),
		"second exec", "already has its job queued (exec "+first.ExecID+")")
	if r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "solo-q"}); r.status != http.StatusConflict {
		t.Fatalf("queue exec: %d %q", r.status, r.body)
	}
	p := e.poll(id, &cursor, 0, "")
	if got := execsOf(t, p); !equalStrings(got, []string{first.ExecID}) {
		t.Fatalf("delivered %v", got)
	}
	// Its outcome is in and the daemon exited; the next process says
	// hello and may take a job again, without the old batch.
	if r := e.daemon("/v1/daemon/exec/"+first.ExecID+"/result", &messages.ExecResult{ExitCode: 0, Stdout: "one\n"}); r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	id, cursor = e.helloSingle("m", "solo", "solo-q")
	if w := e.worker(id); w.SingleJobTaken || !w.SingleJob {
		t.Fatalf("a new process: %+v", w)
	}
	next := e.exec(id, operatorapi.ExecRequest{Command: "echo next"})
	if got := execsOf(t, e.poll(id, &cursor, 0, "")); !equalStrings(got, []string{next.ExecID}) {
		t.Fatalf("the new process got %v, want %s alone", got, next.ExecID)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
