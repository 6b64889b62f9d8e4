package controlplane

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/messages"
)

// daemonSpec is what a simulated daemon says about itself.
type daemonSpec struct {
	machine, label string
	queue          string // its poll queue
	runners        []string
	max            uint32
}

// simDaemon speaks msgpack to the control plane as nymph does, keeping
// its cursor.
type simDaemon struct {
	e      *env
	id     string
	queue  string
	cursor string
}

func (e *env) daemonUp(d daemonSpec) *simDaemon {
	e.t.Helper()
	h := helloReq(d.machine, d.label)
	h.Capabilities = messages.Capabilities{Runners: d.runners, MaxInvocations: d.max, Workdir: "/tmp/w"}
	r := e.daemon("/v1/daemon/hello", h)
	if r.status != http.StatusOK {
		e.t.Fatalf("hello: %d %q", r.status, r.body)
	}
	hr := decodeMP[messages.HelloResponse](e.t, r)
	sd := &simDaemon{e: e, id: *hr.WorkerID, queue: d.queue, cursor: *hr.Cursor}
	// A first poll records the poll queue, as a real daemon's would.
	sd.poll(0)
	return sd
}

// poll polls with the daemon's cursor and advances it; it returns the run
// bodies delivered.
func (d *simDaemon) poll(timeout float64, statuses ...messages.InvocationStatus) []*messages.Run {
	d.e.t.Helper()
	p := d.pollRaw(d.cursor, timeout, statuses...)
	if p.Cursor != nil {
		d.cursor = *p.Cursor
	}
	return runsOf(d.e.t, p)
}

func (d *simDaemon) pollRaw(cursor string, timeout float64, statuses ...messages.InvocationStatus) messages.PollResponse {
	d.e.t.Helper()
	if statuses == nil {
		statuses = []messages.InvocationStatus{}
	}
	r := d.e.daemon("/v1/daemon/poll", &messages.PollRequest{WorkerID: d.id, Queue: d.queue, TimeoutS: timeout, Cursor: &cursor, Invocations: statuses})
	if r.status != http.StatusOK {
		d.e.t.Fatalf("poll: %d %q", r.status, r.body)
	}
	return decodeMP[messages.PollResponse](d.e.t, r)
}

func runsOf(t testing.TB, p messages.PollResponse) []*messages.Run {
	t.Helper()
	var out []*messages.Run
	for _, c := range p.Commands {
		if c.Kind != messages.KindRun {
			continue
		}
		run, ok := messages.DecodeCommand(c).(*messages.Run)
		if !ok {
			t.Fatalf("run command %s does not decode: %+v", c.ID, messages.DecodeCommand(c))
		}
		out = append(out, run)
	}
	return out
}

func (d *simDaemon) ack(a *messages.Ack) resp {
	d.e.t.Helper()
	a.WorkerID = d.id
	return d.e.daemon("/v1/daemon/ack", a)
}

func (e *env) submit(req operatorapi.InvocationRequest) operatorapi.InvocationSubmitted {
	e.t.Helper()
	return expectJS[operatorapi.InvocationSubmitted](e.t, e.op(http.MethodPost, "/v1/namespaces/default/invocations", req), http.StatusCreated, "submit")
}

func (e *env) invocation(id, query string) operatorapi.Invocation {
	e.t.Helper()
	return expectJS[operatorapi.Invocation](e.t, e.op(http.MethodGet, "/v1/namespaces/default/invocations/"+id+query, nil), http.StatusOK, "get invocation")
}

func runner(s string) *string { return &s }

// runningInvocation submits an echo invocation and has a fresh daemon
// receive it; it returns the invocation and the daemon.
func (e *env) runningInvocation(machine string) (string, *simDaemon) {
	e.t.Helper()
	d := e.daemonUp(daemonSpec{machine: machine, label: machine, queue: "q-" + machine, runners: []string{"echo"}})
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q-" + machine, Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	runs := d.poll(0)
	if len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID {
		e.t.Fatalf("daemon got %+v, want %s", runs, sub.Invocation.ID)
	}
	return sub.Invocation.ID, d
}

func ids(runs []*messages.Run) []string {
	out := []string{}
	for _, r := range runs {
		out = append(out, r.InvocationID)
	}
	return out
}

