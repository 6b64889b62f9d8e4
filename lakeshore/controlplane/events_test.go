package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"nymph/lakeshore/operatorapi"
	"nymph/lakeshore/store"
	"nymph/messages"
)

// logEvent is an invocation.log body as nymph posts it with a bearer.
func logEvent(inv, worker, stream string, seq uint64, data string) map[string]any {
	return map[string]any{"invocation_id": inv, "kind": messages.EventInvocationLog, "ts": 1_700_000_000, "worker_id": worker,
		"data": map[string]any{"stream": stream, "seq": seq, "data": []byte(data)}}
}

func (e *env) logs(inv, query string) operatorapi.InvocationLogs {
	e.t.Helper()
	return expectJS[operatorapi.InvocationLogs](e.t, e.op(http.MethodGet, "/v1/namespaces/default/invocations/"+inv+"/logs"+query, nil),
		http.StatusOK, "logs")
}

func logText(l operatorapi.InvocationLogs) string {
	var b strings.Builder
	for _, ev := range l.Events {
		b.Write(ev.Data)
	}
	return b.String()
}

func wantEventOK(t *testing.T, r resp, what string) bool {
	t.Helper()
	if r.status != http.StatusOK {
		t.Fatalf("%s: %d %q", what, r.status, r.body)
	}
	dup, _ := decodeMP[map[string]any](t, r)["duplicate"].(bool)
	return dup
}

// A run's output is stored in seq order whatever order it arrives in, a
// repeat is a no-op, and the read is paged by a byte cap with a cursor.
func TestRunLogIsOrderedDedupedAndCapped(t *testing.T) {
	e := newEnv(t)
	inv, d := e.runningInvocation("m")
	for _, seq := range []uint64{1, 3, 2, 4} {
		stream := messages.StreamStdout
		if seq == 2 {
			stream = messages.StreamStderr
		}
		if dup := wantEventOK(t, e.daemon("/v1/daemon/event", logEvent(inv, d.id, stream, seq, fmt.Sprintf("line %d\n", seq))), "log event"); dup {
			t.Fatalf("seq %d reported a duplicate", seq)
		}
	}
	if dup := wantEventOK(t, e.daemon("/v1/daemon/event", logEvent(inv, d.id, messages.StreamStdout, 3, "line 3\n")), "repeat"); !dup {
		t.Fatal("a repeated piece was stored again")
	}
	all := e.logs(inv, "")
	if logText(all) != "line 1\nline 2\nline 3\nline 4\n" || all.More || all.Next != 4 || all.State != operatorapi.InvocationRunning ||
		all.InvocationID != inv || all.Events[1].Stream != messages.StreamStderr || all.Events[1].Seq != 2 ||
		!all.Events[0].TS.Equal(time.Unix(1_700_000_000, 0)) {
		t.Fatalf("whole log: %+v", all)
	}
	// Capped: each piece is 7 bytes of output (a little more stored).
	page := e.logs(inv, "?max_bytes=20")
	if logText(page) != "line 1\nline 2\n" || !page.More || page.Next != 2 {
		t.Fatalf("capped page: %q more %v next %d", logText(page), page.More, page.Next)
	}
	page = e.logs(inv, fmt.Sprintf("?max_bytes=20&after=%d", page.Next))
	if logText(page) != "line 3\nline 4\n" || page.More || page.Next != 4 {
		t.Fatalf("second page: %q more %v next %d", logText(page), page.More, page.Next)
	}
	// One piece always comes, however small the cap.
	if one := e.logs(inv, "?max_bytes=1"); len(one.Events) != 1 || !one.More {
		t.Fatalf("a 1-byte cap: %+v", one)
	}
	// Past the end: nothing, and the cursor stays.
	if end := e.logs(inv, "?after=4"); len(end.Events) != 0 || end.Next != 4 || end.More {
		t.Fatalf("past the end: %+v", end)
	}
	// The cap is the server's too.
	big := strings.Repeat("x", operatorapi.MaxLogBytes/4)
	for seq := uint64(10); seq < 16; seq++ {
		wantEventOK(t, e.daemon("/v1/daemon/event", logEvent(inv, d.id, messages.StreamStdout, seq, big)), "big piece")
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/invocations/"+inv+"/logs?max_bytes="+fmt.Sprint(operatorapi.MaxLogBytes+1), nil); r.status != http.StatusBadRequest || errField(t, r) != "max_bytes" {
		t.Fatalf("a cap over the server's: %d %q", r.status, r.body)
	}
	capped := e.logs(inv, fmt.Sprintf("?after=4&max_bytes=%d", operatorapi.MaxLogBytes))
	if n := len(logText(capped)); n > operatorapi.MaxLogBytes || !capped.More {
		t.Fatalf("%d bytes in a page capped at %d (more %v)", n, operatorapi.MaxLogBytes, capped.More)
	}
	for _, q := range []string{"?after=-1", "?after=x", "?max_bytes=0", "?wait=-1"} {
		if r := e.op(http.MethodGet, "/v1/namespaces/default/invocations/"+inv+"/logs"+q, nil); r.status != http.StatusBadRequest {
			t.Fatalf("%s: %d %q", q, r.status, r.body)
		}
	}
	if r := e.op(http.MethodGet, "/v1/namespaces/default/invocations/nosuch/logs", nil); r.status != http.StatusNotFound || errField(t, r) != "inv_id" {
		t.Fatalf("logs of an unknown invocation: %d %q", r.status, r.body)
	}
}

