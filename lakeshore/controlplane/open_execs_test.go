package controlplane

import (
	"net/http"
	"testing"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// A worker's view counts the shell execs queued for or running on it, in
// the list and in its own read, and the count falls when one finishes.
func TestWorkerViewCountsOpenExecs(t *testing.T) {
	e := newEnv(t)
	busy := e.daemonUp(daemonSpec{machine: "m1", label: "busy"})
	e.daemonUp(daemonSpec{machine: "m2", label: "idle"})
	var accs []operatorapi.ExecAccepted
	for range 2 {
		r := e.op(http.MethodPost, "/v1/namespaces/default/workers/"+busy.id+"/exec", operatorapi.ExecRequest{Command: "true"})
		if r.status != http.StatusAccepted {
			t.Fatalf("exec: %d %q", r.status, r.body)
		}
		accs = append(accs, decodeJS[operatorapi.ExecAccepted](t, r))
	}
	counts := func() map[string]int {
		t.Helper()
		list := decodeJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil))
		out := map[string]int{}
		for _, w := range list.Workers {
			out[w.Label] = w.OpenExecs
		}
		return out
	}
	if got := counts(); got["busy"] != 2 || got["idle"] != 0 {
		t.Fatalf("open execs %v, want busy 2, idle 0", got)
	}
	if w := decodeJS[operatorapi.Worker](t, e.op(http.MethodGet, "/v1/namespaces/default/workers/"+busy.id, nil)); w.OpenExecs != 2 {
		t.Fatalf("worker read: openExecs %d", w.OpenExecs)
	}
	// Delivered, then finished by its result: one left.
	busy.poll(0)
	if r := e.do(http.MethodPost, "/v1/daemon/exec/"+accs[0].ExecID+"/result", messages.ContentType, testDaemon,
		mustMarshal(t, &messages.ExecResult{ExitCode: 0})); r.status != http.StatusOK {
		t.Fatalf("result: %d %q", r.status, r.body)
	}
	if got := counts(); got["busy"] != 1 {
		t.Fatalf("after a result: open execs %v, want busy 1", got)
	}
}