func TestInvocationGoesOnlyToAMatchingDaemon(t *testing.T) {
	e := newEnv(t)
	gpu := e.daemonUp(daemonSpec{machine: "g", label: "gpu", queue: "gpu-*", runners: []string{"python"}, max: 1})
	cpu := e.daemonUp(daemonSpec{machine: "c", label: "cpu", queue: "cpu", runners: []string{"python", "echo"}})
	dflt := e.daemonUp(daemonSpec{machine: "d", label: "dflt", queue: "", runners: []string{"docker"}})

	first := e.submit(operatorapi.InvocationRequest{Queue: "gpu-a100", Function: "pkg.mod:Cls.run",
		RunConfig: operatorapi.RunConfig{Runner: runner("python"), TimeoutS: 30, Env: map[string]string{"A": "1"}, Workdir: "/w"},
		Args:      []byte{0x92, 1, 2}, ParentInvocationID: "p1", RootInvocationID: "r1"})
	if first.EligibleWorkers != 1 || first.Invocation.State != operatorapi.InvocationQueued {
		t.Fatalf("submitted %+v", first)
	}
	if got := cpu.poll(0); len(got) != 0 {
		t.Fatalf("cpu daemon got %v", ids(got))
	}
	if got := dflt.poll(0); len(got) != 0 {
		t.Fatalf("default daemon got %v", ids(got))
	}
	runs := gpu.poll(0)
	if len(runs) != 1 {
		t.Fatalf("gpu daemon got %v", ids(runs))
	}
	run := runs[0]
	if run.InvocationID != first.Invocation.ID || run.Function.Module != "pkg.mod" || run.Function.Qualname != "Cls.run" ||
		*run.RunConfig.Runner != "python" || run.RunConfig.TimeoutS != 30 || run.RunConfig.Env["A"] != "1" ||
		run.RunConfig.Workdir != "/w" || !bytes.Equal(run.ArgsBlob, []byte{0x92, 1, 2}) || run.PayloadRef != nil ||
		*run.ParentInvocationID != "p1" || *run.RootInvocationID != "r1" || run.Script != nil {
		t.Fatalf("run body %+v", run)
	}
	inv := e.invocation(first.Invocation.ID, "")
	if inv.State != operatorapi.InvocationRunning || inv.WorkerID != gpu.id || inv.WorkerLabel != "gpu" || inv.StartedAt == nil {
		t.Fatalf("after dispatch %+v", inv)
	}

	// The gpu daemon is full (max 1): a second gpu invocation waits.
	second := e.submit(operatorapi.InvocationRequest{Queue: "gpu-h100", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("python")}})
	if got := gpu.poll(0); len(got) != 0 {
		t.Fatalf("full daemon got %v", ids(got))
	}
	if r := gpu.ack(&messages.Ack{InvocationID: first.Invocation.ID, State: messages.StateSucceeded, ResultBlob: messages.Bytes{0xa2, 'o', 'k'}}); r.status != http.StatusOK {
		t.Fatalf("ack: %d %q", r.status, r.body)
	}
	done := e.invocation(first.Invocation.ID, "?wait=1")
	if done.State != operatorapi.InvocationSucceeded || !bytes.Equal(done.Result, []byte{0xa2, 'o', 'k'}) || done.Error != nil ||
		done.FinishedAt == nil || done.ResultSize != 3 {
		t.Fatalf("after ack %+v", done)
	}
	if got := gpu.poll(0); len(got) != 1 || got[0].InvocationID != second.Invocation.ID {
		t.Fatalf("freed daemon got %v", ids(got))
	}

	// A runner the daemon does not advertise never reaches it; no runner
	// goes to anyone in the queue.
	docker := e.submit(operatorapi.InvocationRequest{Queue: "cpu", Function: "busybox", RunConfig: operatorapi.RunConfig{Runner: runner("docker"), Image: "img"}})
	if docker.EligibleWorkers != 0 {
		t.Fatalf("eligible for docker on cpu: %d", docker.EligibleWorkers)
	}
	anyRunner := e.submit(operatorapi.InvocationRequest{Function: "m:f"})
	if anyRunner.Invocation.Queue != "default" || anyRunner.EligibleWorkers != 1 {
		t.Fatalf("default submission %+v", anyRunner)
	}
	if got := cpu.poll(0); len(got) != 0 {
		t.Fatalf("cpu daemon got %v", ids(got))
	}
	if got := dflt.poll(0); len(got) != 1 || got[0].InvocationID != anyRunner.Invocation.ID || got[0].RunConfig.Runner != nil {
		t.Fatalf("default daemon got %+v", got)
	}
	if inv := e.invocation(docker.Invocation.ID, ""); inv.State != operatorapi.InvocationQueued {
		t.Fatalf("docker invocation %s", inv.State)
	}

	list := decodeJS[operatorapi.InvocationList](t, e.op(http.MethodGet, "/v1/namespaces/default/invocations?state=running", nil))
	if got := len(list.Invocations); got != 2 {
		t.Fatalf("running list has %d: %+v", got, list)
	}
	list = decodeJS[operatorapi.InvocationList](t, e.op(http.MethodGet, "/v1/namespaces/default/invocations?queue=gpu-a100&limit=5", nil))
	if len(list.Invocations) != 1 || list.Invocations[0].ID != first.Invocation.ID || list.Invocations[0].Result != nil {
		t.Fatalf("queue list %+v", list)
	}
	all := decodeJS[operatorapi.InvocationList](t, e.op(http.MethodGet, "/v1/namespaces/default/invocations", nil))
	if len(all.Invocations) != 4 || all.Invocations[0].ID != anyRunner.Invocation.ID {
		t.Fatalf("full list (newest first) %+v", all)
	}
}