// A follower parked on the log is woken by the next piece, and once the run
// is over by its end.
func TestRunLogLongPoll(t *testing.T) {
	e := newEnv(t)
	inv, d := e.runningInvocation("m")
	got := make(chan operatorapi.InvocationLogs, 1)
	follow := func(query string) {
		go func() {
			r := doCtx(t, context.Background(), http.MethodGet, e.url+"/v1/namespaces/default/invocations/"+inv+"/logs"+query, "", testAdmin, nil)
			got <- decodeJS[operatorapi.InvocationLogs](t, r)
		}()
		e.waitParked(logKey(inv))
	}
	receive := func(what string) operatorapi.InvocationLogs {
		t.Helper()
		select {
		case l := <-got:
			return l
		case <-time.After(15 * time.Second):
			t.Fatalf("the follower was not woken by %s", what)
		}
		return operatorapi.InvocationLogs{}
	}
	follow("?wait=20")
	wantEventOK(t, e.daemon("/v1/daemon/event", logEvent(inv, d.id, messages.StreamStdout, 1, "hello\n")), "log event")
	if l := receive("output"); logText(l) != "hello\n" || l.Next != 1 || l.State != operatorapi.InvocationRunning {
		t.Fatalf("woken by output: %+v", l)
	}
	follow("?wait=20&after=1")
	if r := d.ack(&messages.Ack{InvocationID: inv, State: messages.StateSucceeded}); r.status != http.StatusOK {
		t.Fatalf("ack: %d %q", r.status, r.body)
	}
	if l := receive("the ack"); len(l.Events) != 0 || l.State != operatorapi.InvocationSucceeded || l.Next != 1 {
		t.Fatalf("woken by the ack: %+v", l)
	}
	// Over: a read with wait answers at once.
	if l := e.logs(inv, "?wait=20&after=1"); l.State != operatorapi.InvocationSucceeded {
		t.Fatalf("after the end: %+v", l)
	}
}