func TestSubmitWakesAParkedPoll(t *testing.T) {
	e := newEnv(t)
	d := e.daemonUp(daemonSpec{machine: "m", label: "l", queue: "q", runners: []string{"echo"}})
	got := make(chan []*messages.Run, 1)
	go func() { got <- d.poll(15) }()
	e.waitParked(workerKey(d.id))
	start := time.Now()
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	select {
	case runs := <-got:
		if len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID {
			t.Fatalf("woken poll got %v", ids(runs))
		}
		if took := time.Since(start); took > 5*time.Second {
			t.Fatalf("delivery took %v", took)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the parked poll was not woken by the submission")
	}
}

func TestConcurrentDaemonsNeverShareAnInvocation(t *testing.T) {
	e := newEnv(t)
	const daemons, invocations = 4, 40
	var ds []*simDaemon
	for i := range daemons {
		ds = append(ds, e.daemonUp(daemonSpec{machine: fmt.Sprint("m", i), label: fmt.Sprint("l", i), queue: "work*", runners: []string{"echo"}}))
	}
	want := map[string]bool{}
	for i := range invocations {
		sub := e.submit(operatorapi.InvocationRequest{Queue: fmt.Sprint("work-", i%3), Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
		want[sub.Invocation.ID] = true
	}
	var (
		mu   sync.Mutex
		seen = map[string]string{}
		dups []string
		wg   sync.WaitGroup
	)
	start := make(chan struct{})
	for _, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range 20 {
				runs := d.poll(0)
				mu.Lock()
				for _, r := range runs {
					if other, ok := seen[r.InvocationID]; ok {
						dups = append(dups, fmt.Sprintf("%s to %s and %s", r.InvocationID, other, d.id))
					}
					seen[r.InvocationID] = d.id
				}
				n := len(seen)
				mu.Unlock()
				for _, r := range runs {
					d.ack(&messages.Ack{InvocationID: r.InvocationID, State: messages.StateSucceeded, ResultBlob: messages.Bytes("x")})
				}
				if n == invocations {
					return
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(dups) > 0 {
		t.Fatalf("delivered twice: %v", dups)
	}
	if len(seen) != invocations {
		t.Fatalf("delivered %d of %d", len(seen), invocations)
	}
	for id := range want {
		if inv := e.invocation(id, ""); inv.State != operatorapi.InvocationSucceeded {
			t.Fatalf("%s is %s", id, inv.State)
		}
	}
}

func TestAbandonedPollRedeliversTheRun(t *testing.T) {
	e := newEnv(t)
	d := e.daemonUp(daemonSpec{machine: "m", label: "l", queue: "q", runners: []string{"echo"}})
	before := d.cursor
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}, Args: []byte("a")})

	// A long poll whose client goes away after the claim: the run is in the
	// worker's queue, unacknowledged.
	ctx, cancel := context.WithCancel(context.Background())
	body := mustMarshal(t, &messages.PollRequest{WorkerID: d.id, Queue: "q", TimeoutS: 10, Cursor: &before, Invocations: []messages.InvocationStatus{}})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/daemon/poll", bytes.NewReader(body))
	req.Header.Set("Content-Type", messages.ContentType)
	req.Header.Set("Authorization", "Bearer "+testDaemon)
	cancel()
	if _, err := http.DefaultClient.Do(req); err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	// Whether or not that poll got as far as claiming, the next poll from
	// the same cursor gets the run, and so does a repeat of it whose
	// answer was lost.
	first := d.pollRaw(before, 0)
	again := d.pollRaw(before, 0)
	for _, p := range []messages.PollResponse{first, again} {
		if runs := runsOf(t, p); len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID || string(runs[0].ArgsBlob) != "a" {
			t.Fatalf("poll from the old cursor got %v", ids(runs))
		}
	}
	if runs := runsOf(t, d.pollRaw(*again.Cursor, 0)); len(runs) != 0 {
		t.Fatalf("after acknowledging: %v", ids(runs))
	}
}

func TestLostWorkersFailTheirInvocations(t *testing.T) {
	e := newEnv(t)
	stale, _ := e.runningInvocation("s")
	removed, rd := e.runningInvocation("r")
	e.clock.Advance(DefaultLostAfter + time.Second)
	// The removed worker is fresh; deleting it is what loses its run.
	rd.poll(0, messages.InvocationStatus{InvocationID: removed, State: messages.StateRunning})
	if r := e.op(http.MethodDelete, "/v1/namespaces/default/workers/"+rd.id, nil); r.status != http.StatusOK {
		t.Fatalf("kill: %d %q", r.status, r.body)
	}
	inv := e.invocation(stale, "")
	if inv.State != operatorapi.InvocationFailed || inv.Error == nil || inv.Error.Type != operatorapi.ErrorTypeWorkerLost ||
		!strings.Contains(inv.Error.Message, "went stale while running this invocation") || !strings.Contains(inv.Error.Message, "worker s (") {
		t.Fatalf("stale worker's invocation %+v %+v", inv, inv.Error)
	}
	inv = e.invocation(removed, "")
	if inv.State != operatorapi.InvocationFailed || inv.Error == nil || !strings.Contains(inv.Error.Message, "was removed") {
		t.Fatalf("removed worker's invocation %+v %+v", inv, inv.Error)
	}
	// A late ack changes nothing.
	if r := e.daemon("/v1/daemon/ack", &messages.Ack{InvocationID: stale, State: messages.StateSucceeded}); r.status != http.StatusOK ||
		decodeMP[map[string]any](t, r)["duplicate"] != true {
		t.Fatalf("late ack: %d %q", r.status, r.body)
	}
	if inv := e.invocation(stale, ""); inv.State != operatorapi.InvocationFailed {
		t.Fatalf("after a late ack: %s", inv.State)
	}
}

func TestStaleSweepWakesAWaitingReader(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.StaleAfter, c.LostAfter = 400*time.Millisecond, 400*time.Millisecond })
	id, _ := e.runningInvocation("m")
	got := make(chan operatorapi.Invocation, 1)
	go func() { got <- e.invocation(id, "?wait=15") }()
	e.waitParked(invocationKey(id))
	e.clock.Advance(time.Second)
	select {
	case inv := <-got:
		if inv.State != operatorapi.InvocationFailed || inv.Error == nil || inv.Error.Type != operatorapi.ErrorTypeWorkerLost {
			t.Fatalf("woken with %+v", inv)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the ticker's sweep did not fail the invocation and wake the reader")
	}
}

func TestInvocationTheDaemonStopsReportingFails(t *testing.T) {
	e := newEnv(t)
	id, d := e.runningInvocation("m")
	status := messages.InvocationStatus{InvocationID: id, State: messages.StateRunning, StartedAt: 5, StdoutTail: "step 3 of 10\n"}
	d.poll(0, status)
	if inv := e.invocation(id, ""); inv.StdoutTail != "step 3 of 10\n" || inv.State != operatorapi.InvocationRunning {
		t.Fatalf("after a status: %+v", inv)
	}
	// The daemon restarts: it says hello again and no longer lists the run.
	e.hello("m", "m")
	d.poll(0)
	e.clock.Advance(operatorapi.StaleAfter / 2)
	d.poll(0)
	if inv := e.invocation(id, ""); inv.State != operatorapi.InvocationRunning {
		t.Fatalf("failed before the grace: %+v", inv)
	}
	e.clock.Advance(operatorapi.StaleAfter/2 + time.Second)
	d.poll(0)
	inv := e.invocation(id, "")
	if inv.State != operatorapi.InvocationFailed || inv.Error == nil || inv.Error.Type != operatorapi.ErrorTypeWorkerLost ||
		!strings.Contains(inv.Error.Message, "no longer reports this invocation") {
		t.Fatalf("after the grace: %+v %+v", inv, inv.Error)
	}
}

func TestAcks(t *testing.T) {
	e := newEnv(t)
	id, d := e.runningInvocation("m")
	if r := d.ack(&messages.Ack{InvocationID: "no-such", State: messages.StateFailed}); r.status != http.StatusNotFound || errField(t, r) != "invocation_id" {
		t.Fatalf("unknown invocation: %d %q", r.status, r.body)
	}
	tb := "Traceback: ..."
	failed := &messages.Ack{InvocationID: id, State: messages.StateFailed, ResultBlob: messages.Bytes("ignored"),
		Error: &messages.AckError{Type: "ValueError", Message: "bad input", Traceback: &tb}}
	for i := range 2 {
		r := d.ack(failed)
		if r.status != http.StatusOK || decodeMP[map[string]any](t, r)["duplicate"] != (i == 1) {
			t.Fatalf("ack %d: %d %q", i, r.status, r.body)
		}
	}
	inv := e.invocation(id, "")
	if inv.State != operatorapi.InvocationFailed || inv.Result != nil || inv.ResultSize != 0 || inv.Error == nil ||
		inv.Error.Type != "ValueError" || inv.Error.Message != "bad input" || *inv.Error.Traceback != tb {
		t.Fatalf("failed invocation %+v %+v", inv, inv.Error)
	}
	// A different outcome afterwards is a no-op too.
	if r := d.ack(&messages.Ack{InvocationID: id, State: messages.StateSucceeded}); decodeMP[map[string]any](t, r)["duplicate"] != true {
		t.Fatalf("second outcome: %q", r.body)
	}
	if inv := e.invocation(id, ""); inv.State != operatorapi.InvocationFailed {
		t.Fatalf("overwritten: %s", inv.State)
	}
}

func TestCancelInvocations(t *testing.T) {
	e := newEnv(t)
	queued := e.submit(operatorapi.InvocationRequest{Queue: "nobody", Function: "m:f"})
	r := e.op(http.MethodPost, "/v1/namespaces/default/invocations/"+queued.Invocation.ID+"/cancel", nil)
	if r.status != http.StatusOK {
		t.Fatalf("cancel queued: %d %q", r.status, r.body)
	}
	c := decodeJS[operatorapi.CancelInvocationResponse](t, r)
	if !c.Cancelled || c.Invocation.State != operatorapi.InvocationCancelled || c.Invocation.Error == nil || c.Invocation.Error.Type != "Cancelled" {
		t.Fatalf("cancelled queued %+v", c)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/invocations/"+queued.Invocation.ID+"/cancel", nil); r.status != http.StatusConflict {
		t.Fatalf("cancel twice: %d %q", r.status, r.body)
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/invocations/nope/cancel", nil); r.status != http.StatusNotFound {
		t.Fatalf("cancel unknown: %d", r.status)
	}
	// A cancelled invocation is never dispatched.
	d := e.daemonUp(daemonSpec{machine: "m", label: "l", queue: "nobody", runners: []string{"echo"}})
	if got := d.poll(0); len(got) != 0 {
		t.Fatalf("cancelled invocation dispatched: %v", ids(got))
	}

	id, rd := e.runningInvocation("r")
	r = e.op(http.MethodPost, "/v1/namespaces/default/invocations/"+id+"/cancel", nil)
	if r.status != http.StatusAccepted {
		t.Fatalf("cancel running: %d %q", r.status, r.body)
	}
	c = decodeJS[operatorapi.CancelInvocationResponse](t, r)
	if c.Cancelled || c.CommandID == "" || c.Invocation.State != operatorapi.InvocationRunning {
		t.Fatalf("cancel running %+v", c)
	}
	p := rd.pollRaw(rd.cursor, 0)
	if len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindCancel {
		t.Fatalf("daemon got %v", commandsOf(p))
	}
	cancel, ok := messages.DecodeCommand(p.Commands[0]).(*messages.Cancel)
	if !ok || cancel.InvocationID == nil || *cancel.InvocationID != id {
		t.Fatalf("cancel body %+v", messages.DecodeCommand(p.Commands[0]))
	}
	rd.ack(&messages.Ack{InvocationID: id, State: messages.StateKilled, Error: &messages.AckError{Type: "Cancelled", Message: "cancelled"}})
	if inv := e.invocation(id, ""); inv.State != operatorapi.InvocationKilled || inv.Error.Type != "Cancelled" {
		t.Fatalf("after the daemon's ack %+v", inv)
	}
}

func TestSubmitValidation(t *testing.T) {
	e := newEnv(t)
	for _, tc := range []struct {
		name   string
		req    operatorapi.InvocationRequest
		status int
		field  string
		msg    string
	}{
		{"unknown runner", operatorapi.InvocationRequest{Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("kubernetes")}}, 400, "runConfig.runner", "unknown runner kind"},
		{"docker without image", operatorapi.InvocationRequest{Function: "sh", RunConfig: operatorapi.RunConfig{Runner: runner("docker")}}, 400, "runConfig.image", "runConfig.image is required for the docker runner"},
		{"no colon", operatorapi.InvocationRequest{Function: "justamodule"}, 400, "function", "module:qualname"},
		{"empty module", operatorapi.InvocationRequest{Function: ":f"}, 400, "function", "module"},
		{"empty qualname", operatorapi.InvocationRequest{Function: "m:"}, 400, "function", "qualname"},
		{"python identifiers", operatorapi.InvocationRequest{Function: "my-mod:f", RunConfig: operatorapi.RunConfig{Runner: runner("python")}}, 400, "function", "Python identifiers"},
		{"neither", operatorapi.InvocationRequest{Queue: "q"}, 400, "function", "missing"},
		{"both", operatorapi.InvocationRequest{Function: "m:f", Script: "echo"}, 400, "script", "not both"},
		{"prefix queue", operatorapi.InvocationRequest{Queue: "gpu-*", Function: "m:f"}, 400, "queue", ""},
		{"negative timeout", operatorapi.InvocationRequest{Function: "m:f", RunConfig: operatorapi.RunConfig{TimeoutS: -1}}, 400, "runConfig.timeoutS", ""},
		{"bad env", operatorapi.InvocationRequest{Function: "m:f", RunConfig: operatorapi.RunConfig{Env: map[string]string{"A=B": "c"}}}, 400, "runConfig.env", ""},
		{"bad user", operatorapi.InvocationRequest{Function: "m:f", AsUser: "no body"}, 400, "asUser", ""},
		{"unknown args key", operatorapi.InvocationRequest{Function: "m:f", ArgsKey: "missing"}, 400, "argsKey", ""},
	} {
		r := e.op(http.MethodPost, "/v1/namespaces/default/invocations", tc.req)
		if r.status != tc.status {
			t.Fatalf("%s: %d %q", tc.name, r.status, r.body)
		}
		er := decodeJS[operatorapi.Error](t, r)
		if er.Field != tc.field || !strings.Contains(er.Error, tc.msg) {
			t.Fatalf("%s: %+v", tc.name, er)
		}
	}
	r := e.do(http.MethodPost, "/v1/namespaces/default/invocations", "application/json", testAdmin, []byte(`{"function":"m:f","args":"!!!"}`))
	if r.status != http.StatusBadRequest || errField(t, r) != "args" {
		t.Fatalf("bad base64: %d %q", r.status, r.body)
	}
	// Accepted: gvisor without an image, a bare command for process, a script.
	for _, req := range []operatorapi.InvocationRequest{
		{Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("gvisor")}},
		{Function: "/bin/true", RunConfig: operatorapi.RunConfig{Runner: runner("process")}},
		{Script: "echo hi", RunConfig: operatorapi.RunConfig{Runner: runner("process")}, AsUser: "nobody"},
	} {
		sub := e.submit(req)
		if req.Script != "" && (sub.Invocation.Script != "echo hi" || sub.Invocation.Function.Module != "_script" || sub.Invocation.AsUser != "nobody") {
			t.Fatalf("script submission %+v", sub.Invocation)
		}
	}
	for _, q := range []string{"?state=bogus", "?limit=0", "?limit=x", "?limit=1001"} {
		if r := e.op(http.MethodGet, "/v1/namespaces/default/invocations"+q, nil); r.status != http.StatusBadRequest {
			t.Fatalf("list%s: %d", q, r.status)
		}
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/invocations/nope", nil); r.status != http.StatusNotFound {
		t.Fatalf("get unknown: %d", r.status)
	}
	if r := e.do(http.MethodPost, "/v1/namespaces/default/invocations", "application/json", "", []byte(`{"function":"m:f"}`)); r.status != http.StatusUnauthorized {
		t.Fatalf("no token: %d", r.status)
	}
}

func TestOversizeArgsAre413(t *testing.T) {
	// Straight to the validator: a 100 MiB JSON body is too heavy for a
	// unit test, the limit check is the same.
	_, err := validateInvocation(operatorapi.InvocationRequest{Function: "m:f", Args: make([]byte, messages.MaxPayload+1)})
	fe, ok := err.(*fieldError)
	if !ok || fe.status != http.StatusRequestEntityTooLarge || fe.field != "args" {
		t.Fatalf("validator: %v", err)
	}
	// A body past what base64 args of the maximum size can take is cut off
	// while it is read.
	e := newEnv(t)
	body := &prefixedZeros{prefix: []byte(`{"function":"m:f","args":"`), n: limitSubmit + 1}
	req, _ := http.NewRequest(http.MethodPost, e.url+"/v1/namespaces/default/invocations", body)
	req.Header.Set("Authorization", "Bearer "+testAdmin)
	req.Header.Set("Content-Type", "application/json")
	req.ContentLength = limitSubmit + 1
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("oversized submit: %v", err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized submit: %d", res.StatusCode)
	}
}

// prefixedZeros reads prefix then 'A's up to n bytes in all, without
// holding them.
type prefixedZeros struct {
	prefix []byte
	n, off int
}

var filler = bytes.Repeat([]byte{'A'}, 64<<10)