// Events are taken only from the worker the invocation or the command was
// given to, and only for what exists.
func TestEventsOnlyFromTheirWorker(t *testing.T) {
	e := newEnv(t)
	inv, a := e.runningInvocation("a")
	b := e.daemonUp(daemonSpec{machine: "b", label: "b", queue: "q-b", runners: []string{"echo"}})
	refused := func(body map[string]any, status int, field, msg string) {
		t.Helper()
		r := e.daemon("/v1/daemon/event", body)
		ve := decodeMP[messages.ValidationError](t, r)
		if r.status != status || ve.Field != field || !strings.Contains(ve.Error, msg) {
			t.Fatalf("%v: %d %+v, want %d on %s saying %q", body, r.status, ve, status, field, msg)
		}
	}
	refused(logEvent(inv, b.id, messages.StreamStdout, 1, "forged"), http.StatusForbidden, "invocation_id", "was not handed to worker "+b.id)
	refused(logEvent("nosuch", a.id, messages.StreamStdout, 1, "x"), http.StatusNotFound, "invocation_id", "unknown invocation")
	refused(logEvent(inv, "w-nosuch", messages.StreamStdout, 1, "x"), http.StatusNotFound, "worker_id", "unknown worker")
	refused(logEvent(inv, "", messages.StreamStdout, 1, "x"), http.StatusUnprocessableEntity, "worker_id", "missing")
	if l := e.logs(inv, ""); len(l.Events) != 0 {
		t.Fatalf("refused events were stored: %+v", l)
	}

	// Outcomes belong to commands: a's setup, reported by b, by a as an
	// update, or for a command that is not there.
	q := expectJS[operatorapi.Queued](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+a.id+"/setup",
		operatorapi.SetupRequest{Script: "exit 9"}), http.StatusAccepted, "setup")
	setup := func(cmd, worker string) map[string]any {
		return map[string]any{"invocation_id": cmd, "kind": messages.EventSetupFinished, "worker_id": worker, "ts": 1,
			"data": map[string]any{"name": "setup", "state": "failed", "exit_code": 9, "duration_ms": 12, "output_tail": "boom\n", "error": nil}}
	}
	ota := func(cmd, worker string) map[string]any {
		return map[string]any{"invocation_id": cmd, "kind": messages.EventOtaFinished, "worker_id": worker, "ts": 1,
			"data": map[string]any{"source": "ota_update", "version": "2.0.0", "outcome": "refused", "code": "checksum_mismatch", "reason": "sha256 mismatch"}}
	}
	refused(setup(q.CommandID, b.id), http.StatusForbidden, "invocation_id", "was not sent to worker "+b.id)
	refused(setup("nosuch", a.id), http.StatusNotFound, "invocation_id", "the command id of its setup")
	refused(ota(q.CommandID, a.id), http.StatusUnprocessableEntity, "kind", "is a setup, not a ota_update")
	wantEventOK(t, e.daemon("/v1/daemon/event", setup(q.CommandID, a.id)), "a's setup outcome")
	if !wantEventOK(t, e.daemon("/v1/daemon/event", setup(q.CommandID, a.id)), "repeated outcome") {
		t.Fatal("a repeated outcome was stored again")
	}
	// An auto-update has no command: its id is enough, for any worker.
	auto := messages.AutoUpdateEventID("2.0.0", time.Unix(1_700_000_000, 0))
	wantEventOK(t, e.daemon("/v1/daemon/event", ota(auto, b.id)), "b's auto-update outcome")
	if o := e.worker(b.id).Outcomes; len(o) != 1 || o[0].CommandID != auto || o[0].Ota == nil {
		t.Fatalf("b's outcomes: %+v", o)
	}
	if o := e.worker(a.id).Outcomes; len(o) != 1 || o[0].Setup == nil || o[0].Setup.ExitCode != 9 {
		t.Fatalf("a's outcomes: %+v", o)
	}
}