func (p *prefixedZeros) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	b = b[:min(len(b), p.n-p.off)]
	k := 0
	if p.off < len(p.prefix) {
		k = copy(b, p.prefix[p.off:])
	}
	for k < len(b) {
		k += copy(b[k:], filler)
	}
	p.off += k
	return k, nil
}

func TestLargeArgsTravelByPayloadRef(t *testing.T) {
	e := newEnv(t)
	d := e.daemonUp(daemonSpec{machine: "m", label: "l", queue: "q", runners: []string{"python"}})
	args := make([]byte, messages.InlineThreshold+100<<10)
	_, _ = crand.Read(args)
	sum := sha256.Sum256(args)
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", Args: args})
	if sub.Invocation.ArgsSize != int64(len(args)) || sub.Invocation.ArgsKey == "" {
		t.Fatalf("submitted %+v", sub.Invocation)
	}
	runs := d.poll(0)
	if len(runs) != 1 {
		t.Fatalf("got %v", ids(runs))
	}
	ref := runs[0].PayloadRef
	if ref == nil || len(runs[0].ArgsBlob) != 0 || ref.Size != uint64(len(args)) || ref.SHA256 == nil ||
		*ref.SHA256 != hex.EncodeToString(sum[:]) || ref.Key != sub.Invocation.ArgsKey || ref.Bucket != operatorapi.PayloadBucket {
		t.Fatalf("payload ref %+v (inline %d)", ref, len(runs[0].ArgsBlob))
	}
	// The daemon resolves it as nymph does: presign get, then download.
	key := ref.Key
	r := e.daemon("/v1/namespaces/default/payloads/presign", &messages.PresignRequest{Op: messages.PresignGet, Key: &key})
	if r.status != http.StatusOK {
		t.Fatalf("presign get: %d %q", r.status, r.body)
	}
	ps := decodeMP[messages.PresignResponse](t, r)
	if !strings.HasPrefix(ps.URL, e.url+"/v1/payloads/") || ps.Key != key || int64(ps.ExpiresAtS) <= e.clock.Now().Unix() {
		t.Fatalf("presign response %+v", ps)
	}
	got := doCtx(t, context.Background(), http.MethodGet, ps.URL, "", "", nil)
	if got.status != http.StatusOK || !bytes.Equal(got.body, args) || got.header.Get("X-Checksum-Sha256") != *ref.SHA256 {
		t.Fatalf("download: %d, %d bytes, sha header %q", got.status, len(got.body), got.header.Get("X-Checksum-Sha256"))
	}
	// A tampered or put-only URL reads nothing; an expired one neither.
	if r := doCtx(t, context.Background(), http.MethodGet, ps.URL+"x", "", "", nil); r.status != http.StatusForbidden {
		t.Fatalf("tampered URL: %d", r.status)
	}
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "", "", []byte("x")); r.status != http.StatusForbidden {
		t.Fatalf("PUT with a get URL: %d", r.status)
	}
	e.clock.Advance(operatorapi.PayloadTTL + time.Second)
	if r := doCtx(t, context.Background(), http.MethodGet, ps.URL, "", "", nil); r.status != http.StatusForbidden || !strings.Contains(string(r.body), "expired") {
		t.Fatalf("expired URL: %d %q", r.status, r.body)
	}
	// Small args stay inline.
	small := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", Args: make([]byte, messages.InlineThreshold)})
	if small.Invocation.ArgsKey != "" {
		t.Fatalf("args at the threshold went to the store: %+v", small.Invocation)
	}
	if runs := d.poll(0); len(runs) != 1 || runs[0].PayloadRef != nil || len(runs[0].ArgsBlob) != messages.InlineThreshold {
		t.Fatalf("inline run %+v", runs)
	}
}

func TestPresignPutAndUploadedArgs(t *testing.T) {
	e := newEnv(t)
	data := bytes.Repeat([]byte("payload "), 1000)
	sum := sha256.Sum256(data)
	size := uint64(len(data))
	kind, job := "args", "job/1"
	r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "size": size, "kind": kind, "jobId": job})
	if r.status != http.StatusOK {
		t.Fatalf("presign put: %d %q", r.status, r.body)
	}
	ps := decodeJS[messages.PresignResponse](t, r)
	if !strings.HasPrefix(ps.Key, "args-job_1-") {
		t.Fatalf("generated key %q", ps.Key)
	}
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "application/octet-stream", "", data[:10]); r.status != http.StatusBadRequest || errField(t, r) != "size" {
		t.Fatalf("short PUT: %d %q", r.status, r.body)
	}
	put := doCtx(t, context.Background(), http.MethodPut, ps.URL, "application/octet-stream", "", data)
	if put.status != http.StatusOK {
		t.Fatalf("PUT: %d %q", put.status, put.body)
	}
	stored := decodeJS[messages.PayloadRef](t, put)
	if stored.Key != ps.Key || stored.Size != size || stored.SHA256 == nil || *stored.SHA256 != hex.EncodeToString(sum[:]) {
		t.Fatalf("stored %+v", stored)
	}
	// The same bytes again are fine; other bytes under the key are not.
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "", "", data); r.status != http.StatusOK {
		t.Fatalf("repeat PUT: %d %q", r.status, r.body)
	}
	other := bytes.Repeat([]byte("x"), len(data))
	if r := doCtx(t, context.Background(), http.MethodPut, ps.URL, "", "", other); r.status != http.StatusConflict {
		t.Fatalf("conflicting PUT: %d %q", r.status, r.body)
	}
	// Over-size: refused at presign (JSON and msgpack) and at PUT.
	for _, rr := range []resp{
		e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "size": messages.MaxPayload + 1}),
		e.daemon("/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "size": messages.MaxPayload + 1}),
	} {
		if rr.status != http.StatusRequestEntityTooLarge || errField(t, rr) != "size" {
			t.Fatalf("oversized presign: %d %q", rr.status, rr.body)
		}
	}
	anyPut := decodeJS[messages.PresignResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put"}))
	req, _ := http.NewRequest(http.MethodPut, anyPut.URL, &prefixedZeros{n: messages.MaxPayload + 1})
	req.ContentLength = messages.MaxPayload + 1
	if res, err := http.DefaultClient.Do(req); err != nil {
		t.Fatalf("oversized PUT: %v", err)
	} else if res.Body.Close(); res.StatusCode != http.StatusRequestEntityTooLarge {
		t.Fatalf("oversized PUT: %d", res.StatusCode)
	}
	// Refusals: unknown key, bad op, wrong namespace for the daemon, no token.
	if r := e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": "nope"}); r.status != http.StatusNotFound {
		t.Fatalf("get unknown: %d", r.status)
	}
	if r := e.daemon("/v1/namespaces/default/payloads/presign", map[string]any{"op": "delete"}); r.status != http.StatusBadRequest || errField(t, r) != "op" {
		t.Fatalf("bad op: %d %q", r.status, r.body)
	}
	if r := e.daemon("/v1/namespaces/other/payloads/presign", map[string]any{"op": "get", "key": ps.Key}); r.status != http.StatusForbidden {
		t.Fatalf("other namespace: %d", r.status)
	}
	if r := e.do(http.MethodPost, "/v1/namespaces/default/payloads/presign", "application/json", testDaemon, []byte(`{"op":"get"}`)); r.status != http.StatusUnauthorized {
		t.Fatalf("JSON with a daemon token: %d", r.status)
	}

	// An invocation can point at the uploaded blob.
	d := e.daemonUp(daemonSpec{machine: "m", label: "l", queue: "q", runners: []string{"echo"}})
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", ArgsKey: ps.Key})
	runs := d.poll(0)
	if len(runs) != 1 || runs[0].PayloadRef == nil || runs[0].PayloadRef.Key != ps.Key || *runs[0].PayloadRef.SHA256 != *stored.SHA256 ||
		sub.Invocation.ArgsSize != int64(size) {
		t.Fatalf("run %+v", runs)
	}
}