// Every malformed body is a 4xx naming its field.
func TestBadEventBodiesNameTheField(t *testing.T) {
	e := newEnv(t)
	inv, d := e.runningInvocation("m")
	withData := func(data any) map[string]any {
		m := logEvent(inv, d.id, messages.StreamStdout, 1, "")
		m["data"] = data
		return m
	}
	logData := func(k string, v any) map[string]any {
		data := map[string]any{"stream": "stdout", "seq": 1, "data": []byte("x")}
		if v == nil {
			delete(data, k)
		} else {
			data[k] = v
		}
		return withData(data)
	}
	outcome := func(kind, k string, v any) map[string]any {
		data := map[string]any{"state": "failed", "exit_code": 9, "outcome": "refused"}
		data[k] = v
		return map[string]any{"invocation_id": "c", "kind": kind, "worker_id": d.id, "data": data}
	}
	for _, c := range []struct {
		body  any
		field string
	}{
		{map[string]any{"kind": messages.EventInvocationLog}, "invocation_id"},
		{map[string]any{"invocation_id": inv}, "kind"},
		{map[string]any{"invocation_id": inv, "kind": "progress", "worker_id": d.id}, "kind"},
		{map[string]any{"invocation_id": inv, "kind": messages.EventInvocationLog, "ts": "soon"}, "ts"},
		{map[string]any{"invocation_id": inv, "kind": messages.EventInvocationLog, "worker_id": 7}, "worker_id"},
		{withData(nil), "data"},
		{withData("text"), "data"},
		{logData("stream", "stdin"), "data.stream"},
		{logData("stream", nil), "data.stream"},
		{logData("seq", -1), "data.seq"},
		{logData("seq", 1.5), "data.seq"},
		{logData("seq", nil), "data.seq"},
		{logData("data", 12), "data.data"},
		{logData("dropped", "many"), "data.dropped"},
		{outcome(messages.EventSetupFinished, "exit_code", 1.5), "data.exit_code"},
		{outcome(messages.EventSetupFinished, "exit_code", int64(1)<<40), "data.exit_code"},
		{outcome(messages.EventSetupFinished, "state", "meh"), "data.state"},
		{outcome(messages.EventSetupFinished, "output_tail", 3), "data.output_tail"},
		{outcome(messages.EventOtaFinished, "outcome", "meh"), "data.outcome"},
		{outcome(messages.EventOtaFinished, "reason", []any{}), "data.reason"},
	} {
		r := e.daemon("/v1/daemon/event", c.body)
		if r.status < 400 || r.status >= 500 || errField(t, r) != c.field {
			t.Errorf("%v: %d %q, want a 4xx naming %s", c.body, r.status, r.body, c.field)
		}
	}
	for _, raw := range [][]byte{nil, []byte("not msgpack"), {0x93, 1, 2, 3}} {
		r := e.do(http.MethodPost, "/v1/daemon/event", messages.ContentType, testDaemon, raw)
		if r.status != http.StatusBadRequest || errField(t, r) != "body" {
			t.Errorf("body %q: %d %q", raw, r.status, r.body)
		}
	}
}