func TestInvocationRoutesSurviveRandomInput(t *testing.T) {
	e := newEnv(t)
	e.srv.waitCap = 20 * time.Millisecond
	e.srv.pollCap = 20 * time.Millisecond
	id, d := e.runningInvocation("m")
	key := "k"
	put := decodeJS[messages.PresignResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "put", "key": key}))
	doCtx(t, context.Background(), http.MethodPut, put.URL, "", "", []byte("blob"))
	get := decodeJS[messages.PresignResponse](t, e.op(http.MethodPost, "/v1/namespaces/default/payloads/presign", map[string]any{"op": "get", "key": key}))
	js := func(v any) []byte { return mustJSON(t, v) }
	type route struct {
		method, path, token string
		valid               [][]byte
	}
	runBody := js(operatorapi.InvocationRequest{Queue: "q", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("docker"), Image: "i", Env: map[string]string{"A": "b"}}, Args: []byte{1, 2}})
	routes := []route{
		{"POST", "/v1/namespaces/default/invocations", testAdmin, [][]byte{runBody, js(operatorapi.InvocationRequest{Script: "echo", AsUser: "root"})}},
		{"GET", "/v1/namespaces/default/invocations", testAdmin, nil},
		{"GET", "/v1/namespaces/default/invocations/" + id, testAdmin, nil},
		{"GET", "/v1/namespaces/default/invocations/" + id + "/logs", testAdmin, nil},
		{"POST", "/v1/daemon/event", testDaemon, [][]byte{mustMarshal(t, map[string]any{"invocation_id": id, "kind": messages.EventInvocationLog,
			"worker_id": d.id, "ts": 5, "data": map[string]any{"stream": "stdout", "seq": 1, "data": []byte("out\n")}})}},
		{"POST", "/v1/namespaces/default/invocations/" + id + "/cancel", testAdmin, [][]byte{[]byte("{}")}},
		{"POST", "/v1/namespaces/default/payloads/presign", testAdmin, [][]byte{js(map[string]any{"op": "put", "size": 5, "key": "x", "jobId": "j", "kind": "k"})}},
		{"POST", "/v1/namespaces/default/payloads/presign", testDaemon, [][]byte{mustMarshal(t, &messages.PresignRequest{Op: "get", Key: &key})}},
		{"PUT", strings.TrimPrefix(put.URL, e.url), "", [][]byte{[]byte("blob")}},
		{"GET", strings.TrimPrefix(get.URL, e.url), "", nil},
		{"PUT", "/v1/payloads/garbage.token", "", [][]byte{[]byte("x")}},
		{"POST", "/v1/daemon/ack", testDaemon, [][]byte{mustMarshal(t, &messages.Ack{InvocationID: id, State: "failed", Error: &messages.AckError{Type: "T", Message: "m"}})}},
		{"POST", "/v1/daemon/poll", testDaemon, [][]byte{mustMarshal(t, &messages.PollRequest{WorkerID: d.id, Cursor: &d.cursor,
			Invocations: []messages.InvocationStatus{{InvocationID: id, State: "running", StdoutTail: strings.Repeat("é", 20000)}}})}},
	}
	contentTypes := []string{"", messages.ContentType, "application/json", "application/octet-stream", "text/plain", ";;;=", "application/json; x=\""}
	queries := []string{"", "?wait=0.01", "?wait=1e309", "?wait=NaN", "?state=running", "?state=%zz", "?limit=-1", "?limit=99999999999999999999", "?queue=" + strings.Repeat("q", 300),
		"?after=99999999999999999999", "?after=-5&max_bytes=1", "?max_bytes=1e3"}
	rng := rand.New(rand.NewPCG(7, 8))
	requests := 0
	for _, rt := range routes {
		var bodies [][]byte
		for range 10 {
			bodies = append(bodies, randomBytes(rng, rng.IntN(200)))
		}
		for _, v := range rt.valid {
			bodies = append(bodies, v)
			for range 6 {
				bodies = append(bodies, v[:rng.IntN(len(v)+1)])
				flipped := bytes.Clone(v)
				for range 1 + rng.IntN(3) {
					flipped[rng.IntN(len(flipped))] ^= byte(1 << rng.UintN(8))
				}
				bodies = append(bodies, flipped)
			}
		}
		for _, body := range bodies {
			path := rt.path + queries[rng.IntN(len(queries))]
			token := rt.token
			if token != "" && rng.IntN(6) == 0 {
				token = []string{"", "wrong", testDaemon, testAdmin}[rng.IntN(4)]
			}
			r := e.do(rt.method, path, contentTypes[rng.IntN(len(contentTypes))], token, body)
			requests++
			if r.status >= 500 {
				t.Fatalf("%s %s with %d-byte body %q: %d %s", rt.method, path, len(body), truncate(body), r.status, r.body)
			}
		}
	}
	t.Logf("%d requests, none answered 5xx", requests)
	if inv := e.invocation(id, ""); !slices.Contains([]string{"running", "failed", "killed", "cancelled"}, inv.State) {
		t.Fatalf("invocation ended %s", inv.State)
	}
}

func randomBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// TestInvocationFollowsQueueMembership: an invocation reaches the daemons
// a queue exec would reach. A daemon polling gpu that an operator adds to
// training takes training's invocations (its parked poll is woken for
// them); once the operator removes gpu, gpu's wait.
func TestInvocationFollowsQueueMembership(t *testing.T) {
	e := newEnv(t)
	d := e.daemonUp(daemonSpec{machine: "g", label: "gpu-rig", queue: "gpu", runners: []string{"echo"}})
	if r := e.op(http.MethodPost, "/v1/namespaces/default/queues", operatorapi.CreateQueueRequest{Name: "training"}); r.status != http.StatusCreated {
		t.Fatalf("create training: %d %s", r.status, r.body)
	}
	edit := "/v1/namespaces/default/workers/" + d.id + "/queues"
	if r := e.op(http.MethodPost, edit, operatorapi.QueueEditRequest{Add: []string{"training"}}); r.status != http.StatusOK {
		t.Fatalf("add to training: %d %s", r.status, r.body)
	}

	// One rule: exec --queue training reaches it...
	acc := expectJS[operatorapi.ExecAccepted](t, e.op(http.MethodPost, "/v1/namespaces/default/exec",
		operatorapi.ExecRequest{Command: "true", Queue: "training"}), http.StatusAccepted, "queue exec")
	if acc.WorkerID != d.id || acc.WorkerState != operatorapi.StateActive || acc.HibernatingUntil != nil {
		t.Fatalf("queue exec accepted %+v", acc)
	}
	if p := d.pollRaw(d.cursor, 0); len(p.Commands) != 1 || p.Commands[0].Kind != messages.KindExec || p.Cursor == nil {
		t.Fatalf("member of training got %v, want the exec", commandsOf(p))
	} else {
		d.cursor = *p.Cursor
	}
	// ...and so does run --queue training, waking its parked poll.
	got := make(chan messages.PollResponse, 1)
	go func() { got <- d.pollRaw(d.cursor, 20) }()
	e.waitParked(workerKey(d.id))
	sub := e.submit(operatorapi.InvocationRequest{Queue: "training", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	if sub.EligibleWorkers != 1 {
		t.Fatalf("eligible workers for training: %d", sub.EligibleWorkers)
	}
	p := <-got
	if p.Cursor != nil {
		d.cursor = *p.Cursor
	}
	if runs := runsOf(t, p); len(runs) != 1 || runs[0].InvocationID != sub.Invocation.ID {
		t.Fatalf("member of training got %v, want %s", ids(runs), sub.Invocation.ID)
	}
	if inv := e.invocation(sub.Invocation.ID, ""); inv.State != operatorapi.InvocationRunning || inv.WorkerID != d.id {
		t.Fatalf("after the claim: %+v", inv)
	}

	// The operator's removal outranks the queue the daemon polls, for both.
	if r := e.op(http.MethodPost, edit, operatorapi.QueueEditRequest{Remove: []string{"gpu"}}); r.status != http.StatusOK {
		t.Fatalf("remove gpu: %d %s", r.status, r.body)
	}
	left := e.submit(operatorapi.InvocationRequest{Queue: "gpu", Function: "m:f"})
	if left.EligibleWorkers != 0 {
		t.Fatalf("eligible workers for a removed poll queue: %d", left.EligibleWorkers)
	}
	if got := d.poll(0); len(got) != 0 {
		t.Fatalf("removed from its poll queue, it still got %v", ids(got))
	}
	if r := e.op(http.MethodPost, "/v1/namespaces/default/exec", operatorapi.ExecRequest{Command: "true", Queue: "gpu"}); r.status != http.StatusConflict {
		t.Fatalf("exec to a removed poll queue: %d %s", r.status, r.body)
	}
}

// A CLI from before the invocation bodies were camelCase sends snake_case
// keys: they are still read, they reach the daemon's run, and where a body
// has both spellings the camelCase one wins. A bad value under an old key is
// refused naming the camelCase field.
func TestSubmitAcceptsTheOldSnakeCaseKeys(t *testing.T) {
	e := newEnv(t)
	d := e.daemonUp(daemonSpec{machine: "o", label: "old", queue: "old", runners: []string{"python"}})
	submit := func(body string) operatorapi.InvocationSubmitted {
		t.Helper()
		r := e.do(http.MethodPost, "/v1/namespaces/default/invocations", "application/json", testAdmin, []byte(body))
		return expectJS[operatorapi.InvocationSubmitted](t, r, http.StatusCreated, "submit "+body)
	}
	old := submit(`{"queue":"old","function":"m:f","run_config":{"runner":"python","timeout_s":7,"env":{"A":"1"},"workdir":"/w"},
		"as_user":"nobody","parent_invocation_id":"p1","root_invocation_id":"r1"}`)
	inv := old.Invocation
	if inv.RunConfig.Runner == nil || *inv.RunConfig.Runner != "python" || inv.RunConfig.TimeoutS != 7 || inv.RunConfig.Env["A"] != "1" ||
		inv.RunConfig.Workdir != "/w" || inv.AsUser != "nobody" || inv.ParentInvocationID != "p1" || inv.RootInvocationID != "r1" {
		t.Fatalf("old keys: %+v", inv)
	}
	runs := d.poll(0)
	if len(runs) != 1 || runs[0].RunConfig.TimeoutS != 7 || *runs[0].AsUser != "nobody" || *runs[0].RootInvocationID != "r1" {
		t.Fatalf("run of the old body: %+v", runs)
	}
	both := submit(`{"queue":"old","function":"m:f","run_config":{"runner":"echo","timeout_s":1},"runConfig":{"runner":"python","timeoutS":9},
		"as_user":"old","asUser":"new","parentInvocationId":"p2","parent_invocation_id":"p-old"}`).Invocation
	if *both.RunConfig.Runner != "python" || both.RunConfig.TimeoutS != 9 || both.AsUser != "new" || both.ParentInvocationID != "p2" {
		t.Fatalf("both spellings: %+v", both)
	}
	r := e.do(http.MethodPost, "/v1/namespaces/default/invocations", "application/json", testAdmin,
		[]byte(`{"function":"m:f","run_config":{"timeout_s":-1}}`))
	if r.status != http.StatusBadRequest || errField(t, r) != "runConfig.timeoutS" {
		t.Fatalf("bad old timeout: %d %q", r.status, r.body)
	}
	// What comes back is camelCase only.
	r = e.op(http.MethodGet, "/v1/namespaces/default/invocations/"+inv.ID, nil)
	for _, k := range []string{`"runConfig"`, `"timeoutS"`, `"asUser"`, `"rootInvocationId"`, `"createdAt"`, `"argsSize"`} {
		if !strings.Contains(string(r.body), k) {
			t.Fatalf("get lacks %s: %s", k, r.body)
		}
	}
	for _, k := range []string{`"run_config"`, `"timeout_s"`, `"as_user"`, `"root_invocation_id"`, `"created_at"`, `"args_size"`} {
		if strings.Contains(string(r.body), k) {
			t.Fatalf("get still has %s: %s", k, r.body)
		}
	}
}