// What daemons report about setups and updates shows on the worker: the
// newest setup in the list, the recent outcomes newest first on the worker.
func TestWorkerOutcomes(t *testing.T) {
	e := newEnv(t)
	id, _ := e.hello("m", "box")
	other, _ := e.hello("m2", "other")
	setupCmd := func() string {
		return expectJS[operatorapi.Queued](t, e.op(http.MethodPost, "/v1/namespaces/default/workers/"+id+"/setup",
			operatorapi.SetupRequest{Script: "true"}), http.StatusAccepted, "setup").CommandID
	}
	post := func(cmd, kind string, data any) {
		t.Helper()
		ev, err := messages.NewEvent(cmd, kind, id, data, e.clock.Now())
		if err != nil {
			t.Fatal(err)
		}
		wantEventOK(t, e.daemon("/v1/daemon/event", ev), kind)
		e.clock.Advance(time.Second)
	}
	if w := e.worker(id); w.LastSetup != nil || len(w.Outcomes) != 0 {
		t.Fatalf("outcomes before any: %+v %+v", w.LastSetup, w.Outcomes)
	}
	first := setupCmd()
	post(first, messages.EventSetupFinished, &messages.SetupOutcome{Name: "setup", State: messages.StateSucceeded, DurationMs: 5})
	failing := setupCmd()
	post(failing, messages.EventSetupFinished, &messages.SetupOutcome{Name: "deps", State: messages.StateFailed, ExitCode: 9,
		DurationMs: 1200, OutputTail: "E: no such package\n"})
	c, err := e.srv.st.Enqueue(context.Background(), store.NewCommand{ID: "ota-1", WorkerID: id, Kind: messages.KindOtaUpdate,
		Body: []byte{0xc0}, Now: e.clock.Now()}, nil)
	if err != nil {
		t.Fatal(err)
	}
	reason := "ota: sha256 mismatch: downloaded 10 bytes hash to ab, the command says 00"
	post(c.ID, messages.EventOtaFinished, &messages.OtaOutcome{Source: messages.OtaSourceCommand, Version: "2.0.0",
		Outcome: messages.OtaRefused, Code: messages.OtaCodeChecksumMismatch, Reason: &reason})

	w := e.worker(id)
	if len(w.Outcomes) != 3 || w.Outcomes[0].CommandID != "ota-1" || w.Outcomes[1].CommandID != failing || w.Outcomes[2].CommandID != first {
		t.Fatalf("outcomes, newest first: %+v", w.Outcomes)
	}
	if o := w.Outcomes[0].Ota; o == nil || o.Code != messages.OtaCodeChecksumMismatch || o.Reason == nil || *o.Reason != reason {
		t.Fatalf("the refused update: %+v", w.Outcomes[0])
	}
	if s := w.Outcomes[1].Setup; s == nil || s.ExitCode != 9 || s.OutputTail != "E: no such package\n" || s.DurationMs != 1200 ||
		w.Outcomes[1].Kind != messages.EventSetupFinished {
		t.Fatalf("the failed setup: %+v", w.Outcomes[1])
	}
	if w.LastSetup == nil || w.LastSetup.CommandID != failing {
		t.Fatalf("last setup: %+v", w.LastSetup)
	}
	list := expectJS[operatorapi.WorkerList](t, e.op(http.MethodGet, "/v1/namespaces/default/workers", nil), http.StatusOK, "list")
	for _, lw := range list.Workers {
		switch lw.ID {
		case id:
			if lw.LastSetup == nil || lw.LastSetup.Setup == nil || lw.LastSetup.Setup.ExitCode != 9 || len(lw.Outcomes) != 0 {
				t.Fatalf("listed %s: last setup %+v, outcomes %+v", id, lw.LastSetup, lw.Outcomes)
			}
		case other:
			if lw.LastSetup != nil {
				t.Fatalf("listed %s: %+v", other, lw.LastSetup)
			}
		}
	}
	// Only the recent few.
	for i := 0; i < operatorapi.WorkerOutcomesShown; i++ {
		post(setupCmd(), messages.EventSetupFinished, &messages.SetupOutcome{State: messages.StateSucceeded})
	}
	if w := e.worker(id); len(w.Outcomes) != operatorapi.WorkerOutcomesShown || w.LastSetup.Setup.State != messages.StateSucceeded {
		t.Fatalf("%d outcomes shown, last setup %+v", len(w.Outcomes), w.LastSetup)
	}
}

// A follower of a queued invocation learns when a daemon takes it.
func TestRunLogLongPollWakesOnDispatch(t *testing.T) {
	e := newEnv(t)
	sub := e.submit(operatorapi.InvocationRequest{Queue: "q-late", Function: "m:f", RunConfig: operatorapi.RunConfig{Runner: runner("echo")}})
	inv := sub.Invocation.ID
	got := make(chan operatorapi.InvocationLogs, 1)
	go func() {
		r := doCtx(t, context.Background(), http.MethodGet, e.url+"/v1/namespaces/default/invocations/"+inv+"/logs?wait=20", "", testAdmin, nil)
		got <- decodeJS[operatorapi.InvocationLogs](t, r)
	}()
	e.waitParked(logKey(inv))
	// Its first poll claims the invocation.
	e.daemonUp(daemonSpec{machine: "late", label: "late", queue: "q-late", runners: []string{"echo"}})
	select {
	case l := <-got:
		if l.State != operatorapi.InvocationRunning || len(l.Events) != 0 {
			t.Fatalf("woken by the dispatch: %+v", l)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the follower was not woken by the dispatch")
	}
}
